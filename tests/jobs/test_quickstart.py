"""The quickstart as a new user runs it (`scripts/quickstart.sh`: SmolLM2-135M with a LoRA policy, the engine
and the learner as Ray actors on the embedded cluster) visibly learns: held-out accuracy on at least 64 unseen
prompts rises by at least 0.15 within its training budget, and the console prints before and after."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from jobs.config import load_config
from jobs.telemetry.tracking import read_metrics

QUICKSTART = "jobs/configs/quickstart.yaml"
MIN_GAIN = 0.15


def test_quickstart_config_evaluates_on_enough_held_out_prompts():
    cfg = load_config(QUICKSTART)
    assert cfg.data.eval_size >= 64 and cfg.data.max_overlap == 0.0
    assert cfg.rollout.engines_per_role >= 1 and cfg.learner.ranks >= 1  # the actor layout users run


@pytest.mark.slow
@pytest.mark.timeout(45 * 60)  # the whole quickstart in a subprocess: past the 600 s default on a loaded box
def test_quickstart_learns(tmp_path):
    # A user's shell: none of the VLLM_* settings that in-process engines of
    # earlier tests put in this process.
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    done = subprocess.run(["scripts/quickstart.sh", f"out_dir={tmp_path}"], capture_output=True, text=True,
                          timeout=40 * 60, check=False, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = read_metrics(tmp_path / "quickstart")
    before = rows[0]["eval/accuracy_before"]
    after = rows[-1]["eval/accuracy"]
    line = re.search(r"held-out accuracy ([\d.]+) -> ([\d.]+)", done.stdout)
    assert line and (float(line[1]), float(line[2])) == (round(before, 3), round(after, 3))
    assert after - before >= MIN_GAIN, f"held-out accuracy {before:.3f} -> {after:.3f}"
    # The console is the run's own (tracking.verbose=false): no vLLM log lines ("WARNING 12-01 15:55:08
    # [arg_utils.py:1945] ..."), no DeepSpeed ones ("[WARNING] [real_accelerator.py:213:get_accelerator]"), no
    # weight-loading progress bars.
    console = done.stdout + done.stderr
    assert not re.search(r"(INFO|WARNING) \d\d-\d\d [\d:]+ \[\w+\.py:\d+\]|\[WARNING\]", console), console[
        -3000:
    ]
    assert "Loading safetensors" not in console
