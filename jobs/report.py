"""Plots of finished runs: `python -m jobs.report RUN_DIR|SWEEP_DIR [...] --out DIR`.

Writes PNGs and one index.html: held-out accuracy vs step of every run overlaid (line style by sharing, peak
and final marked, cliffs flagged by marl.cliff's detector, each noted as terminal or recovered from), and per
run the reward, gradient norm, gradient mass share and response length of each role. A run dir is any folder
holding metrics.jsonl (labels come from its config.yaml); any other folder, e.g. a Tune experiment, is
searched recursively for run dirs. Metrics a run did not record are skipped with a note in the page.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from omegaconf import OmegaConf

from marl.cliff import CliffEvent, detect, first_cliff
from marl.workflows import WORKFLOWS, roles_of

STYLE = {"shared": "-", "isolated": "--", "custom": ":"}  # one-role runs: "-." whatever their sharing
# (file suffix, title, metric prefix: one line per role `<prefix><role>`, y label)
ROLE_PANELS = (
    ("reward", "Reward per role", "reward/mean/", "mean reward"),
    ("grad_norm", "Gradient norm per role", "grad/role_norm/", "norm"),
    # How far each step moved each policy (learners/policy_move.py): one line per policy, beside the norms.
    ("policy_move", "Policy movement per policy", "update/policy_move/", "mean |Δ log-prob| per token"),
    ("mass_share", "Gradient mass share per role (within its policy)", "grad/mass_share/",
     "share of tokens x |advantage|"),
    # Across policies: under isolated policies the within-policy share of a policy's only role is 1.
    ("step_mass_share", "Gradient mass share per role (whole step)", "grad/step_mass_share/",
     "share of the step's tokens x |advantage|"),
    ("step_norm_share", "Gradient norm share per role (whole step)", "grad/step_norm_share/",
     "share of the summed role norms"),
    ("response_len", "Response length per role", "response_len/mean/", "tokens"),
)


@dataclass
class RunRecord:
    """A finished (or running) run as its folder holds it: its config's identity and its metric rows."""

    path: Path
    name: str
    workflow: str
    sharing: str
    cliff: tuple[float, float, float]  # (drop, window, relative_drop) the run was configured with
    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    @property
    def single_role(self) -> bool:
        """A one-role workflow (the single-agent baseline): shared and isolated are the same run."""
        return self.workflow in WORKFLOWS and len(roles_of(self.workflow)) == 1

    @property
    def label(self) -> str:
        return f"{self.name} · {self.workflow}" + ("" if self.single_role else f" · {self.sharing}")

    @property
    def line_style(self) -> str:
        return "-." if self.single_role else STYLE.get(self.sharing, "-.")


def find_runs(paths: list[Path]) -> list[Path]:
    """Run dirs (folders holding metrics.jsonl) at or under each path, in a stable order, each once."""
    found: list[Path] = []
    for path in paths:
        if (path / "metrics.jsonl").is_file():
            found.append(path)
        else:
            found += sorted(p.parent for p in path.rglob("metrics.jsonl"))
    return list(dict.fromkeys(p.resolve() for p in found))


