"""The learning check of tests/jobs/test_train.py in multi-LoRA serving: isolated policies as LoRA adapters
on one engine, LoRA-only syncs, every sync fingerprint-verified. Fails if the adapter routing, the adapter
payload or its loading into the engine is wrong (the reward would not rise).

The learning check runs on a wider tiny model: LoRA on the linear layers cannot rescale the (tied, 0.02-std)
embeddings or the final norm, so on the 64-wide model a logit can exceed the others by at most ~0.02 x 64
nats and "answer 7" stays out of reach; 512 wide lifts that bound to ~10 nats."""

from __future__ import annotations

import pytest

from jobs.config import load_config
from jobs.telemetry.tracking import read_metrics
from jobs.train import train
from tests.learning import assert_learned, write_seven_tasks

WIDE_TINY = "builtin:tiny?hidden=512&intermediate=512"


# vLLM only: on the HF engine, multi-LoRA serving's rollouts and updates equal merged serving's step for step
# (the test below), and merged serving's learning is checked by tests/jobs/test_train.py.
@pytest.mark.slow
@pytest.mark.vllm
def test_reward_is_learned_with_multi_lora_serving(ray_cluster, tmp_path):
    backend = "vllm"
    data = write_seven_tasks(tmp_path)
    cfg = load_config("jobs/configs/tiny.yaml", [
        f"out_dir={tmp_path}", f"model.path={WIDE_TINY}", "marl.workflow=voting", "marl.sharing=isolated",
        "steps=20", f"data.train={data}",
        f"data.eval={data}", "data.eval_size=8", "rollout.engines_per_role=0", "learner.ranks=0",
        f"rollout.backend={backend}", "rollout.vllm.kv_cache_gb=0.25", "rollout.lora_serving=multi",
        "model.lora.enabled=true", "model.lora.rank=8", "model.lora.alpha=16", "learner.optim.lr=2e-2",
        "rollout.prompts_per_step=4", "rollout.samples_per_prompt=8", "ray.num_cpus=2"])
    summary = train(cfg)
    rows = read_metrics(tmp_path / "tiny")
    assert_learned(rows, summary)
    # Two policies (generator, aggregator), one adapter each, into the one engine.
    assert all(r["sync/verified"] == 2 for r in rows if "sync/verified" in r)


@pytest.mark.slow
def test_multi_lora_serving_follows_the_merged_weight_runs_trajectory_exactly(ray_cluster, tmp_path):
    """Same seeds, same learner: serving adapters on the base gives the very rollouts and updates that serving
    the merged weights gives (HF engines, where both are exact in fp32)."""

    def run(serving: str) -> list[dict]:
        out = tmp_path / serving
        train(load_config("jobs/configs/tiny.yaml", [
            f"out_dir={out}", "marl.workflow=voting", "marl.sharing=isolated", "steps=2", "data.eval_size=0",
            "rollout.engines_per_role=0", "learner.ranks=0", f"rollout.lora_serving={serving}",
            "model.lora.enabled=true", "model.lora.rank=8", "model.lora.alpha=16", "learner.optim.lr=5e-2",
            "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "ray.num_cpus=2"]))
        keys = (
            "reward/mean",
            "loss/generator",
            "loss/aggregator",
            "grad/norm/generator",
            "grad/norm/aggregator",
        )
        return [{k: r[k] for k in keys if k in r} for r in read_metrics(out / "tiny")]

    single, multi = run("single"), run("multi")
    assert len(single) == 3 and all(single[:2])
    assert multi == single
