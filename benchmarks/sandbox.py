"""Sandboxed executions per second on HumanEval's canonical solutions: the pool against one-at-a-time, and
the cost of one execution against a bare interpreter start, medians and ratios side by side in one run.

    .venv/bin/python benchmarks/sandbox.py [--workers 2] [--tasks 164] [--bare 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from marl.tasks.code import program_for
from marl.tasks.data import load_tasks
from marl.tasks.sandbox import SandboxLimits, SandboxPool, run


def bare_starts(flags: list[str], n: int) -> list[float]:
    """Wall seconds of `python <flags> -c pass`, n times."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        subprocess.run([sys.executable, *flags, "-c", "pass"], check=True)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=164)
    parser.add_argument("--bare", type=int, default=30, help="bare interpreter starts to time")
    args = parser.parse_args()
    tasks = load_tasks("humaneval", args.tasks, 0, "code")
    programs = [program_for(t, t.answer) for t in tasks]
    limits = SandboxLimits()

    bare = bare_starts([], args.bare)
    bare_isolated = bare_starts(["-I", "-B", "-S"], args.bare)  # the sandbox child's interpreter flags
    start = time.perf_counter()
    sequential = [run(p, limits) for p in programs]
    sequential_s = time.perf_counter() - start
    with SandboxPool(limits, args.workers) as pool:
        start = time.perf_counter()
        pooled = pool.run_all(programs)
        pooled_s = time.perf_counter() - start

    report(args.workers, bare, bare_isolated, sequential, sequential_s, pooled, pooled_s)


def report(workers: int, bare: list[float], bare_isolated: list[float], sequential: list, sequential_s: float,
           pooled: list, pooled_s: float) -> None:
    n = len(sequential)
    median_exec = statistics.median(r.wall_s for r in sequential)
    median_bare, median_bare_iso = statistics.median(bare), statistics.median(bare_isolated)
    rows = [
        ("python -c pass", 1 / median_bare, median_bare),
        ("python -I -B -S -c pass", 1 / median_bare_iso, median_bare_iso),
        ("sandbox, sequential", n / sequential_s, median_exec),
        (f"sandbox, pool of {workers}", n / pooled_s, statistics.median(r.wall_s for r in pooled)),
    ]
    print(
        f"HumanEval canonical solutions: {n} programs, passed {sum(r.passed for r in sequential)} sequential "
        "/ "
        f"{sum(r.passed for r in pooled)} pooled; {os.cpu_count()} CPUs; isolation "
        f"network={sequential[0].network_isolation} user={sequential[0].user_isolation}"
    )
    print(f"{'':28s}{'executions/s':>14s}{'median wall ms':>16s}")
    for name, rate, median in rows:
        print(f"{name:28s}{rate:14.1f}{median * 1000:16.1f}")
    print(f"pool / sequential throughput:              {sequential_s / pooled_s:.2f}x")
    print(f"sandbox execution / bare python -c pass:   {median_exec / median_bare:.2f}x "
          f"({(median_exec - median_bare) * 1000:+.1f} ms)")
    print(f"sandbox execution / python -I -B -S:       {median_exec / median_bare_iso:.2f}x "
          f"({(median_exec - median_bare_iso) * 1000:+.1f} ms); median child start-up to confined "
          f"{statistics.median(r.startup_s for r in sequential) * 1000:.1f} ms")

if __name__ == "__main__":
    main()
