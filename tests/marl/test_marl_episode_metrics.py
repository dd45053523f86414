"""marl.episode_metrics.episode_metrics on hand-built episodes."""

from __future__ import annotations

from marl.episode_metrics import episode_metrics
from marl.types import Completion, Episode, Task, Turn


def _turn(role: str, n_tokens: int, reward: float, finish: str = "stop") -> Turn:
    completion = Completion(
        "x" * n_tokens, [1, 2], list(range(n_tokens)), [0.0] * n_tokens, finish_reason=finish
    )
    return Turn(role, role + "0", 0, [], completion, reward=reward)


def test_per_role_means_and_token_counts():
    task = Task("t", "1+1?", "2")
    eps = [
        Episode(task, 0, "voting", [_turn("generator", 3, 1.0), _turn("generator", 5, 1.0, "length"),
                                    _turn("aggregator", 2, 1.0)], reward=1.0),
        Episode(task, 1, "voting", [_turn("generator", 4, 0.0), _turn("aggregator", 6, 0.0)], reward=0.0,
                parse_failures={"aggregator": 1}),
    ]
    m = episode_metrics(eps, ["generator", "aggregator"])
    assert m["reward/mean"] == 0.5 and m["rollout/episodes"] == 2.0
    assert m["reward/mean/generator"] == 2 / 3 and m["reward/mean/aggregator"] == 0.5
    assert m["response_len/mean/generator"] == 4.0 and m["response_len/mean/aggregator"] == 4.0
    assert m["rollout/truncated/generator"] == 1 / 3 and m["rollout/truncated/aggregator"] == 0.0
    assert m["rollout/parse_failures/aggregator"] == 1.0 and m["rollout/parse_failures/generator"] == 0.0
    assert m["rollout/tokens/generator"] == 12.0 and m["rollout/tokens/aggregator"] == 8.0
    assert m["rollout/tokens"] == 20.0
