"""Output guards (marl/guards.py): how exact the learner's replay is, what it and the engine's masks cost.

    .venv/bin/python -m benchmarks.guards [--model builtin:smollm2-135m-instruct] [--rows 16] [--budget 64]
        [--temperature 0.7] [--rounds 3]

One HF engine and one in-process Learner (fp32, the model settings of jobs/configs/tiny.yaml, one optimizer
step over every row) on the same weights. `rows` evaluator-style requests are sampled twice per round, with
and without eval_opt's built-in evaluator guard (its free-text budget set to `budget` characters); the two
alternate, so load on the shared machine hits both alike. Prints:
- generation tokens/s with and without the guard (median over rounds), with the seconds a batch took, the
  response lengths and how full the batches were;
- the engine–learner log-prob gap (mean and max |learner − engine| per token) on the guarded rows and on the
  unguarded rows of one batch, and the first mini-batch's PPO ratio under `algo.old_logprobs=rollout`
  (exp(learner − engine) before any step: max |ratio − 1|); then the same guarded rows with the replay off;
- the replay's cost on a batch of the guarded rows alone: the replay by itself (matcher over the tokens, its
  cache cleared) and the update with the replay on and off (median over rounds), as a share of the update.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from jobs.config import load_config
from jobs.models.resolve import resolve_model
from learners.batch import TrainBatch, build_batches
from learners.learner import Learner
from learners.update.losses import local_normalizer
from learners.update.ppo_plan import UpdatePlan
from marl.guard_grammar import grammar_text
from marl.guards import Guard
from marl.policy_map import PolicyMap
from marl.types import Completion, Episode, Task, Turn
from marl.workflows import eval_opt
from marl.workflows.common import WorkflowOptions
from rollout.engine import Sampling
from rollout.hf_engine import HFEngine
from tests.builders import learner_spec

QUESTIONS = ["2 + 3 = 5", "7 * 6 = 41", "12 - 5 = 7", "9 / 3 = 4", "15 + 27 = 42", "8 * 8 = 64",
             "100 - 1 = 98", "3 ^ 2 = 9"]


def requests(rows: int) -> list[list[dict[str, str]]]:
    ask = "Give feedback, then your verdict as \\boxed{Correct} or \\boxed{Incorrect}."
    return [[{"role": "user", "content": f"Is this right: {QUESTIONS[i % len(QUESTIONS)]}? {ask}"}]
            for i in range(rows)]


def sample(engine: HFEngine, reqs: list, sampling: Sampling) -> tuple[list[Completion], float]:
    """(completions, seconds the batch took)."""
    t0 = time.perf_counter()
    out = engine.generate(reqs, sampling)
    return out, time.perf_counter() - t0


def speed_line(name: str, rounds: list[tuple[list[Completion], float]]) -> str:
    """Tokens/s per round and their median, beside what they depend on: the HF engine decodes a batch until
    its longest row ends, so rows that end early leave idle slots and a batch of equal lengths is fuller."""
    lengths = [len(c.response_ids) for out, _ in rounds for c in out]
    rates = [sum(len(c.response_ids) for c in out) / seconds for out, seconds in rounds]
    longest = [max(len(c.response_ids) for c in out) for out, _ in rounds]
    fill = statistics.fmean(sum(len(c.response_ids) for c in out) / (len(out) * top)
                            for (out, _), top in zip(rounds, longest, strict=True))
    return (f"generation {name}: {statistics.median(rates):.1f} tokens/s (rounds: "
            f"{', '.join(f'{v:.1f}' for v in rates)}); "
            f"{statistics.median(seconds for _, seconds in rounds):.1f} s a batch; "
            f"response tokens mean {statistics.fmean(lengths):.1f}, longest {max(longest)}; "
            f"batch fill {fill:.2f} (tokens / rows x longest)")


def batch_of(completions: list[tuple[str, Completion]], pad: int, guards: dict[str, str]) -> TrainBatch:
    """One batch of (role, completion) rows, one single-turn episode each, advantages ±1."""
    episodes = [Episode(task=Task(f"t{i}", "p", "a"), sample_index=0, workflow="bench",
                        turns=[Turn(role, role, 0, [], c)]) for i, (role, c) in enumerate(completions)]
    advantages = torch.tensor([1.0 if i % 2 else -1.0 for i in range(len(completions))])
    roles = tuple(sorted({role for role, _ in completions}))
    batches, _ = build_batches(episodes, PolicyMap.shared(roles, "p"), advantages, {"p": pad}, guards=guards)
    return batches["p"]


def gaps(learner: Learner, batch: TrainBatch) -> dict[str, tuple[float, float, float]]:
    """role -> (mean, max |learner − engine| per token, max |exp(learner − engine) − 1|)."""
    with torch.no_grad():
        lp = learner.passes.policy_logprobs(batch)
    mask, diff = batch.loss_mask[:, 1:], lp - batch.rollout_logprobs[:, 1:]
    out = {}
    for role in sorted(set(batch.roles)):
        rows = torch.tensor([r == role for r in batch.roles])
        d = diff[rows][mask[rows]].double()
        out[role] = (d.abs().mean().item(), d.abs().max().item(), (d.exp() - 1).abs().max().item())
    return out


def cost(learner: Learner, batch: TrainBatch, rounds: int) -> dict[str, float]:
    """Median seconds: the replay alone, the update with the replay on and off (the replay's cache cleared
    before each so every pass that replays pays for it)."""
    plan = UpdatePlan.whole(len(batch), local_normalizer(batch.loss_mask[:, 1:], "token_mean"))
    times: dict[str, list[float]] = {"replay": [], "update_on": [], "update_off": []}
    replay = learner.passes

    def clear() -> None:
        if replay._replay is not None:
            replay._replay._rows.clear()

    for _ in range(rounds + 1):  # the first round warms up (tokenizer, compiled grammar)
        for name in times:
            clear()
            replay.replay_guards = name != "update_off"
            t0 = time.perf_counter()
            replay.guard_masks(batch) if name == "replay" else learner.update(batch, plan)
            times[name].append(time.perf_counter() - t0)
    replay.replay_guards = True
    return {name: statistics.median(t[1:]) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--budget", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    path = resolve_model(args.model)
    own = eval_opt.guards(WorkflowOptions())["evaluator"]
    guard = Guard(own.kind, own.text, args.budget, own.format_chars)
    text, cap = grammar_text(guard), args.budget + guard.longest() + 1
    engine, reqs = HFEngine(path, policy_id="p"), requests(args.rows)
    speed: dict[str, list[tuple[list[Completion], float]]] = {"free": [], "guarded": []}
    for r in range(args.rounds):
        speed["free"].append(sample(engine, reqs, Sampling(args.temperature, max_new_tokens=cap, seed=r)))
        speed["guarded"].append(sample(engine, reqs, Sampling(args.temperature, max_new_tokens=cap, seed=r,
                                                              guard=text)))
    for name, rounds in speed.items():
        print(speed_line(name, rounds))
    free, held = speed["free"][-1][0], speed["guarded"][-1][0]
    cfg = load_config("jobs/configs/tiny.yaml", ["learner.ranks=0", "model.dtype=float32", "algo.kl_coef=0.0",
                                                 f"learner.torch_threads={torch.get_num_threads()}"])
    learner = Learner(learner_spec(cfg, path, temperature=args.temperature, total_steps=100))
    pad = engine.pad_id
    mixed = batch_of([("evaluator", c) for c in held] + [("generator", c) for c in free], pad,
                     {"evaluator": text})
    for role, (mean, top, ratio) in gaps(learner, mixed).items():
        print(f"gap {role} ({'guarded' if role == 'evaluator' else 'unguarded'}): mean {mean:.2e}, max "
              f"{top:.2e}; first mini-batch max |ratio - 1| {ratio:.2e}")
    learner.passes.replay_guards = False
    mean, top, ratio = gaps(learner, mixed)["evaluator"]
    print(f"gap evaluator, replay off: mean {mean:.2e}, max {top:.2e}; max |ratio - 1| {ratio:.2e}")
    learner.passes.replay_guards = True
    guarded = batch_of([("evaluator", c) for c in held], pad, {"evaluator": text})
    tokens = int(guarded.loss_mask[:, 1:].sum())
    t = cost(learner, guarded, args.rounds)
    print(f"guarded rows: {len(guarded)} rows, {tokens} response tokens; replay {t['replay']:.3f} s "
          f"({1e3 * t['replay'] / tokens:.2f} ms/token); update on {t['update_on']:.2f} s, off "
          f"{t['update_off']:.2f} s; replay / update {t['replay'] / t['update_on']:.1%}, "
          f"(on - off) / on {(t['update_on'] - t['update_off']) / t['update_on']:.1%}")


if __name__ == "__main__":
    main()
