"""`python -m jobs.prepare_data {math,code} --src PATH --out DIR`: the data splits of the paper "When Does
Multi-Agent RL Improve LLM Workflows?" as Parquet files the training config points at.

- math: DAPO-Math-17k → `<out>/dapo_math_17k_{train,test}.parquet` (`id`, `prompt`, `answer`), a 90/10 split
  with seed 42. Reads the processed layout (open-r1/DAPO-Math-17k-Processed: `prompt` text, `solution` the
  answer) and the original one (BytedTsinghua-SIA: `prompt` chat messages with DAPO's "Answer:" instructions,
  which are stripped, the answer in `reward_model.ground_truth`, every problem repeated many times).
- code: DeepCoder's primeintellect subset → `<out>/deepcoder_{train,test}.parquet` (`id`, `prompt`, `tests`: a
  JSON list of stdin/stdout cases, the DeepCoder layout marl/tasks/code_data.py reads). Problems whose tests the
  sandbox cannot run (none, unparsable, call-based) are dropped; of the rest, shuffled with seed 42, the first
  1,000 are the test split.

Both drop unusable rows and repeated problems (same normalised prompt text, so train and test are disjoint),
print the counts by reason, and split as HF `datasets` does (`train_test_split(test_size=0.1, seed=42)`,
`shuffle(seed=42)`: one numpy `default_rng(seed)` permutation whose head is the test split), so a source
with nothing dropped splits exactly as it would there.

--src: a .parquet / .arrow / .jsonl / .json file, or a folder as `huggingface-cli download` or `save_to_disk`
leaves it (every *.parquet under it, else *.arrow, else *.jsonl; of a folder with split-named files only the
`--split` ones). A folder holding several configs (all/, cn/, en/) must be narrowed to one. Never downloads.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from marl.tasks.code_data import code_row_to_task, problem_text
from marl.tasks.data import read_rows, row_problem
from marl.tasks.overlap import normalise_prompt

NAMES = {"math": "dapo_math_17k", "code": "deepcoder"}
COLUMNS = {"math": ("id", "prompt", "answer"), "code": ("id", "prompt", "tests")}
SPLITS = ("train", "test", "validation", "valid", "dev")
SHARD = re.compile(r"^(?P<split>[A-Za-z]+)-\d+-of-\d+$")  # HF shard names: train-00000-of-00003
DAPO_PREFIX = ("Solve the following math problem step by step. The last line of your response should be of the form "
               "Answer: $Answer (without quotes) where $Answer is the answer to the problem.")
DAPO_SUFFIX = 'Remember to put your answer on its own line after "Answer:".'
EXIT_USAGE, EXIT_DATA = 2, 3

Example = tuple[str, str, str]  # (id, prompt, answer or tests JSON)


def split_of(path: Path, src: Path) -> str | None:
    """The split a file of an HF folder belongs to (its shard-name prefix or a folder name), if any."""
    match = SHARD.match(path.name.split(".")[0])
    if match and match["split"] in SPLITS:
        return match["split"]
    return next((p for p in path.relative_to(src).parts[:-1] if p in SPLITS), None)


def source_files(src: Path, split: str) -> list[Path]:
    """The data files of `src` (a file, or a folder's files of one config and split), sorted."""
    if src.is_file():
        return [src]
    if not src.is_dir():
        raise ValueError(f"--src {src} does not exist")
    for suffix in (".parquet", ".arrow", ".jsonl"):
        files = sorted(p for p in src.rglob(f"*{suffix}")
                       if not any(part.startswith(".") for part in p.relative_to(src).parts)
                       and not p.name.startswith("cache-"))  # hidden download metadata, datasets' own caches
        if files:
            break
    else:
        raise ValueError(f"--src {src} holds no .parquet, .arrow or .jsonl files")
    found = {s for s in (split_of(p, src) for p in files) if s is not None}
    if found:
        files = [p for p in files if split_of(p, src) == split]
        if not files:
            raise ValueError(f"--src {src} has the splits {', '.join(sorted(found))}, not --split {split}")
    configs = {p.relative_to(src).parts[0] for p in files if len(p.relative_to(src).parts) > 1
               and p.relative_to(src).parts[0] not in (*SPLITS, "data")}
    if len(configs) > 1:
        raise ValueError(f"--src {src} holds several configs ({', '.join(sorted(configs))}): point --src at one")
    return files


def iter_rows(files: list[Path]) -> Iterator[object]:
    """Every row of `files` in order, a record batch at a time (DeepCoder's tests run to gigabytes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for path in files:
        if path.suffix == ".parquet":
            for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
                yield from batch.to_pylist()
        elif path.suffix == ".arrow":  # save_to_disk writes the Arrow stream format
            with pa.memory_map(str(path)) as f:
                try:
                    reader = pa.ipc.open_stream(f)
                except pa.ArrowInvalid:
                    reader = pa.ipc.open_file(f)
                yield from reader.read_all().to_pylist()
        else:
            yield from read_rows(path)


def _cell(value: Any) -> str:
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return str(value)
    return ""


def math_example(row: dict[str, Any]) -> tuple[str, str] | str:
    """(problem, answer) of a DAPO row in either layout, or the reason it is unusable."""
    prompt = problem_text(row).removeprefix(DAPO_PREFIX).removesuffix(DAPO_SUFFIX).strip()
    if not prompt:
        return "missing_prompt"
    reward = row.get("reward_model")
    truth = reward.get("ground_truth") if isinstance(reward, dict) else None
    answer = _cell(row.get("answer")) or _cell(truth) or _cell(row.get("solution"))
    return (prompt, answer) if answer else "missing_answer"


def code_example(row: dict[str, Any]) -> tuple[str, str] | str:
    """(problem, tests as JSON [{input, output}]) of a DeepCoder row, or why the sandbox cannot grade it."""
    task = code_row_to_task(row, 0, "row", "prepare_data")
    if isinstance(task, str):
        return task
    if task.meta["style"] != "stdio":
        return "not_stdio"
    return problem_text(row), json.dumps(task.meta["cases"])


CONVERT: dict[str, Callable[[dict[str, Any]], tuple[str, str] | str]] = {"math": math_example, "code": code_example}


def collect(rows: Iterator[object], kind: str) -> tuple[list[Example], Counter[str], int]:
    """The usable, first-seen examples (id = source row index), the dropped rows by reason, and the rows read."""
    kept: list[Example] = []
    dropped: Counter[str] = Counter()
    seen: set[str] = set()
    index = -1
    for index, row in enumerate(rows):
        result = row_problem(row) or CONVERT[kind](row)  # type: ignore[arg-type]  # a dict once row_problem passes
        if isinstance(result, str):
            dropped[result] += 1
            continue
        key = normalise_prompt(result[0])
        if key in seen:
            dropped["duplicate_prompt"] += 1
            continue
        seen.add(key)
        kept.append((f"{NAMES[kind]}:{index}", *result))
    return kept, dropped, index + 1


def hf_split(n: int, n_test: int, seed: int) -> tuple[list[int], list[int]]:
    """(train, test) positions as HF `datasets` draws them: one numpy `default_rng(seed)` permutation of n,
    its first n_test the test split and the rest train, both in permutation order."""
    import numpy as np

    if not 0 < n_test < n:
        raise ValueError(f"cannot take a test split of {n_test} from {n} usable rows")
    order = np.random.default_rng(seed).permutation(n).tolist()
    return order[n_test:], order[:n_test]


def write_split(path: Path, examples: list[Example], columns: tuple[str, ...]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({c: [e[i] for e in examples] for i, c in enumerate(columns)}), path)


def prepare(kind: str, src: Path, out: Path, seed: int = 42, test_fraction: float = 0.1, test_size: int = 1000,
            split: str = "train") -> dict[str, Any]:
    """Read, filter, split and write one dataset; returns the counts and the paths written."""
    files = source_files(src, split)
    kept, dropped, read = collect(iter_rows(files), kind)
    n_test = math.ceil(test_fraction * len(kept)) if kind == "math" else test_size  # ceil: as train_test_split
    train_at, test_at = hf_split(len(kept), n_test, seed)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / f"{NAMES[kind]}_{name}.parquet" for name in ("train", "test")}
    for name, positions in (("train", train_at), ("test", test_at)):
        write_split(paths[name], [kept[i] for i in positions], COLUMNS[kind])
    return {"files": len(files), "read": read, "kept": len(kept), "dropped": dict(dropped),
            "train": len(train_at), "test": len(test_at), "paths": paths}


def report(kind: str, src: Path, r: dict[str, Any]) -> str:
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(r["dropped"].items()))
    return (f"{kind}: read {r['read']} rows from {r['files']} file(s) under {src}\n"
            f"  kept {r['kept']}, dropped {sum(r['dropped'].values())}{f' ({reasons})' if reasons else ''}\n"
            f"  train {r['train']} -> {r['paths']['train']}\n  test  {r['test']} -> {r['paths']['test']}")


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 written, 2 usage error, 3 the source cannot be read or split."""
    parser = argparse.ArgumentParser(prog="python -m jobs.prepare_data", description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=sorted(NAMES), help="math: DAPO-Math-17k; code: DeepCoder primeintellect")
    parser.add_argument("--src", type=Path, required=True, help="a data file or a downloaded dataset folder")
    parser.add_argument("--out", type=Path, required=True, help="folder for the train and test Parquet files")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--test-fraction", type=float, default=0.1, help="math: share of the test split")
    parser.add_argument("--test-size", type=int, default=1000, help="code: problems in the test split")
    parser.add_argument("--split", default="train", help="the source split to read from a folder with several")
    args = parser.parse_args(argv)
    if not 0 < args.test_fraction < 1:
        print(f"--test-fraction must be in (0, 1); got {args.test_fraction}", file=sys.stderr)
        return EXIT_USAGE
    try:
        result = prepare(args.kind, args.src, args.out, args.seed, args.test_fraction, args.test_size, args.split)
    except (ValueError, OSError) as e:
        print(f"prepare_data {args.kind}: {e}", file=sys.stderr)
        return EXIT_DATA
    print(report(args.kind, args.src, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
