#!/usr/bin/env bash
# The test command: installs what is missing (no-op when up to date), then runs the whole suite.
# Extra arguments go to pytest (e.g. `scripts/test.sh -m "not slow"`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
export MARL_CACHE="${MARL_CACHE:-$PWD/.cache/marl}"
exec .venv/bin/python -m pytest "$@"
