#!/usr/bin/env bash
# Installs everything, then trains the quickstart job on an embedded local Ray cluster (CPU).
# Extra arguments are config overrides (key.path=value).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
export MARL_CACHE="${MARL_CACHE:-$PWD/.cache/marl}"
exec .venv/bin/python -m jobs.train --config jobs/configs/quickstart.yaml "$@"
