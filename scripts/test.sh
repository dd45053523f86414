#!/usr/bin/env bash
# The test command: installs what is missing (no-op when up to date), then runs the fast tier (plain
# `pytest`) and the slow tier (`-m "slow and not gpu"`: minutes-long end-to-end runs).
# Extra arguments go to one pytest run instead (e.g. `scripts/test.sh tests/learners -m slow`).
# Each tier ends by listing its 15 slowest tests, so the CI budget's spending stays visible.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
export MARL_CACHE="${MARL_CACHE:-$PWD/.cache/marl}"
if [ $# -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
.venv/bin/python -m pytest --durations=15
exec .venv/bin/python -m pytest -m "slow and not gpu" --durations=15
