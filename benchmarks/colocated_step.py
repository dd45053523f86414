"""The quickstart's step, rollout.layout=colocated against separate, back to back in one process: the median
update time (time/update_s) and step time (time/step_s) of each layout and their ratio, first step left out
(warm-up). On CPU the colocated step does everything but share memory: the hf engine really frees and restores
its weights and the learner really moves AdamW's states to host buffers and back, so the ratio is the phase
switches' cost. On GPUs the gain of the layout (twice the engines and each phase with most of the GPU) is the
planner's to estimate: `python -m jobs.plan.cells`.

    nice python -m benchmarks.colocated_step --steps 4 --out /tmp/colocated_step
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from jobs.config import load_config
from jobs.telemetry.tracking import read_metrics
from jobs.train import train

QUICKSTART = "jobs/configs/quickstart.yaml"
LAYOUTS = ("separate", "colocated")
# vLLM's sleep mode is CUDA-only (the layout refuses vLLM without GPUs): on CPU both layouts run the hf
# engine, whose sleep really frees its weights.
CPU = ["rollout.backend=hf"]
PHASES = ("update", "step", "sleep", "offload", "wake")


def run_layout(layout: str, out: Path, steps: int, extra: list[str]) -> dict[str, float]:
    """One quickstart run under `layout`; the medians of its steps after the first (seconds)."""
    cfg = load_config(QUICKSTART, [f"out_dir={out / layout}", f"steps={steps}", "eval_every=0",
                                   "data.eval_size=0", "checkpoint.every=0", f"rollout.layout={layout}",
                                   *CPU, *extra])
    train(cfg)
    rows = [r for r in read_metrics(out / layout / cfg.run_name) if "time/step_s" in r][1:]
    keys = [k for k in PHASES if all(f"time/{k}_s" in r for r in rows)]
    return {k: statistics.median(float(r[f"time/{k}_s"]) for r in rows) for k in keys}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("overrides", nargs="*", help="config overrides for both runs (key=value)")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="colocated-step-"))
    medians = {layout: run_layout(layout, out, args.steps, args.overrides) for layout in LAYOUTS}
    for layout, m in medians.items():
        print(f"{layout:>9}: " + ", ".join(f"{k} {v:.2f} s" for k, v in m.items()))
    ratio = {k: medians["colocated"][k] / medians["separate"][k] for k in ("update", "step")}
    print(f"colocated / separate: update {ratio['update']:.3f}, step {ratio['step']:.3f}")
    print(json.dumps({"steps": args.steps, "medians": medians, "ratio": ratio}))


if __name__ == "__main__":
    main()
