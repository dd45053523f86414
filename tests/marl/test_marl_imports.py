"""marl is pure Python: importing all of it pulls in no Ray, torch, vLLM or DeepSpeed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["marl.episode", "marl.rewards", "marl.tasks", "marl.tasks.data", "marl.workflows"]
FORBIDDEN = ["ray", "torch", "vllm", "deepspeed", "math_verify", "reasoning_gym", "pyarrow"]


def test_marl_imports_stay_light():
    code = (
        f"import sys\nfor m in {MODULES!r}: __import__(m)\n"
        f"print(','.join(m for m in {FORBIDDEN!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""
