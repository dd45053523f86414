"""Per-task eval records: rows appended per evaluation, read back with a re-evaluation's rows winning, and the
evaluation's accuracy and per-role parse failures."""

from __future__ import annotations

import math

from jobs.driver.eval_records import append_eval, eval_metrics, read_eval
from marl.types import Episode, Task


def episode(task_id: str, reward: float, **failures: int) -> Episode:
    return Episode(task=Task(task_id, "1+1", "2"), sample_index=0, workflow="voting", reward=reward,
                   parse_failures=dict(failures))


def test_rows_appended_and_read_back_last_wins(tmp_path):
    append_eval(tmp_path, 0, [episode("a", 0.0), episode("b", 1.0)])
    append_eval(tmp_path, 10, [episode("a", 1.0), episode("b", 1.0)])
    append_eval(tmp_path, 10, [episode("a", 0.0)])  # a resumed run evaluates step 10 again
    append_eval(tmp_path, 20, [])
    assert (tmp_path / "eval_tasks.csv").read_text().splitlines()[0] == "steps_done,task_id,reward"
    assert read_eval(tmp_path) == {0: {"a": 0.0, "b": 1.0}, 10: {"a": 0.0, "b": 1.0}}
    assert read_eval(tmp_path / "none") == {}


def test_eval_metrics_by_hand():
    m = eval_metrics([episode("a", 1.0, aggregator=1), episode("b", 0.0, aggregator=1, generator=2),
                      episode("c", 0.0)])
    assert m == {"eval/accuracy": 1 / 3, "eval/episodes": 3.0, "eval/parse_failures/aggregator": 2.0,
                 "eval/parse_failures/generator": 2.0}
    assert math.isnan(eval_metrics([])["eval/accuracy"])
