"""A learner backend from outside the package, defined in this file alone: registered with
`learners.gradients.backends.BACKENDS.register` (a registry call: no Enum is edited), it is a value of
`learner.backend` like a built-in; the config checks and the planner read its declared capabilities, and a
rank trains with it. No other source file names it. And a backend in a module of its own
(tests/learners/user_backend.py), named by its module path: a rank hosted by a Ray actor imports it there."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import pytest
import torch

from jobs.config import ConfigError, load_config
from jobs.models.resolve import resolve_model
from jobs.plan.layout import run_layout
from jobs.plan.planner import make_plan
from learners.gradients.backends import BACKENDS, BackendCapabilities
from learners.gradients.torch_backend import TorchBackend
from learners.learner import Learner
from tests.builders import learner_spec, rows_batch
from tests.learners.test_deepspeed import update
from tests.learners.test_learner import BASE, ROWS

TINY = "jobs/configs/tiny.yaml"
NAME = "counting"


class CountingBackend(TorchBackend):
    """The torch backend counting its optimizer steps, with narrower capabilities than torch's own: no float16
    and no colocated LoRA policies (each refused at load because the class says so; torch takes them)."""

    capabilities: ClassVar[BackendCapabilities] = BackendCapabilities(gpus=False, float16=False,
                                                                      lora_colocate=False)
    steps = 0

    def step(self) -> tuple[float, float, bool]:
        type(self).steps += 1
        return super().step()


@pytest.fixture
def counting() -> Iterator[str]:
    name = BACKENDS.register(NAME, CountingBackend)
    yield name
    BACKENDS.unregister(NAME)


def test_the_registered_name_is_a_choice_of_the_key_while_registered(counting):
    cfg = load_config(TINY, [f"learner.backend={NAME}"])
    assert cfg.learner.backend == counting == NAME
    assert BACKENDS[NAME] is CountingBackend and NAME in BACKENDS.names()
    with pytest.raises(ValueError, match="is registered already"):
        BACKENDS.register(NAME, TorchBackend)
    with pytest.raises(ValueError, match="is built in"):
        BACKENDS.unregister("torch")


def test_a_name_not_registered_is_refused_with_the_choices():
    refusal = r"learner\.backend must be one of torch, deepspeed, or a module path .*; got 'counting'"
    with pytest.raises(ConfigError, match=refusal):
        load_config(TINY, [f"learner.backend={NAME}"])
    with pytest.raises(ValueError, match=refusal):
        BACKENDS[NAME]


@pytest.mark.parametrize(("overrides", "message"), [
    (["learner.rank_num_gpus=1"], "learner.rank_num_gpus > 0 needs a backend that trains on GPUs "
                                  f"(learner.backend=deepspeed); learner.backend={NAME} trains on CPU"),
    (["model.dtype=float16"], "model.dtype=float16 needs a backend that trains in float16; "
                              f"learner.backend={NAME} does not"),
    (["model.lora.enabled=true", "model.lora.rank=4", "learner.lora_colocate=true"],
     f"learner.backend={NAME} cannot hold learner.lora_colocate policies"),
])
def test_the_config_checks_read_its_capabilities(counting, overrides, message):
    load_config(TINY, [n for n in overrides if "gpus" not in n])  # torch takes what counting refuses
    with pytest.raises(ConfigError) as e:
        load_config(TINY, [f"learner.backend={NAME}", *overrides])
    assert message in str(e.value)


def test_the_planner_sizes_it_by_its_capabilities(counting):
    """No ZeRO stages declared: the memory model's whole fp32 states, as torch's."""
    def rank(*overrides: str):
        layout = run_layout(load_config(TINY, ["learner.deepspeed.zero_stage=3", *overrides]))
        return next(m.learner for m in make_plan(layout, memory=0).members if m.learner is not None)

    assert rank(f"learner.backend={NAME}") == rank("learner.backend=torch")
    assert rank(f"learner.backend={NAME}") != rank("learner.backend=deepspeed")


def test_a_rank_trains_a_step_with_it(counting):
    cfg = load_config(TINY, [*BASE, f"learner.backend={NAME}"])
    spec = learner_spec(cfg, resolve_model("builtin:tiny"))
    learner = Learner(spec)
    assert type(learner.backend) is CountingBackend
    before = {k: v.detach().clone() for k, v in learner.model.named_parameters()}
    metrics = update(learner, rows_batch(ROWS))
    assert CountingBackend.steps == 1 and metrics
    assert any(not torch.equal(before[k], v) for k, v in learner.model.named_parameters())


USER_BACKEND = "tests.learners.user_backend"


def test_a_backend_module_named_in_the_config_trains_a_rank_in_a_ray_actor(ray_cluster):
    """The rank is a Ray actor: it imports the module `learner.backend` names and steps with its class. Its
    weights after one update are an in-process rank's of the same backend, and not the torch backend's."""
    from tests.learners.test_learner_group import ROWS as GROUP_ROWS
    from tests.learners.test_learner_group import make_group, max_abs_diff, weights

    assert load_config(TINY, [f"learner.backend={USER_BACKEND}"]).learner.backend == USER_BACKEND
    groups = {"actor": make_group(f"learner.backend={USER_BACKEND}", "learner.ranks=1"),
              "local": make_group(f"learner.backend={USER_BACKEND}"), "adamw": make_group()}
    try:
        for group in groups.values():
            group.update(rows_batch(GROUP_ROWS))
        after = {name: weights(group) for name, group in groups.items()}
    finally:
        for group in groups.values():
            group.shutdown()
    assert max_abs_diff(after["actor"], after["local"]) < 1e-5
    assert max_abs_diff(after["actor"], after["adamw"]) > 1e-4


def test_a_backend_module_that_declares_none_is_refused(tmp_path):
    empty = tmp_path / "no_backend.py"
    empty.write_text("X = 1\n")
    with pytest.raises(ConfigError, match=rf"learner\.backend={empty}: {empty} declares no BACKEND"):
        load_config(TINY, [f"learner.backend={empty}"])
