"""cluster.fingerprint: exact, device/dtype/layout-independent, and sensitive to what a sync can get wrong."""

from __future__ import annotations

import math

import torch

from cluster.fingerprint import fingerprint, fingerprint_terms, sample_indices


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(64, 32, generator=g), "b.weight": torch.randn(64, 32, generator=g),
            "norm.weight": torch.randn(32, generator=g)}


def test_equal_weights_give_bit_identical_fingerprints_whatever_the_container():
    w = _weights()
    fp = fingerprint(w)
    assert fingerprint({k: v.clone() for k, v in reversed(list(w.items()))}) == fp  # order of names
    assert fingerprint({k: v.numpy() for k, v in w.items()}) == fp  # numpy
    assert fingerprint({k: v.t().contiguous().t() for k, v in w.items()}) == fp  # another memory layout
    assert fingerprint({k: v.double() for k, v in w.items()}) == fp  # exact upcast (bf16 -> fp32 engines)


def test_parts_computed_apart_sum_to_the_whole():
    w = _weights()
    # An engine computes some tensors' terms inside vLLM's worker and the rest from what it received.
    terms = [x for name in ("norm.weight", "a.weight", "b.weight") for x in fingerprint_terms(name, w[name])]
    assert math.fsum(terms) == fingerprint(w)


def test_a_changed_sampled_element_swapped_tensors_or_another_step_change_it():
    w = _weights()
    fp = fingerprint(w)
    changed = {k: v.clone() for k, v in w.items()}
    changed["a.weight"].view(-1)[sample_indices("a.weight", 64 * 32)[5]] += 1e-6
    assert fingerprint(changed) != fp
    swapped = {**w, "a.weight": w["b.weight"], "b.weight": w["a.weight"]}
    assert fingerprint(swapped) != fp
    step = {k: v - 2e-5 * torch.sign(v) for k, v in w.items()}  # one small optimizer step
    assert fingerprint(step) != fp
    assert fingerprint(_weights(1)) != fp


def test_samples_are_spread_and_bounded():
    idx = sample_indices("x", 1000)
    assert len(set(idx)) == len(idx) == 32 and all(0 <= i < 1000 for i in idx)
    assert len(sample_indices("x", 5)) == 5 and all(0 <= i < 5 for i in sample_indices("x", 5))
