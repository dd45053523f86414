"""The scaling tables of a sweep (docs/scaling.md is paper_matrix.yaml's): every configuration's
planned peak memory per GPU, GPUs per trial and step-time estimates, and the whole matrix's GPU-hours
and wall time on nodes of 8 GPUs. Generated from the planner, so the page cannot drift from the code:
`python -m jobs.sweep --config jobs/configs/sweeps/paper_matrix.yaml --dry-run --markdown > docs/scaling.md`
(a test compares them)."""

from __future__ import annotations

import heapq
from typing import Any

from jobs.config.sweep_spec import SweepConfig, flatten
from jobs.pages.baselines import published_section
from jobs.plan.layout import RunLayout
from jobs.plan.planner import FIT_FRACTION, LEARNER_MFU, gpu_memory, make_plan, step_seconds_at
from jobs.plan.rollout_estimate import (
    DECODE_BANDWIDTH_EFFICIENCY,
    ENGINE_RESERVE,
    EXPECTED_FILL,
    MATMUL_EFFICIENCY,
    VLLM_MAX_NUM_SEQS,
)
from learners.compute.memory import GIB, GPU_ALLOCATOR_POOL

NODE_GPUS = 8
NODES = (1, 2, 4, 8)
AXES = ("marl.workflow", "data.task", "model.path", "marl.sharing")
FILLS = (0.10, EXPECTED_FILL, 0.50, 1.0)  # fractions of the caps the response-length table plans at
NODES_AT_FILL = 4
AUTHORS_GPUS = 2  # per cell, the authors' quick start (docs: the paper's notes)


