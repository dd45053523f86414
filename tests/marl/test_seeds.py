"""derive_seed: stable, in range, and no overlap between the request seeds of consecutive steps."""

import subprocess
import sys

from marl.seeds import derive_seed


def test_stable_across_processes_and_in_range():
    here = derive_seed(0, "rollout", 3)
    there = subprocess.run([sys.executable, "-c", "from marl.seeds import derive_seed; "
                            "print(derive_seed(0, 'rollout', 3))"], capture_output=True, text=True, check=True)
    assert int(there.stdout) == here and 0 <= here < 2**31 - 2**20


def test_consecutive_steps_and_roles_draw_unrelated_request_seeds():
    # Requests add their index to the step's seed: step t+1 must not replay step t shifted by one request.
    for step in range(50):
        a = {derive_seed(derive_seed(0, "rollout", step), "generator", 0) + i for i in range(512)}
        b = {derive_seed(derive_seed(0, "rollout", step + 1), "generator", 0) + i for i in range(512)}
        c = {derive_seed(derive_seed(0, "rollout", step), "aggregator", 0) + i for i in range(512)}
        assert not a & b and not a & c
    assert derive_seed(0, "eval") != derive_seed(1, "eval")
