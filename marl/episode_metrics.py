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


def choice_metrics(episodes: list[Episode], family: TaskFamily) -> dict[str, float]:
    """voting's aggregator as a chooser: `choice/first/aggregator`, the fraction of episodes recording a
    choice (score_info 'choice') where it chose the first response shown (a position preference, whichever
    generator wrote it); `choice/available/aggregator`, the episodes in which at least one generator's answer
    scores 1, and `choice/accuracy/aggregator`, the fraction of those whose chosen answer (the episode's
    reward) scores 1 (NaN without any). Accuracy only for families scored inline (math): scoring every
    candidate of a code task would run the sandbox K more times. Beside the accuracy, its chance baselines on
    the same episodes: `choice/always_first/aggregator` (the first response shown scores 1) and
    `choice/random/aggregator` (the expected accuracy of a uniform pick: the share of candidates scoring 1).
    {} when no episode has an aggregator over generators."""
    chosen = [ep.score_info["choice"] for ep in episodes if "choice" in ep.score_info]
    first = {"choice/first/aggregator": sum(c == 1 for c in chosen) / len(chosen)} if chosen else {}
    if isinstance(family, AsyncScoring):
        return first
    available, right, first_right, random_right = 0, 0, 0, 0.0
    for ep in episodes:
        candidates = [t for t in ep.turns if t.role == "generator"]
        if not candidates or not any(t.role == "aggregator" for t in ep.turns):
            continue
        scores = [family.score(ep.task, family.extract_answer(t.text)) == 1.0 for t in candidates]
        if any(scores):
            available += 1
            right += ep.reward == 1.0
            first_right += scores[ep.score_info.get("shown", [0])[0]]
            random_right += sum(scores) / len(scores)
    if not available and not any(t.role == "aggregator" for ep in episodes for t in ep.turns):
        return first
    share = (lambda n: n / available) if available else (lambda n: float("nan"))
    return {**first, "choice/available/aggregator": float(available),
            "choice/accuracy/aggregator": share(right), "choice/always_first/aggregator": share(first_right),
            "choice/random/aggregator": share(random_right)}


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
