"""Per-role rollout metrics from scored episodes, as flat dicts with stable keys."""

from __future__ import annotations

from collections import defaultdict

from marl.tasks.base import AsyncScoring, TaskFamily
from marl.types import Episode
from marl.workflows.common import parse_verdict


def episode_metrics(episodes: list[Episode], roles: list[str]) -> dict[str, float]:
    """reward/mean, reward/mean/<role>, response_len/mean/<role>, rollout/parse_failures/<role>,
    rollout/truncated/<role> (fraction of turns cut by max tokens), rollout/failures (episodes),
    rollout/tokens and rollout/tokens/<role> (generated tokens, the numerator of throughput)."""
    out: dict[str, float] = {
        "reward/mean": sum(e.reward for e in episodes) / max(len(episodes), 1),
        "rollout/episodes": float(len(episodes)),
        "rollout/failures": float(sum(e.failure is not None for e in episodes)),
    }
    rewards, lengths, truncated = defaultdict(list), defaultdict(list), defaultdict(list)
    for ep in episodes:
        for t in ep.turns:
            rewards[t.role].append(t.reward)
            lengths[t.role].append(len(t.completion.response_ids))
            truncated[t.role].append(float(t.completion.finish_reason == "length"))
    for role in roles:
        n = max(len(rewards[role]), 1)
        out[f"reward/mean/{role}"] = sum(rewards[role]) / n
        out[f"response_len/mean/{role}"] = sum(lengths[role]) / n
        out[f"rollout/truncated/{role}"] = sum(truncated[role]) / n
        out[f"rollout/parse_failures/{role}"] = float(sum(e.parse_failures.get(role, 0) for e in episodes))
        out[f"rollout/tokens/{role}"] = float(sum(lengths[role]))
    out["rollout/tokens"] = float(sum(sum(v) for v in lengths.values()))
    if any(e.task.kind == "code" for e in episodes):
        out.update(code_metrics(episodes, roles))
    return out


# metric name → the score_info reasons it counts (marl.tasks.code / marl.tasks.sandbox REASONS).
CODE_PER_ROLE = {"timeouts": ("timeout",), "crashes": ("crash",), "oom": ("oom",),
                 "no_code_block": ("no_code_block",)}
CODE_TOTALS = {**CODE_PER_ROLE, "syntax_errors": ("syntax_error",), "output_limits": ("output_limit",),
               "sandbox_errors": ("error",)}


def code_metrics(episodes: list[Episode], roles: list[str]) -> dict[str, float]:
    """Episode counts by how their code answer ended: code/<name> over all episodes, and code/<name>/<role>
    for the four CODE_PER_ROLE names, by the role that wrote the final answer (score_info 'answer_role';
    0 for roles that never answer). Present only when a step holds code tasks,
    so math runs keep their keys."""
    out: dict[str, float] = {}
    reasons = [(e.score_info.get("reason"), e.score_info.get("answer_role")) for e in episodes]
    for name, counted in CODE_TOTALS.items():
        out[f"code/{name}"] = float(sum(reason in counted for reason, _ in reasons))
    for name, counted in CODE_PER_ROLE.items():
        for role in roles:
            out[f"code/{name}/{role}"] = float(sum(r in counted and who == role for r, who in reasons))
    return out


# The roles that decide among other roles' answers: decider -> the role whose answers it decides among.
DECIDERS = {"aggregator": "generator", "synthesizer": "worker"}


def majority_accuracy(answers: list[str | None], right: list[bool]) -> float:
    """The expected score of a majority vote over `answers` ([K] extracted answers, None where none could be
    extracted: it casts no vote; `right` [K] whether each scores 1), ties broken uniformly at random: the
    share of right answers among the most frequent ones. 0 when no answer votes."""
    counts: dict[str, int] = {}
    for a in answers:
        if a is not None:
            counts[a] = counts.get(a, 0) + 1
    if not counts:
        return 0.0
    top = max(counts.values())
    tied = {a for a, c in counts.items() if c == top}
    return sum(r for a, r in zip(answers, right, strict=True) if a in tied) / (top * len(tied))


