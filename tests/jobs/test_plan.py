"""The memory plan in the run layout: CPU runs are never planned (auto checkpointing stays off), a GPU
run's auto checkpointing turns on exactly where its GPU needs it (resolved into the layout, never into the
config), a plan over 0.9 of the GPU is refused naming the keys, members share GPUs as Ray's fractions do, and
`--plan` prints it."""

import pytest

from jobs.config import ConfigError, load_config, to_yaml
from jobs.plan.layout import run_layout
from jobs.plan.planner import FIT_FRACTION, Member, PlanError, learner_setup, make_plan, pack, refuse_unfit
from jobs.plan.rollout_estimate import DECODE_BANDWIDTH_EFFICIENCY, H100_HBM_BYTES_S, decode_iteration_s
from jobs.train import main
from learners.compute.memory import GIB
from tests.learners.test_memory import qwen3_shape

TINY = "jobs/configs/tiny.yaml"
# A single-agent run on one GPU: engine and learner half a GPU each, a Qwen3-0.6B-shaped model with the real
# vocabulary (sized from its spec, never built), 4 rows x 2,048 tokens per micro-batch.
GPU = [
    "model.path=builtin:qwen3-0.6b-shape?vocab=151936",
    "marl.workflow=single_agent",
    "marl.sharing=shared",
    "learner.backend=deepspeed",
    "learner.rank_num_gpus=0.5",
    "rollout.engine_num_gpus=0.5",
    "rollout.engines_per_role=1",
    "learner.ranks=1",
    "learner.micro_batch_size=4",
    "algo.max_len=2048",
    "rollout.vllm.gpu_memory_utilization=0.3",
    "learner.role_grad_diagnostics=false",
]


def learner_bytes(checkpointing: bool) -> float:
    """The learner rank's planned bytes with checkpointing forced on or off."""
    cfg = load_config(TINY, [*GPU, "ray.gpu_memory_gb=80", f"learner.gradient_checkpointing="
                             f"{str(checkpointing).lower()}"])
    return next(m.peak for m in make_plan(run_layout(cfg)).members if m.learner is not None)


def checkpointing(*overrides: str) -> dict[str, bool]:
    """policy -> its resolved checkpointing; the config itself keeps what was configured."""
    cfg = load_config(TINY, list(overrides))
    layout = run_layout(cfg)
    refuse_unfit(layout)
    assert to_yaml(cfg) == to_yaml(load_config(TINY, list(overrides)))  # resolving wrote nothing into it
    return dict(layout.checkpointing)


def refused(*overrides: str) -> PlanError:
    with pytest.raises(PlanError) as e:
        refuse_unfit(run_layout(load_config(TINY, list(overrides))))
    return e.value


def test_a_cpu_run_is_not_planned_and_auto_stays_off():
    assert load_config(TINY).learner.gradient_checkpointing is None  # auto, in the config as loaded
    assert set(checkpointing().values()) == {False}
    # However large its micro-batches, a run with no GPU is never refused.
    assert set(checkpointing("learner.micro_batch_size=100000").values()) == {False}
    assert set(checkpointing("learner.gradient_checkpointing=True").values()) == {True}
    assert load_config(TINY, ["learner.gradient_checkpointing=auto"]).learner.gradient_checkpointing is None
    with pytest.raises(ConfigError, match="learner.gradient_checkpointing"):
        load_config(TINY, ["learner.gradient_checkpointing=sometimes"])


def test_auto_checkpointing_turns_on_only_where_the_gpu_needs_it():
    on, off = learner_bytes(True), learner_bytes(False)
    assert on < off
    # The engine beside it takes rollout.vllm.gpu_memory_utilization (0.3) of the GPU: the learner has
    # 0.9 - 0.3.
    between = (on + off) / 2 / (FIT_FRACTION - 0.3) / GIB  # fits with checkpointing only
    assert checkpointing(*GPU, f"ray.gpu_memory_gb={between}") == {"shared": True}
    roomy = off / (FIT_FRACTION - 0.3) / GIB * 1.01  # fits without it
    assert checkpointing(*GPU, f"ray.gpu_memory_gb={roomy}") == {"shared": False}
    # A value set explicitly is kept; there it does not fit, so the plan is refused.
    tight = [*GPU, f"ray.gpu_memory_gb={between}", "learner.gradient_checkpointing=false"]
    assert "does not fit" in str(refused(*tight))
    assert main(["--config", TINY, *tight]) == 2


def test_a_plan_that_does_not_fit_names_the_keys_to_change():
    msg = str(refused(*GPU, "ray.gpu_memory_gb=16"))
    for key in ("ray.gpu_memory_gb", "learner.gradient_checkpointing", "learner.deepspeed.zero_stage",
                "model.lora.enabled", "rollout.vllm.gpu_memory_utilization", "learner.rank_num_gpus"):
        assert key in msg
    assert "engine:solver#0" in msg and "learner:shared#0" in msg  # what shares the GPU


