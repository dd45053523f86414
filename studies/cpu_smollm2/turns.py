"""What a run's turns say, step by step:
`python -m studies.cpu_smollm2.turns <run dir> [--role R] [--steps A-B] [--match REGEX]`.

Reads the run's training rollouts (`rollouts/step_*.parquet`, which the driver writes and this study does
not commit) and prints, per step and per role and round: the turns, those cut at the token cap, their
mean length in tokens, how many distinct texts they hold, how many give a right answer by the run's own
extractor and scorer, and, with `--match`, how many match a regular expression (searched from the start
of the text). A line per step adds its episodes, those with reward, each role's parse failures and its
most common text. The README's claims about what the roles wrote (section 5) come from this table, so a
rerun of the sweep can check them.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from jobs.config import load_config
from marl.tasks import TaskFamily, get_family
from marl.types import Completion, Episode
from rollout.storage import read_episodes


@dataclass(frozen=True)
class TurnCounts:
    """One step's turns of one role in one round."""

    step: int
    role: str
    round: int
    turns: int
    cut: int  # finish_reason "length": stopped by the token cap
    tokens: float  # mean response length
    distinct: int  # distinct response texts
    right: int  # the turn's own answer, extracted and scored as the run scores final answers
    matched: int | None  # turns matching --match (None without one)


@dataclass(frozen=True)
class StepCounts:
    step: int
    episodes: int
    rewarded: int  # episodes with reward > 0
    parse_failures: dict[str, int]  # role -> turns whose output its workflow could not parse
    top: dict[str, tuple[str, int]]  # role -> its most common text and how many turns wrote it
    texts: dict[str, tuple[int, int]]  # role -> (its turns, distinct texts among them), every round together


def turn_counts(step: int, episodes: list[Episode], family: TaskFamily,
                pattern: re.Pattern[str] | None = None) -> list[TurnCounts]:
    """Per (role, round) counts of one step's turns, in order of first appearance."""
    groups: dict[tuple[str, int], list[tuple[Episode, Completion]]] = {}
    for ep in episodes:
        for t in ep.turns:
            groups.setdefault((t.role, t.round), []).append((ep, t.completion))
    out = []
    for (role, rnd), turns in groups.items():
        texts = [c.text for _, c in turns]
        out.append(TurnCounts(
            step, role, rnd, len(turns), sum(c.finish_reason == "length" for _, c in turns),
            sum(len(c.response_ids) for _, c in turns) / len(turns), len(set(texts)),
            sum(family.score(ep.task, family.extract_answer(c.text)) > 0 for ep, c in turns),
            None if pattern is None else sum(bool(pattern.match(text)) for text in texts)))
    return out


def step_counts(step: int, episodes: list[Episode]) -> StepCounts:
    failures: Counter[str] = Counter()
    texts: dict[str, Counter[str]] = {}
    for ep in episodes:
        failures.update(ep.parse_failures)
        for t in ep.turns:
            texts.setdefault(t.role, Counter())[t.completion.text] += 1
    return StepCounts(step, len(episodes), sum(ep.reward > 0 for ep in episodes), dict(failures),
                      {role: c.most_common(1)[0] for role, c in texts.items()},
                      {role: (c.total(), len(c)) for role, c in texts.items()})


def parse_steps(spec: str | None) -> tuple[int, int]:
    """"A-B" (inclusive), "A" or None (every step) as a (first, last) range."""
    if not spec:
        return 0, sys.maxsize
    first, _, last = spec.partition("-")
    try:
        return int(first), int(last) if last else int(first)
    except ValueError:
        raise ValueError(f"--steps: expected A or A-B (step numbers), got {spec!r}") from None


def _short(text: str, width: int = 60) -> str:
    flat = text.replace("\n", "⏎")
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def format_step(counts: list[TurnCounts], step: StepCounts, role: str | None) -> list[str]:
    lines = [f"step {step.step}: {step.rewarded}/{step.episodes} episodes rewarded"
             + "".join(f"; {r} parse failures {n}" for r, n in sorted(step.parse_failures.items())
                       if role in (None, r))]
    for c in counts:
        if role not in (None, c.role):
            continue
        matched = "" if c.matched is None else f" matched {c.matched:>3}"
        lines.append(f"  {c.role:<13} round {c.round}  turns {c.turns:>3}  cut {c.cut:>3}  "
                     f"tokens {c.tokens:5.1f}  distinct {c.distinct:>3}  right {c.right:>3}{matched}")
    for r, (text, n) in step.top.items():
        if role in (None, r):
            turns, distinct = step.texts[r]
            lines.append(
                f"  {r:<13} {distinct} distinct in {turns} turns; most common ({n}x): {_short(text)!r}"
            )
    return lines


def family_of(run_dir: Path) -> TaskFamily:
    """The run's own task family and answer fallback, from its config.yaml."""
    cfg = load_config(str(run_dir / "config.yaml"))
    return get_family(cfg.data.task, cfg.data.answer_fallback)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m studies.cpu_smollm2.turns", description=__doc__.splitlines()[0]
    )
    parser.add_argument("run_dir", type=Path, help="a run folder holding config.yaml and rollouts/")
    parser.add_argument("--role", help="only this role's lines")
    parser.add_argument("--steps", help="A-B (inclusive) or A; every step without")
    parser.add_argument("--match", help="also count turns matching this regular expression (from the start)")
    args = parser.parse_args(argv)
    try:
        first, last = parse_steps(args.steps)
        pattern = re.compile(args.match) if args.match else None
    except (ValueError, re.error) as e:
        print(f"turns: {e}", file=sys.stderr)
        return 2
    files = sorted((args.run_dir / "rollouts").glob("step_*.parquet"))
    if not files or not (args.run_dir / "config.yaml").exists():
        print(f"turns: {args.run_dir} has no config.yaml or no rollouts/step_*.parquet", file=sys.stderr)
        return 2
    family = family_of(args.run_dir)
    for path in files:
        step = int(path.stem.removeprefix("step_"))
        if first <= step <= last:
            episodes = read_episodes(path)
            print(
                "\n".join(
                    format_step(
                        turn_counts(step, episodes, family, pattern), step_counts(step, episodes), args.role
                    )
                )
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
