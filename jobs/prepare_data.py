"""`python -m jobs.prepare_data {math,code} --src PATH --out DIR`: the data splits of the paper "When Does
Multi-Agent RL Improve LLM Workflows?" as Parquet files the training config points at.

- math: DAPO-Math-17k → `<out>/dapo_math_17k_{train,test}.parquet` (`id`, `prompt`, `answer`), a 90/10 split
  with seed 42. Reads the processed layout (open-r1/DAPO-Math-17k-Processed: `prompt` text, `solution` the
  answer) and the original one (BytedTsinghua-SIA: `prompt` chat messages with DAPO's "Answer:" instructions,
  which are stripped, the answer in `reward_model.ground_truth`, every problem repeated many times).
- code: DeepCoder's primeintellect subset → `<out>/deepcoder_{train,test}.parquet` (`id`, `prompt`, `tests`: a
  JSON list of stdin/stdout cases, the DeepCoder layout marl/tasks/code_data.py reads). Problems whose tests
  the sandbox cannot run (none, unparsable, call-based) are dropped; of the rest, shuffled with seed 42, the
  first 1,000 are the test split.

Both drop unusable rows and repeated problems (same normalised prompt text, so train and test are disjoint),
print the counts by reason, and split as HF `datasets` does (`train_test_split(test_size=0.1, seed=42)`,
`shuffle(seed=42)`: one numpy `default_rng(seed)` permutation whose head is the test split), so a source
with nothing dropped splits exactly as it would there.

--src: a .parquet / .arrow / .jsonl / .json file, or a folder as `huggingface-cli download` or `save_to_disk`
leaves it (every *.parquet under it, else *.arrow, else *.jsonl; of a folder with split-named files only the
`--split` ones). Of a folder holding configs (all/, cn/, en/) only `--config`'s are read: the paper's, `en`
for math and `primeintellect` for code, by default. Never downloads.

--tokenizer M --max-prompt-tokens N: after the split, drop every problem whose prompt (one user turn of M's
chat template) is over N tokens, as the paper's stack filters over-long prompts before training, and print how
many each split lost. Without them nothing is measured.
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
from marl.tasks.overlap import normalise_prompt
from marl.tasks.rows import read_rows, row_problem
from marl.types import JsonRecord

NAMES = {"math": "dapo_math_17k", "code": "deepcoder"}
# the paper's config of each source (DAPO-Math-17k: ~14.1k en)
CONFIGS = {"math": "en", "code": "primeintellect"}
COLUMNS = {"math": ("id", "prompt", "answer"), "code": ("id", "prompt", "tests")}
SPLITS = ("train", "test", "validation", "valid", "dev")
SHARD = re.compile(r"^(?P<split>[A-Za-z]+)-\d+-of-\d+$")  # HF shard names: train-00000-of-00003
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem."
)
DAPO_SUFFIX = 'Remember to put your answer on its own line after "Answer:".'
EXIT_USAGE, EXIT_DATA = 2, 3

Example = tuple[str, str, str]  # (id, prompt, answer or tests JSON)


def split_of(path: Path, src: Path) -> str | None:
    """The split a file of an HF folder belongs to (its shard-name prefix or a folder name), if any."""
    match = SHARD.match(path.name.split(".")[0])
    if match and match["split"] in SPLITS:
        return match["split"]
    return next((p for p in path.relative_to(src).parts[:-1] if p in SPLITS), None)


def source_files(src: Path, split: str, config: str = "") -> list[Path]:
    """The data files of `src` (a file, or a folder's files of one config and split), sorted. A folder of
    several configs is narrowed to `config`."""
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
    return _of_config(files, src, config)


def _of_config(files: list[Path], src: Path, config: str) -> list[Path]:
    """`files` of the config folder `config`, when `src` holds config folders; all of them when it holds one
    config or none."""
    def config_of(p: Path) -> str | None:
        parts = p.relative_to(src).parts
        return parts[0] if len(parts) > 1 and parts[0] not in (*SPLITS, "data") else None

    configs = {c for c in map(config_of, files) if c is not None}
    if config and config in configs:
        return [p for p in files if config_of(p) == config]
    if len(configs) > 1:
        raise ValueError(f"--src {src} holds several configs ({', '.join(sorted(configs))}), not --config "
                         f"{config or '(none)'}: name one")
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


CONVERT: dict[str, Callable[[dict[str, Any]], tuple[str, str] | str]] = {
    "math": math_example,
    "code": code_example,
}


def collect(rows: Iterator[object], kind: str) -> tuple[list[Example], Counter[str], int]:
    """The usable, first-seen examples (id = source row index), the dropped rows
    by reason, and the rows read."""
    kept: list[Example] = []
    dropped: Counter[str] = Counter()
    seen: set[str] = set()
    index = -1
    for index, row in enumerate(rows):
        # a dict once row_problem passes
        result = row_problem(row) or CONVERT[kind](row)  # type: ignore[arg-type]
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


TokenCount = Callable[[str], int]  # a prompt's length in the model's tokens


def within_cap(examples: list[Example], count: TokenCount | None, cap: int) -> tuple[list[Example], int]:
    """The examples whose prompt is at most `cap` tokens (all of them without a counter or cap), and how many
    were over it."""
    if count is None or cap <= 0:
        return examples, 0
    kept = [e for e in examples if count(e[1]) <= cap]
    return kept, len(examples) - len(kept)


def prepare(
    kind: str,
    src: Path,
    out: Path,
    seed: int = 42,
    test_fraction: float = 0.1,
    test_size: int = 1000,
    split: str = "train",
    config: str = "",
    count: TokenCount | None = None,
    max_prompt_tokens: int = 0,
) -> JsonRecord:
    """Read, filter, split, drop over-cap prompts (after the split, so the split stays the HF one) and write
    one dataset; returns the counts and the paths written."""
    files = source_files(src, split, config)
    kept, dropped, read = collect(iter_rows(files), kind)
    # ceil: as train_test_split
    n_test = math.ceil(test_fraction * len(kept)) if kind == "math" else test_size
    train_at, test_at = hf_split(len(kept), n_test, seed)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / f"{NAMES[kind]}_{name}.parquet" for name in ("train", "test")}
    sizes, over_cap = {}, {}
    for name, positions in (("train", train_at), ("test", test_at)):
        rows, over_cap[name] = within_cap([kept[i] for i in positions], count, max_prompt_tokens)
        write_split(paths[name], rows, COLUMNS[kind])
        sizes[name] = len(rows)
    return {"files": len(files), "read": read, "kept": len(kept), "dropped": dict(dropped), **sizes,
            "over_cap": over_cap, "paths": paths}


def chat_token_count(tokenizer_path: str) -> TokenCount:
    """A prompt's length as one user turn of the model's chat template (its plain encoding without one)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)

    def count(prompt: str) -> int:
        if tok.chat_template:
            ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False)
            return len(ids)
        return len(tok(prompt)["input_ids"])

    return count