def test_an_engine_share_without_one_whole_sequence_is_refused():
    with pytest.raises(PlanError, match="less than one sequence.*rollout.vllm.gpu_memory_utilization"):
        refuse_unfit(run_layout(load_config(TINY, [*GPU, "ray.gpu_memory_gb=80",
                                                   "rollout.vllm.gpu_memory_utilization=0.02"])))


def test_a_policy_of_its_own_gets_its_own_resolution():
    over = [*GPU, "marl.workflow=voting", "marl.sharing=isolated", "ray.gpu_memory_gb=80",
            "marl.policies.generator.learner.micro_batch_size=32"]
    # The generator's 32 x 2,048 tokens need checkpointing on its GPU, the aggregator's 4 x 2,048 do not.
    assert checkpointing(*over) == {"generator": True, "aggregator": False}
    # A policy whose settings name no learner key gets its own resolution too.
    assert checkpointing(*over[:-1], "marl.policies.generator.model.lora.rank=16") == {"generator": False,
                                                                                       "aggregator": False}


def test_the_plan_follows_padding_free():
    """learner.padding_free reaches the memory model: the same token budget (4 rows x algo.max_len), and
    padded rows' attention masks (learners.compute.memory.mask_entries: tokens x min(max_len, tokens / 2)
    entries, a bf16 copy per layer) where packed rows on a GPU have none."""
    def planned(flag: str):
        cfg = load_config(TINY, [*GPU, "learner.logits_chunk_tokens=1024", f"learner.padding_free={flag}",
                                 "learner.gradient_checkpointing=false"])
        rank = next(m.learner for m in make_plan(run_layout(cfg), memory=0).members if m.learner is not None)
        return learner_setup(cfg, 1, False), rank

    (off_setup, off), (on_setup, on) = planned("false"), planned("true")
    tokens, width = 4 * 2048, 2048
    assert off_setup.tokens == on_setup.tokens == tokens and off_setup.longest_row == width
    assert (off_setup.padding_free, on_setup.padding_free) == (False, True)
    layers = qwen3_shape("0.6b").layers
    assert off.activations - on.activations == tokens * min(width, tokens // 2) * layers * 2
    assert (off.weights, off.logits) == (on.weights, on.logits)


def test_members_share_gpus_as_ray_fractions_do():
    members = [Member("e", 0.5, 1.0), Member("a", 0.5, 1.0), Member("b", 0.5, 1.0), Member("c", 2, 4.0),
               Member("cpu", 0, 1.0)]
    gpus = pack(members)
    assert [[m.name for m in g] for g in gpus] == [["e", "a"], ["b"], ["c"], ["c"]]


def test_a_small_decode_batch_is_bound_by_reading_the_weights():
    s = qwen3_shape("4b")
    assert decode_iteration_s(s, 1, 0) == pytest.approx(2 * s.params() / (H100_HBM_BYTES_S *
                                                                          DECODE_BANDWIDTH_EFFICIENCY))


def test_plan_cli_prints_every_gpu_and_exits_2_when_it_does_not_fit(capsys):
    assert main(["--config", TINY, "--plan", *GPU, "ray.gpu_memory_gb=80"]) == 0
    out = capsys.readouterr().out
    assert "GPU 0:" in out and "checkpointing" in out and "rollout" in out and out.rstrip().endswith("fits")
    assert main(["--config", TINY, "--plan", *GPU, "ray.gpu_memory_gb=16"]) == 2
    assert capsys.readouterr().out.rstrip().endswith("DOES NOT FIT")
    assert main(["--config", TINY, "--plan"]) == 0  # CPU: printed, nothing checked
    assert "not checked" in capsys.readouterr().out


@pytest.mark.slow  # 42 configs through load_config: ~11 s
def test_docs_scaling_is_the_generators_output():
    from jobs.config.sweep_spec import cells, load_sweep
    from jobs.sweep import scaling_page

    spec = load_sweep("jobs/configs/sweeps/paper_matrix.yaml")
    with open("docs/scaling.md") as f:
        assert f.read() == scaling_page(spec, cells(spec)), (
            "docs/scaling.md is stale: python -m jobs.sweep --config jobs/configs/sweeps/paper_matrix.yaml "
            "--dry-run --markdown > docs/scaling.md")


def test_a_trial_waits_for_free_gpus_on_one_node():
    from jobs.pages.scaling import schedule_hours

    assert schedule_hours([(2, 10.0)] * 4, nodes=1) == 10.0  # 4 x 2 GPUs at once on 8
    assert schedule_hours([(2, 10.0)] * 5, nodes=1) == 20.0
    assert schedule_hours([(1.5, 4.0), (1.5, 4.0), (8, 1.0)], nodes=1) == 5.0
