"""`python -m jobs.prepare_data`: the paper's DAPO-Math-17k and DeepCoder splits from local
files in the layouts the public datasets use, written as Parquet the loaders read; sizes,
determinism, disjointness, drops."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.prepare_data import DAPO_PREFIX, DAPO_SUFFIX, main, prepare, source_files
from marl.tasks.data import load_tasks
from marl.tasks.overlap import normalise_prompt, shared_tasks

# 21 usable problems in the processed layout, then one repeat (other capitals and spacing), one row without an
# answer and one without a problem.
PROCESSED = [
    *({"prompt": f"What is {i} squared?", "solution": str(i * i), "data_source": "math_dapo",
       "reward_model": {"ground_truth": str(i * i), "style": "rule-lighteval/MATH_v2"}} for i in range(21)),
    {"prompt": "WHAT is 3   squared?", "solution": "9"},
    {"prompt": "What is the answer?", "solution": None},
    {"prompt": "", "solution": "1"},
]


def _original(i: int) -> dict:
    """A row of the original layout: chat messages with DAPO's instructions, the answer in reward_model."""
    content = f"{DAPO_PREFIX}\n\nHow many sides has a polygon number {i}?\n\n{DAPO_SUFFIX}"
    return {"data_source": "math_dapo", "prompt": [{"content": content, "role": "user"}], "ability": "MATH",
            "reward_model": {"ground_truth": str(i + 3), "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": f"id-{i}"}}


def _hf_folder(root, config, rows, split="train"):
    """A folder as `huggingface-cli download` leaves it: <config>/<split>-00000-of-00001.parquet."""
    (root / config).mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), root / config / f"{split}-00000-of-00001.parquet")
    return root


def _table(path):
    return pq.read_table(path).to_pylist()


