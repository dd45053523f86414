"""Which roles share an optimizer step: the per-mini-batch role shares of one synthetic voting step, with the
rows in the episodes' order and in verl's length-balanced order (paper_base.yaml), side by side.

    .venv/bin/python -m benchmarks.minibatch_roles [--episodes 512] [--mini 512] [--ranks 2] [--seed 0]

Workload: `episodes` voting episodes (64 prompts x 8 samples in the paper), each three generator turns on one
problem prompt (100-400 tokens) with responses of 200-5,120 tokens, and one aggregator turn whose prompt
holds the problem and the three answers (a 5-200 token verdict), so the aggregator's rows are the longest. A
GRPO advantage sign per episode (the final reward is broadcast to every turn). The orders and mini-batches
come from the functions a run uses (learners.update.balance.balanced_order,
learners.update.ppo_plan.plan_update), on lengths alone. Ways, each under the shared policy (all 2,048 rows
one policy) and the isolated generator policy (1,536 rows):
- given, even: the episodes' order, ceil(B / M) even chunks in order (the project before verl_balanced);
- given, shuffled: the project's default (a seeded shuffle per step);
- verl: balanced over `ranks` ranks, fixed chunks of M / W rows per rank (minibatch_order=verl_balanced,
  minibatch_chunks=fixed, minibatch_ranks=W).
Prints per mini-batch: rows, the aggregator's share, the mean row length and the share of positive advantages.
Pure arithmetic on lengths, so the box's load does not matter.
"""

from __future__ import annotations

import argparse
import random

import torch

from learners.update.balance import balanced_order
from learners.update.ppo_plan import Cut, plan_update


def voting_rows(episodes: int, seed: int) -> tuple[list[str], list[int], list[bool]]:
    """(role, length, advantage > 0) of every turn, episodes in order, turns [generator x 3, aggregator]."""
    rng = random.Random(seed)
    roles, lengths, positive = [], [], []
    for _ in range(episodes):
        prompt, sign = rng.randint(100, 400), rng.random() < 0.5
        answers = [rng.randint(200, 5120) for _ in range(3)]
        roles += ["generator"] * 3 + ["aggregator"]
        lengths += [prompt + a for a in answers] + [prompt + sum(answers) + 60 + rng.randint(5, 200)]
        positive += [sign] * 4
    return roles, lengths, positive


def mini_batches(rows: int, mini: int, shuffle: bool, cut: Cut, seed: int) -> list[list[int]]:
    """The global rows (positions in the given order) of each optimizer step on one learner rank."""
    mask = torch.ones(rows, 1, dtype=torch.bool)
    (got,), (plan,) = plan_update(mask, torch.ones(rows, dtype=torch.bool), 1, mini, 1, "seq_mean_token_mean",
                                  seed, None, shuffle=shuffle, cut=cut)
    return [[got[i] for i in step] for step in plan.steps]


def report(
    name: str, steps: list[list[int]], roles: list[str], lengths: list[int], positive: list[bool]
) -> None:
    cells = []
    for step in steps:
        agg = sum(roles[i] == "aggregator" for i in step) / max(len(step), 1)
        mean = sum(lengths[i] for i in step) / max(len(step), 1)
        pos = sum(positive[i] for i in step) / max(len(step), 1)
        cells.append(f"{len(step):>4} {agg:>5.2f} {mean:>7.0f} {pos:>5.2f}")
    print(f"  {name:<18}" + " | ".join(cells))


def compare(title: str, rows: list[int], roles: list[str], lengths: list[int], positive: list[bool],
            args: argparse.Namespace) -> None:
    """Each way's mini-batches of the policy holding `rows` (indices into the step's
    turns, in the given order)."""
    print(f"\n{title}: {len(rows)} rows, M {args.mini}; per mini-batch: rows, aggregator share, mean length, "
          f"positive share")
    pick = [roles[i] for i in rows], [lengths[i] for i in rows], [positive[i] for i in rows]
    report("given, even", mini_batches(len(rows), args.mini, False, Cut(), args.seed), *pick)
    report("given, shuffled", mini_batches(len(rows), args.mini, True, Cut(), args.seed), *pick)
    # verl's order is of the whole step's batch; a policy keeps its own rows in that order.
    order = balanced_order(lengths, args.ranks)
    mine = set(rows)
    ordered = [i for i in order if i in mine]
    steps = mini_batches(len(ordered), args.mini, False, Cut(args.ranks, fixed=True, nominal=True), args.seed)
    report("verl balanced", [[ordered[i] for i in s] for s in steps], roles, lengths, positive)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=512)
    p.add_argument("--mini", type=int, default=512)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    roles, lengths, positive = voting_rows(args.episodes, args.seed)
    compare("shared policy (voting, all roles)", list(range(len(roles))), roles, lengths, positive, args)
    generators = [i for i, r in enumerate(roles) if r == "generator"]
    compare("isolated generator policy", generators, roles, lengths, positive, args)


if __name__ == "__main__":
    main()