def load_run(path: Path, default_cliff: tuple[float, float] = (0.1, 2)) -> RunRecord:
    notes: list[str] = []
    saved: dict[str, Any] = {}  # the run's config.yaml as plain data, of whatever schema version wrote it
    if (path / "config.yaml").is_file():
        saved = cast(dict[str, Any], OmegaConf.to_container(OmegaConf.load(path / "config.yaml")))
    else:
        notes.append("no config.yaml: labels and cliff settings are defaults")
    by_step: dict[int, dict[str, Any]] = {}
    for line in (path / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            # a re-logged step (restart) updates the older row
            by_step.setdefault(row["step"], {}).update(row)
    marl, cliff = saved.get("marl", {}), saved.get("cliff", {})
    return RunRecord(
        path,
        saved.get("run_name", path.name),
        marl.get("workflow", "?"),
        marl.get("sharing", "?"),
        (
            cliff.get("drop", default_cliff[0]),
            cliff.get("window", default_cliff[1]),
            cliff.get("relative_drop", 0.0),
        ),
        [by_step[s] for s in sorted(by_step)],
        notes,
    )


def eval_curve(rows: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """Held-out accuracy against training steps done. The base model's (`eval/accuracy_before`, in step 0's
    row) is x = 0; a training row's eval ran after that step's update (x = step + 1); the final eval row (no
    training metrics) follows the last step that actually ran."""
    steps_done = max((r["step"] + 1 for r in rows if "time/step_s" in r), default=0)
    xs, ys = [], []
    base = next((r["eval/accuracy_before"] for r in rows if "eval/accuracy_before" in r), math.nan)
    if base == base:
        xs.append(0)
        ys.append(float(base))
    for r in rows:
        if "eval/accuracy" in r and r["eval/accuracy"] == r["eval/accuracy"]:  # NaN: no eval data
            xs.append(r["step"] + 1 if "time/step_s" in r else steps_done or r["step"])
            ys.append(float(r["eval/accuracy"]))
    return xs, ys


def role_series(rows: list[dict[str, Any]], prefix: str) -> dict[str, tuple[list[int], list[float]]]:
    """`prefix<role>` metrics as role -> (steps, values), over training rows that recorded them."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for r in rows:
        for key, value in r.items():
            if key.startswith(prefix) and "/" not in key[len(prefix):] and isinstance(value, (int, float)):
                xs, ys = out.setdefault(key[len(prefix):], ([], []))
                xs.append(r["step"])
                ys.append(float(value))
    return out


def _figure(width: float = 7.0, height: float = 4.0) -> Any:
    # A bare Figure renders with Agg and leaves pyplot's global state (and any interactive backend) alone.
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _cliff_note(run: RunRecord, xs: list[int], ys: list[float], event: CliffEvent) -> str:
    """The first cliff of a run's held-out curve: where it was flagged, the running peak it fell from, and
    whether the run came back (a flag marks a persistent drop, not the run's end)."""
    drop, window, relative = run.cliff
    rule = f"drop >= {drop}" + (f" or to <= {1 - relative:g}x of it" if relative > 0 else "")
    where = (f"cliff flagged at step {xs[event.index]} (running peak {event.peak:.3f} at step "
             f"{xs[event.peak_index]}, {rule} for {int(window)} evaluations)")
    final = f"final {ys[-1]:.3f} at step {xs[-1]}"
    if event.recovered:
        return f"{run.label}: {where}, recovered: {final}"
    return f"{run.label}: terminal {where}; {final}"


def _plot_curve(ax: Any, run: RunRecord, color: str) -> str | None:
    """One run's accuracy curve on `ax`, its peak, final point and cliffs marked; returns its note (no
    held-out accuracy, or the first cliff), None when there is none."""
    xs, ys = eval_curve(run.rows)
    if not ys:
        return f"{run.label}: no eval/accuracy recorded"
    ax.plot(xs, ys, run.line_style, color=color, marker=".", label=run.label)
    peak = max(range(len(ys)), key=ys.__getitem__)
    ax.plot(xs[peak], ys[peak], "*", color=color, markersize=14, markeredgecolor="black")
    ax.plot(xs[-1], ys[-1], "o", color=color, markersize=8, markeredgecolor="black")
    drop, window, relative = run.cliff[0], int(run.cliff[1]), run.cliff[2]
    event = first_cliff(ys, drop=drop, window=window, relative_drop=relative)
    if event is None:
        return None
    cliffs = detect(ys, drop=drop, window=window, relative_drop=relative)
    ax.plot([xs[c] for c in cliffs], [ys[c] for c in cliffs], "X", color="red", markersize=11)
    return _cliff_note(run, xs, ys, event)


def plot_accuracy(runs: list[RunRecord], out: Path) -> list[str]:
    """accuracy.png with every run's curve; returns notes (runs without held-out accuracy, cliffs found)."""
    fig, notes = _figure(8.0, 4.5), []
    ax = fig.add_subplot()
    for i, run in enumerate(runs):
        note = _plot_curve(ax, run, f"C{i % 10}")
        if note is not None:
            notes.append(note)
    ax.set(
        title="Held-out accuracy\n"
        "(★ peak, ● final, ✖ cliff; solid shared, dashed isolated, dash-dot one role)",
        xlabel="training steps done",
        ylabel="accuracy",
    )
    _decorate(ax)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    fig.savefig(out / "accuracy.png")
    return notes


def figure_names(runs: list[RunRecord]) -> list[str]:
    """One PNG name per run, from its run name, so a run's figure keeps its name as other runs join the report
    (a committed report then changes only where a run did). Names two runs share (runs of several sweeps, each
    named alike) get the run's position as well."""
    slugs = [_slug(run.name) for run in runs]
    return [f"run_{s}.png" if slugs.count(s) == 1 else f"run_{s}_{i:02d}.png" for i, s in enumerate(slugs)]


def plot_run(run: RunRecord, name: str, out: Path) -> list[str]:
    """Writes the figure of the run's per-role panels (two per row) to `out / name`; returns notes on missing
    metrics."""
    rows = (len(ROLE_PANELS) + 1) // 2
    fig, notes = _figure(11.0, 3.5 * rows), []
    for k, (_, title, prefix, ylabel) in enumerate(ROLE_PANELS):
        ax = fig.add_subplot(rows, 2, k + 1)
        ax.set(title=title, xlabel="step", ylabel=ylabel)
        series = role_series(run.rows, prefix)
        if not series:
            ax.text(0.5, 0.5, f"no {prefix}* metrics", ha="center", va="center", transform=ax.transAxes)
            notes.append(f"{run.label}: no {prefix}<role> metrics recorded ({title.lower()} skipped)")
            continue
        for role, (xs, ys) in series.items():
            ax.plot(xs, ys, marker=".", label=role)
        _decorate(ax)
        ax.legend(fontsize="small")
    fig.suptitle(run.label)
    fig.savefig(out / name)
    return notes


def _decorate(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.grid(alpha=0.3)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)[:60] or "run"


def _summary_row(run: RunRecord) -> str:
    xs, ys = eval_curve(run.rows)
    steps = sum("time/step_s" in r for r in run.rows)
    if ys:
        peak = max(range(len(ys)), key=ys.__getitem__)
        acc = f"{ys[peak]:.3f} @ {xs[peak]}", f"{ys[-1]:.3f} @ {xs[-1]}"
    else:
        acc = ("–", "–")
    cells = (run.label, _shown(run.path), str(steps), *acc)
    return "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"


def _shown(path: Path) -> str:
    """A run dir as the page shows it: relative to the working directory when under it (a committed report
    then names its runs as the repository does), else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def write_html(runs: list[RunRecord], figures: list[str], notes: list[str], out: Path) -> Path:
    e = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>marl-train report</title>",
             "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 10px;text-align:left}"
             "img{max-width:100%}</style></head><body><h1>marl-train report</h1>",
             "<table><tr><th>run · workflow · sharing</th><th>dir</th><th>steps</th><th>peak accuracy</th>"
             "<th>final accuracy</th></tr>", *(_summary_row(r) for r in runs), "</table>",
             "<h2>Held-out accuracy</h2><img src='accuracy.png' alt='held-out accuracy'>"]
    for run, fig in zip(runs, figures, strict=True):
        parts.append(f"<h2>{e(run.label)}</h2><img src='{e(fig)}' alt='{e(run.label)}'>")
    if notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    parts.append("</body></html>\n")
    index = out / "index.html"
    index.write_text("\n".join(parts))
    return index


def report(paths: list[Path], out: Path) -> Path:
    """Writes the plots and index.html for every run at or under `paths`; returns the index path."""
    runs = [load_run(p) for p in find_runs(paths)]
    if not runs:
        raise FileNotFoundError(
            f"no run dirs (folders with metrics.jsonl) at or under {', '.join(map(str, paths))}"
        )
    out.mkdir(parents=True, exist_ok=True)
    notes = [f"{r.label}: {n}" for r in runs for n in r.notes]
    notes += plot_accuracy(runs, out)
    figures = figure_names(runs)
    for run, name in zip(runs, figures, strict=True):
        notes += plot_run(run, name, out)
    return write_html(runs, figures, notes, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.report", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run dirs, or folders (sweeps) holding run dirs")
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNGs and index.html")
    args = parser.parse_args(argv)
    try:
        index = report(args.paths, args.out)
    except FileNotFoundError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    print(f"wrote {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