def report(kind: str, src: Path, r: dict[str, Any]) -> str:
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(r["dropped"].items()))
    return (f"{kind}: read {r['read']} rows from {r['files']} file(s) under {src}\n"
            f"  kept {r['kept']}, dropped {sum(r['dropped'].values())}{f' ({reasons})' if reasons else ''}\n"
            f"  over the prompt cap: {r['over_cap']['train']} train, {r['over_cap']['test']} test\n"
            f"  train {r['train']} -> {r['paths']['train']}\n  test  {r['test']} -> {r['paths']['test']}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jobs.prepare_data", description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=sorted(NAMES), help="math: DAPO-Math-17k; code: DeepCoder primeintellect")
    p.add_argument("--src", type=Path, required=True, help="a data file or a downloaded dataset folder")
    p.add_argument("--out", type=Path, required=True, help="folder for the train and test Parquet files")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--test-fraction", type=float, default=0.1, help="math: share of the test split")
    p.add_argument("--test-size", type=int, default=1000, help="code: problems in the test split")
    p.add_argument("--split", default="train", help="the source split to read from a folder with several")
    p.add_argument("--config", help="the config folder to read from a folder with several (default: the "
                   "paper's, en for math, primeintellect for code)")
    p.add_argument(
        "--tokenizer", help="a model folder whose tokenizer measures prompts (with --max-prompt-tokens)"
    )
    p.add_argument(
        "--max-prompt-tokens", type=int, default=0, help="drop prompts longer than this (0 = keep all)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 written, 2 usage error, 3 the source cannot be read or split."""
    args = parser().parse_args(argv)
    if not 0 < args.test_fraction < 1:
        print(f"--test-fraction must be in (0, 1); got {args.test_fraction}", file=sys.stderr)
        return EXIT_USAGE
    if args.max_prompt_tokens < 0 or bool(args.tokenizer) != bool(args.max_prompt_tokens):
        print("--tokenizer and --max-prompt-tokens (> 0) go together", file=sys.stderr)
        return EXIT_USAGE
    try:
        count = chat_token_count(args.tokenizer) if args.tokenizer else None
        result = prepare(
            args.kind,
            args.src,
            args.out,
            args.seed,
            args.test_fraction,
            args.test_size,
            args.split,
            args.config if args.config is not None else CONFIGS[args.kind],
            count,
            args.max_prompt_tokens,
        )
    except (ValueError, OSError) as e:
        print(f"prepare_data {args.kind}: {e}", file=sys.stderr)
        return EXIT_DATA
    print(report(args.kind, args.src, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