def decision_baselines(candidates: list[bool], answers: list[str | None],
                       shown: list[int] | None) -> dict[str, float]:
    """What a decider scores without deciding, on one episode with a right candidate: `random` (a uniform
    pick among the K candidates: right/K), `majority` (majority_accuracy), `always_first` (the first
    candidate shown: `shown[0]` when the workflow shuffled them, else candidate 0)."""
    first = shown[0] if shown else 0
    return {"random": sum(candidates) / len(candidates), "majority": majority_accuracy(answers, candidates),
            "always_first": float(candidates[first])}


def decider_metrics(episodes: list[Episode], family: TaskFamily, decider: str, over: str) -> dict[str, float]:
    """`choice/{available,accuracy,random,majority,always_first}/<decider>` over the episodes in which some
    `over` turn's answer scores 1 (choice_metrics); {} when no episode has both roles."""
    sums = {"accuracy": 0.0, "random": 0.0, "majority": 0.0, "always_first": 0.0}
    available, seen = 0, False
    for ep in episodes:
        candidates = [t for t in ep.turns if t.role == over]
        if not candidates or not any(t.role == decider for t in ep.turns):
            continue
        seen = True
        answers = [family.extract_answer(t.text) for t in candidates]
        right = [family.score(ep.task, a) == 1.0 for a in answers]
        if any(right):
            available += 1
            sums["accuracy"] += ep.reward == 1.0
            for name, value in decision_baselines(right, answers, ep.score_info.get("shown")).items():
                sums[name] += value
    if not seen:
        return {}
    return {f"choice/available/{decider}": float(available),
            **{f"choice/{name}/{decider}": total / available if available else float("nan")
               for name, total in sums.items()}}


def choice_metrics(episodes: list[Episode], family: TaskFamily) -> dict[str, float]:
    """The deciding roles (DECIDERS: voting's aggregator, orch_workers' synthesizer) against chance.
    `choice/first/aggregator`: the fraction of episodes recording a choice (score_info 'choice') where it
    chose the first response shown (a position preference, whichever generator wrote it). Per decider `<d>`:
    `choice/available/<d>`, the episodes in which at least one candidate's answer scores 1;
    `choice/accuracy/<d>`, the fraction of those whose final answer (the episode's reward) scores 1; and
    beside it, over the same episodes, what `choice/{random,majority,always_first}/<d>` would have scored
    (decision_baselines): a decider that beats none of them does not decide. NaN without available
    episodes. Accuracy only for families scored inline (math): scoring every candidate of a code task would
    run the sandbox K more times."""
    chosen = [ep.score_info["choice"] for ep in episodes if "choice" in ep.score_info]
    out = {"choice/first/aggregator": sum(c == 1 for c in chosen) / len(chosen)} if chosen else {}
    if isinstance(family, AsyncScoring):
        return out
    for decider, over in DECIDERS.items():
        out.update(decider_metrics(episodes, family, decider, over))
    return out


def verdict_metrics(episodes: list[Episode], family: TaskFamily) -> dict[str, float]:
    """eval_opt's evaluator as a judge: each evaluator turn's verdict (marl.workflows.common.parse_verdict;
    unparsable = Incorrect, as the workflow reads it) against the true grade of the generator answer just
    before it. `verdict/judged/evaluator` (verdicts), `verdict/accuracy/evaluator` (verdicts that match the
    grade), `verdict/correct_share/evaluator` (judged answers that are right) and `verdict/majority/evaluator`
    (a judge that always gives the more common grade: the chance baseline). Families scored inline only; {}
    when no episode has an evaluator."""
    if isinstance(family, AsyncScoring):
        return {}
    pairs = []
    for ep in episodes:
        answer = None
        for t in ep.turns:
            if t.role == "generator":
                answer = t.text
            elif t.role == "evaluator" and answer is not None:
                grade = family.score(ep.task, family.extract_answer(answer)) == 1.0
                pairs.append((bool(parse_verdict(t.text)), grade))
    if not pairs:
        return {}
    share = sum(g for _, g in pairs) / len(pairs)
    return {"verdict/judged/evaluator": float(len(pairs)),
            "verdict/accuracy/evaluator": sum(v == g for v, g in pairs) / len(pairs),
            "verdict/correct_share/evaluator": share, "verdict/majority/evaluator": max(share, 1 - share)}
