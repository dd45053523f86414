"""Study 3's figure, drawn from the committed runs by `collect.py`: `cpu_smollm2_v3_mechanics.png` beside the
README (linked into docs/studies/).

Eight panels, one colour per arm, a thin line per seed and a thick one for the mean over seeds:
- at each evaluation: held-out accuracy; the episodes with a right candidate (the generators' side), the
  aggregator's parse rate, its choice accuracy on those episodes, and its response length (voting arms);
- per training step: the aggregator's share of the step's gradient norm, and how far the step moved each
  policy (`update/policy_move/<policy>`; an isolated arm's policies are drawn dashed for the aggregator's).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from studies.cpu_smollm2_v2.collect import Run, by_arm

COLOURS = {"single_agent-shared": "tab:gray", "voting-shared": "tab:blue", "voting-isolated": "tab:orange"}
EVAL_STEPS_EVERY = 10


def _eval_xs(n: int) -> list[int]:
    return [i * EVAL_STEPS_EVERY for i in range(n)]


def per_step(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the training rows that logged `key`."""
    pairs = [(int(r["step"]), float(r[key])) for r in rows if isinstance(r.get(key), int | float)]
    return [s for s, _ in pairs], [v for _, v in pairs]


def share_per_step(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """`per_step` of a role's share (`<prefix>/<role>`), NaN on the steps where every role's share under the
    prefix is 0: no row carried an advantage, so there was no gradient to share."""
    prefix = key.rsplit("/", 1)[0] + "/"
    steps, values = per_step(rows, key)
    totals = {int(r["step"]): sum(float(v) for k, v in r.items()
                                  if k.startswith(prefix) and isinstance(v, int | float))
              for r in rows if key in r}
    return steps, [v if totals[s] > 0 else math.nan for s, v in zip(steps, values, strict=True)]


def mean_curve(curves: list[list[float]]) -> list[float]:
    """Mean over seeds at each position, NaNs left out (NaN where no seed has a value)."""
    columns = zip(*curves, strict=False)
    return [statistics.fmean(v) if (v := [x for x in col if x == x]) else math.nan for col in columns]


def draw_arms(ax: Any, runs: list[Run], series: Callable[[Run], tuple[list[int], list[float]]],
              colours: dict[str, str], keep: Callable[[str], bool] = lambda arm: True, linestyle: str = "-",
              label: str = "") -> None:
    """One arm's colour: a thin line per seed and a thick one for their mean, for the arms `keep` takes."""
    for arm, group in by_arm(runs).items():
        if not keep(arm):
            continue
        colour = colours.get(arm, "tab:green")
        curves = [series(r) for r in group]
        for xs, ys in curves:
            # Markers keep the points between NaNs (steps without a gradient) visible.
            ax.plot(xs, ys, color=colour, alpha=0.35, linewidth=0.8, marker=".", markersize=3,
                    linestyle=linestyle)
        shortest = min(curves, key=lambda c: len(c[0]))[0]  # the mean stops where a seed's curve does
        ax.plot(shortest, mean_curve([ys for _, ys in curves]), color=colour, linewidth=2.2, marker=".",
                linestyle=linestyle,
                label=label or f"{arm} ({len(group)} seed{'s' if len(group) > 1 else ''})")


def draw(runs: list[Run], out: Path, parse_rate: Callable[[list[dict[str, Any]], str], list[float]],
         eval_series: Callable[[list[dict[str, Any]], str], list[float]]) -> Path:
    """Writes the figure of `runs` to `out`; `parse_rate` and `eval_series` are collect.py's readers."""
    from matplotlib.figure import Figure  # Agg, no pyplot state

    fig = Figure(figsize=(17, 7.5), dpi=90, layout="constrained")
    axes = fig.subplots(2, 4)

    def at_evals(values: list[float]) -> tuple[list[int], list[float]]:
        return _eval_xs(len(values)), values

    panels: list[tuple[str, str, Callable[[Run], tuple[list[int], list[float]]], bool]] = [
        ("Held-out accuracy\n(64 tasks)", "accuracy", lambda r: at_evals(r.curve), False),
        ("Episodes with a right candidate\n(of 64: a generator answered right)", "episodes",
         lambda r: at_evals(eval_series(r.record.rows, "eval/choice/available/aggregator")), True),
        ("Aggregator parse rate\n(evaluations)", "parsed turns",
         lambda r: at_evals(parse_rate(r.record.rows, "aggregator")), True),
        ("Aggregator choice accuracy\n(episodes with a right candidate)", "accuracy",
         lambda r: at_evals(eval_series(r.record.rows, "eval/choice/accuracy/aggregator")), True),
        ("Aggregator response length\n(evaluations)", "tokens",
         lambda r: at_evals(eval_series(r.record.rows, "eval/response_len/aggregator")), True),
        ("Aggregator share of the step's\ngradient norm (steps with a gradient)", "share",
         lambda r: share_per_step(r.record.rows, "grad/step_norm_share/aggregator"), True),
    ]
    for ax, (title, ylabel, series, voting_only) in zip(axes.flat, panels, strict=False):
        draw_arms(ax, runs, series, COLOURS, (lambda arm: arm.startswith("voting")) if voting_only
                  else (lambda arm: True))
        ax.set(title=title, xlabel="training steps done", ylabel=ylabel)
        ax.grid(alpha=0.3)
    move = axes.flat[6]
    for arm, group in by_arm(runs).items():
        for run in group:
            keys = {k for row in run.record.rows for k in row if k.startswith("update/policy_move/")}
            for key in sorted(keys):
                xs, ys = per_step(run.record.rows, key)
                dashed = key.endswith("/aggregator")
                move.plot(xs, ys, color=COLOURS.get(arm, "tab:green"), alpha=0.6, linewidth=0.9,
                          linestyle="--" if dashed else "-")
    move.set(title="Policy movement per step\n(dashed: an isolated aggregator's policy)",
             xlabel="training step", ylabel="mean |Δ log-prob|")
    move.grid(alpha=0.3)
    legend = axes.flat[7]  # the eighth panel holds the key, which the first panel's lines would crowd
    legend.set_axis_off()
    legend.legend(*axes.flat[0].get_legend_handles_labels(), loc="center")
    fig.suptitle("Study 3 (SmolLM2-135M, chain_sum): thin lines are seeds, thick lines their mean")
    fig.savefig(out)
    return out