def configurations(all_cells: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    """The cells less their seed: (one cell of each configuration, how many seeds it runs), in sweep order."""
    out: dict[tuple[Any, ...], list[Any]] = {}
    for cell in all_cells:
        values = flatten({k: v for k, v in cell.items() if k not in ("seed", "where")})
        key = tuple(values.get(a) for a in AXES)
        out.setdefault(key, [cell, 0])[1] += 1
    return [(cell, n) for cell, n in out.values()]


def schedule_hours(trials: list[tuple[float, float]], nodes: int, per_node: int = NODE_GPUS) -> float:
    """Wall hours of (GPUs, hours) trials on `nodes` nodes: longest first, each started as soon
    as one node has its GPUs free (Ray packs a trial's placement group onto one node;
    fractional GPUs count as divisible)."""
    free, now = [float(per_node)] * nodes, 0.0
    running: list[tuple[float, int, float]] = []
    pending = sorted(trials, key=lambda t: -t[1])
    while pending or running:
        for trial in list(pending):
            node = next((n for n in range(nodes) if free[n] + 1e-9 >= trial[0]), None)
            if node is not None:
                free[node] -= trial[0]
                heapq.heappush(running, (now + trial[1], node, trial[0]))
                pending.remove(trial)
        if not running:
            raise ValueError(f"a trial of {pending[0][0]:g} GPUs does not fit a node of {per_node}")
        now, node, gpus = heapq.heappop(running)
        free[node] += gpus
    return now


def _row(layout: RunLayout, seeds: int) -> tuple[str, float, dict[float, float]]:
    """A configuration's table row, its GPUs per trial and its hours per trial at each of FILLS."""
    cfg, plan = layout.cfg, make_plan(layout)
    t = plan.times
    gpus = sum(m.gpus for m in plan.members)
    hours = t["step_s"] * cfg.steps / 3600
    peaks = " / ".join(f"{b / GIB:.1f}" for b in plan.gpu_bytes())
    ckpt = ",".join(sorted({"on" if v else "off" for v in plan.checkpointing.values()}))
    kv = min(m.engine.kv_sequences for m in plan.members if m.engine is not None)
    model = cfg.model.path.rstrip("/").rsplit("/", 1)[-1]
    row = (
        f"| {cfg.marl.workflow} | {cfg.data.task} | {model} | {cfg.marl.sharing} | {len(plan.checkpointing)} "
        "| "
        f"{gpus:g} | {peaks} | {'yes' if plan.fits() else '**no**'} | {ckpt} | {kv} | {t['rollout_s']:.0f} | "
        f"{t['update_s']:.0f} | {t['step_s_at_caps']:.0f} | {hours:.0f} | {hours * gpus * seeds:,.0f} |"
    )
    by_fill = {
        f: step_seconds_at(layout, plan.members, f) * cfg.steps / 3600 for f in FILLS if f != EXPECTED_FILL
    }
    return row, gpus, {**by_fill, EXPECTED_FILL: hours}


def scaling_markdown(spec: SweepConfig, layouts: list[tuple[RunLayout, int]]) -> str:
    """The page for the layouts of a sweep's configurations, each with how many seeds
    it runs (`configurations`)."""
    rows: list[str] = []
    by_fill: dict[float, list[tuple[float, float]]] = {f: [] for f in FILLS}
    for layout, seeds in layouts:
        row, gpus, hours = _row(layout, seeds)
        rows.append(row)
        for f in FILLS:
            by_fill[f] += [(gpus, hours[f])] * seeds
    trials = by_fill[EXPECTED_FILL]
    memory = gpu_memory(layouts[-1][0])
    return "\n".join([
        *_intro(spec, len(rows), len(trials), memory),
        "| workflow | task | model | sharing | policies | GPUs per trial | peak GiB per GPU | fits | "
        "checkpointing | KV seqs | rollout s/step | update s/step | step s at caps | h per trial | GPU-h "
        "(all seeds) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows, "", *_schedule(trials), *_fills(by_fill), *published_section(), *_sources(), ""])


def _intro(spec: SweepConfig, configs: int, trials: int, memory: float) -> list[str]:
    return [
        "# Scaling: the paper matrix on paper",
        "",
        f"Generated by `python -m jobs.sweep --config jobs/configs/sweeps/{spec.name}.yaml --dry-run "
        "--markdown` "
        "(jobs/pages/scaling.py, from the planner jobs/plan/planner.py); do not edit by hand. "
        f"{configs} configurations (workflow × task × scale × sharing) × their seeds = {trials} trials. "
        "Memory is "
        f"planned for {memory / GIB:g} GiB GPUs (`ray.gpu_memory_gb`), each GPU at most {FIT_FRACTION:.0%} "
        "of it; "
        "`peak GiB per GPU` lists every GPU of a trial (engines and learner ranks sharing a GPU add up). "
        f"Times are estimates, not measurements: each turn's prompt and response at {EXPECTED_FILL:.0%} of "
        "their "
        "caps (an assumption: no length distribution of these workloads on Qwen3 has been measured), and, as "
        "an upper bound, every turn at both caps (`step s at caps`). `KV seqs`: sequences of the cell's "
        "longest prompt + response the engine's cache holds at once (more run at once at typical lengths).",
        "",
    ]


def _schedule(trials: list[tuple[float, float]]) -> list[str]:
    gpu_hours = sum(g * h for g, h in trials)
    longest = max(h for _, h in trials)
    lines = [f"Whole matrix: {gpu_hours:,.0f} GPU-hours (estimate). Wall time on nodes of {NODE_GPUS} H100s, "
             f"longest trials first (no schedule beats the longest trial, {longest:,.0f} h):", "",
             "| nodes | GPUs | wall hours | wall days |", "|---|---|---|---|"]
    for n in NODES:
        h = schedule_hours(trials, n)
        lines.append(f"| {n} | {n * NODE_GPUS} | {h:,.0f} | {h / 24:.1f} |")
    return [*lines, ""]


def _fills(by_fill: dict[float, list[tuple[float, float]]]) -> list[str]:
    """The matrix at other response lengths: GPU-hours, the longest trial and the wall
    time on NODES_AT_FILL nodes."""
    lines = [
        "The response-length assumption drives these figures: every turn's prompt and response at a fraction "
        "of their caps (rollout, and the tokens every update trains on). At other fractions:",
        "",
        f"| fill of the caps | GPU-hours | longest trial h | wall days on {NODES_AT_FILL} nodes |",
        "|---|---|---|---|",
    ]
    for f, trials in sorted(by_fill.items()):
        wall = schedule_hours(trials, NODES_AT_FILL) / 24
        lines.append(
            f"| {f:.0%}{' (the table)' if f == EXPECTED_FILL else ''} | {sum(g * h for g, h in trials):,.0f} "
            f"| {max(h for _, h in trials):,.0f} | {wall:.1f} |"
        )
    jobs = {f: max(h for _, h in trials) / AUTHORS_GPUS / 24 for f, trials in by_fill.items()}
    return [
        *lines,
        "",
        "A sanity bound: the authors ran each cell on 2 H100s under a 24 h SLURM limit with "
        "preemption resume (their cluster config; no GPU-hours are published). The longest trial here, on "
        f"{AUTHORS_GPUS} GPUs at twice this plan's one-GPU rate, is {jobs[0.10]:.0f}, "
        f"{jobs[EXPECTED_FILL]:.0f} "
        f"and {jobs[0.50]:.0f} back-to-back 24 h jobs at 10 %, {EXPECTED_FILL:.0%} and 50 % of the caps: a "
        "matrix of such cells is plausible under that setup only at short responses, so the measured "
        "response lengths of a first run (`rollout/tokens`) are what this page most needs; until then the "
        f"{EXPECTED_FILL:.0%} fill is an assumption, not a measurement.",
        "",
    ]


def _sources() -> list[str]:
    return [
        "Where each figure comes from:",
        "",
        "- Model shapes: Qwen3's published configs (jobs/models/builtin.py `QWEN3_SHAPES`, vocabulary "
        "151,936).",
        "- Learner memory (learners/compute/memory.py): DeepSpeed's own ZeRO-2/3 model-state estimator; "
        "activations ≈ "
        "8h + 6(n_q+n_kv)d + 8I bytes per token and layer in bf16 with flash-attention, with checkpointing "
        "2h "
        "per token and layer plus one layer; the LM head in chunks of `learner.logits_chunk_tokens` at 12 "
        "bytes per position and vocabulary entry; the attention masks transformers builds: padded rows "
        "(`learner.padding_free=false`, these cells) at most tokens × min(algo.max_len, tokens/2) entries, 2 "
        "bytes per entry and layer kept for backward (one layer's with checkpointing), packed rows none "
        "(flash-attention varlen: a learner on a GPU without flash_attn refuses packed rows). On one H200 "
        "these GPU terms gave 0.90-1.03 of the allocated peaks measured at 16,384-65,536 tokens and 0.996 at "
        "the paper's 40,960 (benchmarks/results/2026-12-04-gpu-check-h200.md); torch's caching allocator "
        "reserved 1.13-1.25 times "
        f"the allocated peak there, so each learner's peak counts a pool of {GPU_ALLOCATOR_POOL:g} times its "
        "allocated terms (the refusal margin, learners.compute.memory.GPU_ALLOCATOR_POOL). The CPU "
        "coefficients are "
        "calibrated (tests/learners/test_memory_calibration.py).",
        "- Engine memory (jobs/plan/rollout_estimate.py): bf16 weights, multi-LoRA slots, a "
        f"{ENGINE_RESERVE / GIB:g} GiB reserve (estimate), the rest KV cache at 2·L·n_kv·d·2 bytes per "
        "token; "
        "`KV seqs` is how many sequences of the cell's longest prompt + response it holds at once.",
        "- Rollout time: a roofline on the NVIDIA H100 SXM datasheet (3.35 TB/s HBM3, 989 TFLOP/s dense "
        "bf16) "
        "at an "
        f"assumed {DECODE_BANDWIDTH_EFFICIENCY:.0%} of the bandwidth for decode and {MATMUL_EFFICIENCY:.0%} "
        "of the "
        f"matmul rate for prefill, at most {VLLM_MAX_NUM_SEQS} sequences per engine (vLLM's H100 default), "
        "bounded below by one episode's turns one after another.",
        "- Update time: this project's learner measured on one H200 at prime-rl's four single-GPU baselines "
        f"(benchmarks/results/2026-12-04-gpu-check-h200.md: MFU 0.253-0.291, the median {LEARNER_MFU} "
        "taken), "
        "over each trained token's FLOPs as those baselines count them (6 per weight plus causal attention's "
        "6·L·n_q·d·T in a row of T tokens, T each turn's prompt + response at the fill), with checkpointing; "
        "a recomputed old log-prob pass adds a forward (a third of full fine-tuning's passes, a quarter of "
        "LoRA's with checkpointing), counted on the tokens trained: padded positions "
        "(`learner.padding_free=false`) add their share on top, which a run reports as "
        "`batch/padding_frac/<policy>`. H100 and H200 share the dense bf16 peak; the H200's higher bandwidth "
        "matters little to these compute-bound steps.",
    ]