def test_math_processed_layout_splits_90_10_like_datasets(tmp_path, capsys):
    src = _hf_folder(tmp_path / "dapo", "en", PROCESSED)
    assert main(["math", "--src", str(src / "en"), "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "read 24 rows" in out and "kept 21, dropped 3 (duplicate_prompt: 1, missing_answer: 1, " \
                                     "missing_prompt: 1)" in out
    train, test = (
        _table(tmp_path / "a/dapo_math_17k_train.parquet"),
        _table(tmp_path / "a/dapo_math_17k_test.parquet"),
    )
    # test = ceil(0.1 * 21), as train_test_split(test_size=0.1) takes
    assert (len(train), len(test)) == (18, 3)
    # np.random.default_rng(42).permutation(21) = [16, 10, 15, 20, 12, ...]: datasets' test split is its head.
    assert [r["id"] for r in test] == ["dapo_math_17k:16", "dapo_math_17k:10", "dapo_math_17k:15"]
    assert test[0] == {"id": "dapo_math_17k:16", "prompt": "What is 16 squared?", "answer": "256"}
    ids = {r["id"] for r in train} | {r["id"] for r in test}
    assert len(ids) == 21 and not {normalise_prompt(r["prompt"]) for r in train} & {
        normalise_prompt(r["prompt"]) for r in test}
    # Seed 42 again gives the very same files; another seed another split.
    prepare("math", src / "en", tmp_path / "b")
    assert _table(tmp_path / "b/dapo_math_17k_test.parquet") == test
    prepare("math", src / "en", tmp_path / "c", seed=7)
    assert _table(tmp_path / "c/dapo_math_17k_test.parquet") != test


def test_math_original_layout_strips_the_instructions_and_repeats(tmp_path):
    rows = [_original(i % 12) for i in range(60)]  # every problem five times, as in the original release
    path = tmp_path / "dapo.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    result = prepare("math", path, tmp_path / "out")
    assert (result["read"], result["kept"], result["dropped"]) == (60, 12, {"duplicate_prompt": 48})
    assert (result["train"], result["test"]) == (10, 2)
    rows = _table(tmp_path / "out/dapo_math_17k_train.parquet") + _table(
        tmp_path / "out/dapo_math_17k_test.parquet"
    )
    assert {r["prompt"] for r in rows} == {f"How many sides has a polygon number {i}?" for i in range(12)}
    assert all(r["answer"] == str(int(r["prompt"].split()[-1].rstrip("?")) + 3) for r in rows)


def test_written_math_splits_load_and_share_no_prompt(tmp_path):
    prepare("math", _hf_folder(tmp_path / "dapo", "en", PROCESSED), tmp_path / "out")
    train = load_tasks(str(tmp_path / "out/dapo_math_17k_train.parquet"), None, 0)
    test = load_tasks(str(tmp_path / "out/dapo_math_17k_test.parquet"), None, 0)
    assert (len(train), len(test)) == (18, 3) and not shared_tasks(train, test)


def _deepcoder(i: int, tests) -> dict:
    return {"problem": f"Print the sum of two integers, case {i}.", "tests": json.dumps(tests),
            "solutions": json.dumps(["print(sum(map(int, input().split())))"]), "source": "primeintellect"}


STDIO = [
    {"type": "stdin_stdout", "input": "2 3\n", "output": "5\n"},
    {"type": "stdin_stdout", "input": "1 1\n", "output": "2\n"},
]


def test_code_drops_problems_without_usable_tests_and_takes_the_test_split_first(tmp_path, capsys):
    rows = [_deepcoder(i, STDIO) for i in range(8)] + [
        _deepcoder(8, []),  # no tests
        _deepcoder(9, [{"type": "function_call", "fn_name": "f", "input": [1], "output": [2]}]),  # call-based
        {**_deepcoder(10, STDIO), "tests": "{not json"},
        {**_deepcoder(0, STDIO), "problem": "print the SUM of two integers,  case 0."},  # a repeat
    ]
    src = _hf_folder(tmp_path / "deepcoder", "primeintellect", rows)
    argv = ["code", "--src", str(src), "--out", str(tmp_path / "out"), "--test-size", "3"]
    assert main(argv) == 0
    assert (
        "kept 8, dropped 4 (bad_tests: 1, duplicate_prompt: 1, missing_tests: 1, unsupported_tests: 1)"
        in capsys.readouterr().out
    )
    train, test = (
        _table(tmp_path / "out/deepcoder_train.parquet"),
        _table(tmp_path / "out/deepcoder_test.parquet"),
    )
    # np.random.default_rng(42).permutation(8) = [3, 4, 2, 7, 6, 1, 5, 0]:
    # shuffle(seed=42), the first 3 the test.
    assert [r["id"] for r in test] == ["deepcoder:3", "deepcoder:4", "deepcoder:2"]
    assert [r["id"] for r in train] == [
        "deepcoder:7",
        "deepcoder:6",
        "deepcoder:1",
        "deepcoder:5",
        "deepcoder:0",
    ]
    assert set(test[0]) == {"id", "prompt", "tests"}
    tasks = load_tasks(str(tmp_path / "out/deepcoder_test.parquet"), None, 0, kind="code")
    assert [t.task_id for t in tasks] == ["deepcoder:3", "deepcoder:4", "deepcoder:2"]
    assert tasks[0].meta["cases"] == [
        {"input": "2 3\n", "output": "5\n"},
        {"input": "1 1\n", "output": "2\n"},
    ]
    assert tasks[0].prompt.startswith("Print the sum of two integers, case 3.")
    assert main(argv[:3] + ["--out", str(tmp_path / "again"), "--test-size", "3"]) == 0
    assert _table(tmp_path / "again/deepcoder_train.parquet") == train


def test_source_folders_choose_one_config_and_split(tmp_path, capsys):
    root = _hf_folder(tmp_path / "dapo", "en", PROCESSED[:21])
    _hf_folder(root, "cn", PROCESSED[:5])
    # The paper's config (en) by default; --config names another; a folder without it is an error.
    assert main(["math", "--src", str(root), "--out", str(tmp_path / "out")]) == 0
    assert "read 21 rows" in capsys.readouterr().out
    assert main(["math", "--src", str(root), "--out", str(tmp_path / "out"), "--config", "cn"]) == 0
    assert "read 5 rows" in capsys.readouterr().out
    assert main(["code", "--src", str(root), "--out", str(tmp_path / "out")]) == 3
    assert "several configs (cn, en), not --config primeintellect" in capsys.readouterr().err
    # A folder with train and test shards reads only --split's.
    _hf_folder(root, "en", [{"prompt": "A test problem?", "solution": "1"}], split="test")
    assert prepare("math", root / "en", tmp_path / "out")["read"] == 21
    assert [p.name for p in source_files(root / "en", "test")] == ["test-00000-of-00001.parquet"]
    with pytest.raises(ValueError, match="cannot take a test split of 1 from 1"):  # too small to split
        prepare("math", root / "en", tmp_path / "out", split="test")
    with pytest.raises(ValueError, match="splits test, train, not --split validation"):
        source_files(root / "en", "validation")


def test_save_to_disk_arrow_folder_and_jsonl_file(tmp_path):
    folder = tmp_path / "saved"
    folder.mkdir()
    table = pa.Table.from_pylist(PROCESSED[:21])
    with (
        pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink,
        pa.ipc.new_stream(sink, table.schema) as w,
    ):
        w.write_table(table)
    (folder / "state.json").write_text("{}")
    assert prepare("math", folder, tmp_path / "a")["kept"] == 21
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in PROCESSED[:21]) + "{broken\n")
    result = prepare("math", jsonl, tmp_path / "b")
    assert (result["kept"], result["dropped"]) == (21, {"bad_json": 1})
    assert _table(tmp_path / "a/dapo_math_17k_test.parquet") == _table(
        tmp_path / "b/dapo_math_17k_test.parquet"
    )


