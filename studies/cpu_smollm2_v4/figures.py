"""Study 4's figures of the per-role mechanics, drawn from the exported cells by `collect.py`: one for the
study (`cpu_smollm2_v4_mechanics.png`) and one for the pilot (`cpu_smollm2_v4_pilot_mechanics.png`), beside
`results.md`.

Nine panels, one colour per arm, a thin line per seed and a thick one for the mean over seeds (study 3's
`draw_arms`); where a panel shows several roles, each role has its own line style:
- at each evaluation: held-out accuracy; the orchestrator's mean strategies per plan; the episodes with a
  right worker, and the synthesizer's decision accuracy on them against a random worker's (dotted); response
  tokens per role;
- per training step or window: each role's share of the step's gradient mass under SP (role capture), the
  orchestrator's and synthesizer's gradient norm over the workers' under IP beside the authors' 5-8x, and how
  far each step moved each policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs.report import eval_curve
from studies.cpu_smollm2_v2.collect import Run
from studies.cpu_smollm2_v3.collect import eval_series
from studies.cpu_smollm2_v3.figures import draw_arms, per_step, share_per_step
from studies.cpu_smollm2_v4 import mechanics
from studies.cpu_smollm2_v4.mechanics import IP, SA, SP, is_orch

COLOURS = {SA: "tab:gray", SP: "tab:blue", IP: "tab:orange"}
STYLES = {"orchestrator": "-", "worker": "--", "synthesizer": ":", "solver": "-"}
AUTHORS_RATIO = (5.0, 8.0)  # the authors' "5-8x larger grad norms" of supervisory roles under IP

Series = Callable[[Run], tuple[list[int], list[float]]]


def eval_steps(run: Run) -> list[int]:
    """Steps done at each evaluation, the base's 0 first."""
    return [int(x) for x in eval_curve(run.record.rows)[0]]


def at_evals(run: Run, values: list[float], base: bool = True) -> tuple[list[int], list[float]]:
    """`values` against the run's evaluations (without the base's when `base` is False)."""
    steps = eval_steps(run)[0 if base else 1:]
    return steps[: len(values)], values[: len(steps)]


def mean_strategies(shares: dict[str, float]) -> float:
    """Mean strategies per plan over the plans of 1-3 strategies (plan_measures' shares), NaN without any."""
    counted = {int(c): shares[f"plans {c}"] for c in ("1", "2", "3")}
    total = sum(counted.values())
    return sum(c * s for c, s in counted.items()) / total if total else math.nan


def plans(run: Run) -> tuple[list[int], list[float]]:
    measures = mechanics.plan_measures(run.record.path)
    return sorted(measures), [mean_strategies(measures[s]) for s in sorted(measures)]


def synthesizer(measure: str) -> Series:
    def series(run: Run) -> tuple[list[int], list[float]]:
        measures = mechanics.synthesizer_measures(run.record.path)
        return sorted(measures), [float(measures[s][measure]) for s in sorted(measures)]
    return series


def _by_role(ax: Any, runs: list[Run], prefix: str, series: Callable[[str], Series],
             keep: Callable[[str], bool]) -> None:
    for role in mechanics.roles_of([r.record.rows for r in runs if keep(r.arm)], prefix):
        draw_arms(ax, runs, series(role), COLOURS, keep, STYLES.get(role, "-."), label=role)


def _synthesizer_panel(ax: Any, runs: list[Run]) -> None:
    draw_arms(ax, runs, synthesizer("decision"), COLOURS, is_orch)
    draw_arms(ax, runs, synthesizer("random"), COLOURS, is_orch, ":", label="random worker")


def _ratio_panel(ax: Any, runs: list[Run]) -> None:
    ax.axhspan(*AUTHORS_RATIO, color="tab:red", alpha=0.1)
    for role in ("orchestrator", "synthesizer"):
        def series(r: Run, role: str = role) -> tuple[list[int], list[float]]:
            return at_evals(r, mechanics.role_norm_ratio(r.record.rows, role), base=False)
        draw_arms(ax, runs, series, COLOURS, lambda arm: arm == IP, STYLES[role], label=role)


def _panels(runs: list[Run]) -> list[tuple[str, str, Callable[[Any], None]]]:
    return [
        ("Held-out accuracy (64 tasks)", "accuracy",
         lambda ax: draw_arms(ax, runs, lambda r: at_evals(r, r.curve), COLOURS)),
        ("Orchestrator: strategies per plan\n(mean over plans of 1-3)", "strategies",
         lambda ax: draw_arms(ax, runs, plans, COLOURS, is_orch)),
        ("Episodes with a right worker (of 64)", "episodes",
         lambda ax: draw_arms(ax, runs, synthesizer("available"), COLOURS, is_orch)),
        ("Synthesizer on those: its answer (solid)\nagainst a random worker (dotted)", "accuracy",
         lambda ax: _synthesizer_panel(ax, runs)),
        ("Response tokens per role (evaluations)\n- orchestrator/solver, -- worker, : synthesizer", "tokens",
         lambda ax: _by_role(ax, runs, "eval/response_len/", lambda role: lambda r: at_evals(
             r, eval_series(r.record.rows, f"eval/response_len/{role}")), lambda arm: True)),
        ("SP: role's share of the step's gradient mass (steps with\n"
         "a gradient; - orchestrator, -- worker, : synthesizer)", "share",
         lambda ax: _by_role(ax, runs, "grad/step_mass_share/", lambda role: lambda r: share_per_step(
             r.record.rows, f"grad/step_mass_share/{role}"), lambda arm: arm == SP)),
        ("IP: role's gradient norm over the workers'\n(window medians; band: the authors' 5-8x)", "ratio",
         lambda ax: _ratio_panel(ax, runs)),
        ("Policy movement per step\n(IP: a line style per role's policy)", "mean |Δ log-prob|",
         lambda ax: _by_role(ax, runs, "update/policy_move/", lambda policy: lambda r: per_step(
             r.record.rows, f"update/policy_move/{policy}"), lambda arm: True)),
    ]


def draw(runs: list[Run], out: Path, title: str) -> Path:
    """Writes the figure of `runs` to `out`."""
    from matplotlib.figure import Figure  # Agg, no pyplot state

    fig = Figure(figsize=(17, 12), dpi=80, layout="constrained")
    axes = fig.subplots(3, 3)
    for ax, (heading, ylabel, plot) in zip(axes.flat, _panels(runs), strict=False):
        plot(ax)
        ax.set(title=heading, xlabel="training steps done", ylabel=ylabel)
        ax.grid(alpha=0.3)
    legend = axes.flat[8]  # the ninth panel holds the arms' key
    legend.set_axis_off()
    legend.legend(*axes.flat[0].get_legend_handles_labels(), loc="center")
    fig.suptitle(f"{title}: thin lines are seeds, thick lines their mean")
    fig.savefig(out)
    return out
