"""cluster.sketch: seeded ±1 probes, the [rows, k] sketch of any weight, and a relative error that is ~0 for
the same weights through another kernel and moves with a stale, wrong or partly changed matrix."""

from __future__ import annotations

import pytest
import torch

from cluster.sketch import SKETCH_PROBES, low_rank_sketch, probes, sketch, sketch_error, sketch_mismatch


def test_probes_are_signs_fixed_by_the_name():
    p = probes("model.layers.0.mlp.down_proj.weight", 40)
    assert p.shape == (40, SKETCH_PROBES) and set(p.unique().tolist()) == {-1.0, 1.0}
    assert torch.equal(p, probes("model.layers.0.mlp.down_proj.weight", 40))
    assert not torch.equal(p, probes("model.layers.1.mlp.down_proj.weight", 40))


def test_a_sketch_is_the_product_with_the_probes_and_a_vector_is_one_row():
    w = torch.randn(6, 5)
    rows = probes("w", 5).contiguous()  # the same values stored row by row: another kernel, the same product
    assert torch.equal(probes("w", 5), rows) and sketch_error(sketch("w", w), w @ rows) < 1e-6
    v = torch.randn(5)
    assert sketch_error(sketch("v", v), v[None] @ probes("v", 5).contiguous()) < 1e-6
    assert (
        sketch_error(sketch("h", w.to(torch.bfloat16)), w.to(torch.bfloat16).float() @ probes("h", 5)) < 1e-6
    )


def test_the_error_is_relative_to_the_scale_and_moves_with_any_change():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 48, generator=g)
    s = sketch("w", w)
    assert sketch_error(s, s) == 0.0
    assert sketch_error(sketch("w", w * 1e3), s * 1e3) < 1e-6  # a matter of relative error only
    stale = w * (1 + 1e-3 * torch.randn(w.shape, generator=g))  # every element off by ~1e-3 of itself
    assert sketch_error(sketch("w", stale), s) == pytest.approx(1e-3, rel=0.3)
    one_row = w.clone()
    one_row[7] = 0  # a row that did not land
    assert sketch_error(sketch("w", one_row), s) > 0.05
    assert sketch_error(sketch("w", w[:-1]), s) == float("inf")  # another shape
    assert sketch_error(torch.zeros(2, 4), torch.zeros(2, 4)) == 0.0


def test_the_same_weights_through_a_reordered_sum_agree_to_rounding():
    """What the check tolerates: another kernel's summation order (here a reversed column order) in fp32."""
    w = torch.randn(256, 576)
    p = probes("w", 576)
    reordered = w.flip(1) @ p.flip(0)  # the same products, summed in another order
    assert sketch_error(reordered, sketch("w", w)) < 1e-6


def test_a_low_rank_update_is_sketched_without_forming_it():
    g = torch.Generator().manual_seed(1)
    w0, b, a = (
        torch.randn(96, 80, generator=g),
        torch.randn(96, 8, generator=g),
        torch.randn(8, 80, generator=g),
    )
    direct = low_rank_sketch(sketch("w", w0), b, a, probes("w", 80), 0.5)
    assert sketch_error(direct, sketch("w", w0 + 0.5 * (b @ a))) < 1e-6


def test_a_mismatch_names_the_tensors_off_worst_first_and_a_missing_one():
    g = torch.Generator().manual_seed(2)
    expected = {n: sketch(n, torch.randn(16, 12, generator=g)) for n in ("a", "b", "c")}
    assert sketch_mismatch(expected, expected, 1e-6) is None
    served = {"a": expected["a"] * (1 + 1e-3), "b": expected["b"] * 1.5}  # "c" not read back
    off = sketch_mismatch(served, expected, 1e-4)
    assert off is not None and off.startswith("3 of 3 tensors")
    assert off.index("c (inf)") < off.index("b (") < off.index("a (")
    one = sketch_mismatch(served | {"c": expected["c"]}, expected, 2e-3)
    assert one is not None and one.startswith("1 of 3 tensors") and "b (" in one