def test_bad_sources_exit_3_naming_the_path(tmp_path, capsys):
    assert main(["math", "--src", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")]) == 3
    assert "nowhere does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["code", "--src", str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 3
    assert "holds no .parquet" in capsys.readouterr().err
    assert (
        main(["math", "--src", str(tmp_path), "--out", str(tmp_path / "out"), "--test-fraction", "1.5"]) == 2
    )


def test_over_cap_prompts_are_dropped_after_the_split_and_counted(tmp_path, capsys):
    src = _hf_folder(tmp_path / "dapo", "en", PROCESSED)
    whole = prepare("math", src / "en", tmp_path / "all")
    # A counter of characters: 'What is 16 squared?' is 19, 'What is 9 squared?' 18; a cap of 18 drops 10..20,
    # 8 of train's 18 problems and all of test's 3 (16, 10, 15).
    capped = prepare("math", src / "en", tmp_path / "cap", count=len, max_prompt_tokens=18)
    assert capped["over_cap"] == {"train": 8, "test": 3} and (capped["train"], capped["test"]) == (10, 0)
    for name in ("train", "test"):
        kept = _table(tmp_path / f"cap/dapo_math_17k_{name}.parquet")
        # the same split, less
        assert kept == [r for r in _table(whole["paths"][name]) if len(r["prompt"]) <= 18]
    assert whole["over_cap"] == {"train": 0, "test": 0}
    assert main(["math", "--src", str(src), "--out", str(tmp_path / "x"), "--max-prompt-tokens", "9"]) == 2
    assert "go together" in capsys.readouterr().err


@pytest.mark.slow
def test_the_cap_counts_the_model_s_chat_template_tokens(tmp_path, capsys):
    from jobs.models.resolve import resolve_model

    src = _hf_folder(tmp_path / "dapo", "en", PROCESSED)
    args = [
        "math",
        "--src",
        str(src),
        "--out",
        str(tmp_path / "o"),
        "--tokenizer",
        resolve_model("builtin:tiny"),
    ]
    assert main([*args, "--max-prompt-tokens", "1000"]) == 0
    assert "over the prompt cap: 0 train, 0 test" in capsys.readouterr().out
    assert main([*args, "--max-prompt-tokens", "5"]) == 0  # the template alone is longer
    assert "over the prompt cap: 18 train, 3 test" in capsys.readouterr().out
