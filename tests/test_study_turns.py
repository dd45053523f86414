"""`python -m studies.cpu_smollm2.turns`: per step, role and round, the counts the study's README cites from a
run's rollouts, computed with the run's own extractor, from files the driver's writer wrote."""

from __future__ import annotations

from pathlib import Path

from jobs.config import load_config, to_yaml
from marl.types import Completion, Episode, Task, Turn
from rollout.storage import write_episodes
from studies.cpu_smollm2.turns import main


def _turn(role: str, round_: int, text: str, cut: bool = False) -> Turn:
    ids = list(range(len(text.split())))
    return Turn(
        role,
        role,
        round_,
        [],
        Completion(text, [1], ids, [0.0] * len(ids), "length" if cut else "stop", 1, role),
        0.0,
    )


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    cfg = load_config("jobs/configs/tiny.yaml", ["data.task=math", "data.answer_fallback=last_number"])
    (run / "config.yaml").write_text(to_yaml(cfg))
    task = Task("t", "State the final answer: 7 - 4 =", "3")
    right = Episode(task, 0, "eval_opt", turns=[
        _turn("generator", 0, "7 - 4 = 3"), _turn("evaluator", 0, "Correct answer: Correct", cut=True),
        _turn("generator", 1, "7 - 4 = 3")], final_answer="3", reward=1.0, parse_failures={"evaluator": 1})
    echo = Episode(task, 1, "eval_opt", turns=[
        _turn("generator", 0, "7 - 4 ="), _turn("evaluator", 0, "Correct answer: Correct", cut=True),
        _turn("generator", 1, "7 - 4 =\n7 - 4 =", cut=True)], final_answer="4", reward=0.0,
        parse_failures={"evaluator": 1})
    write_episodes([right, echo], step=3, path=run / "rollouts" / "step_000003.parquet")
    write_episodes([echo], step=4, path=run / "rollouts" / "step_000004.parquet")
    return run


def test_counts_per_role_and_round_with_the_runs_extractor(tmp_path, capsys):
    run = _run(tmp_path)
    assert main([str(run), "--steps", "3", "--match", r"\d+ - \d+ =\s*($|\n)"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "step 3: 1/2 episodes rewarded; evaluator parse failures 2"
    # "7 - 4 =" is read as 4 by the last-number fallback: wrong; the echo matches the
    # pattern, the answer does not.
    gen0 = next(x for x in lines if "generator     round 0" in x).split()
    assert gen0[gen0.index("turns") + 1] == "2" and gen0[gen0.index("cut") + 1] == "0"
    assert gen0[gen0.index("right") + 1] == "1" and gen0[gen0.index("matched") + 1] == "1"
    assert gen0[gen0.index("distinct") + 1] == "2"
    ev0 = next(x for x in lines if "evaluator     round 0" in x).split()
    assert ev0[ev0.index("cut") + 1] == "2" and ev0[ev0.index("distinct") + 1] == "1"
    gen1 = next(x for x in lines if "generator     round 1" in x).split()
    assert gen1[gen1.index("cut") + 1] == "1" and gen1[gen1.index("tokens") + 1] == "6.5"  # (5 + 8) / 2 words
    assert "  evaluator     1 distinct in 2 turns; most common (2x): 'Correct answer: Correct'" in lines
    assert "  generator     3 distinct in 4 turns; most common (2x): '7 - 4 = 3'" in lines
    assert not any(line.startswith("step 4") for line in lines)


def test_a_role_filter_and_every_step_by_default(tmp_path, capsys):
    run = _run(tmp_path)
    assert main([str(run), "--role", "generator"]) == 0
    out = capsys.readouterr().out
    assert "step 3:" in out and "step 4: 0/1 episodes rewarded" in out
    assert "evaluator" not in out and "matched" not in out


def test_bad_arguments_and_a_run_without_rollouts_are_named(tmp_path, capsys):
    assert main([str(tmp_path), "--steps", "x-3"]) == 2
    assert "--steps" in capsys.readouterr().err
    assert main([str(_run(tmp_path)), "--match", "("]) == 2
    assert "turns:" in capsys.readouterr().err
    assert main([str(tmp_path / "nothing")]) == 2
    assert "no config.yaml or no rollouts" in capsys.readouterr().err
