"""Every seed of a run, derived in one place from a base seed and what the seed is for.

Seeds made by adding small offsets collide: with `run seed * C + step` per step and `+ i` per request, request
i of step t + 1 got the sampling seed of request i + 1 of step t, so consecutive steps replayed each other's
draws shifted by one request. A hash of all the parts gives unrelated seeds to unrelated draws, at every level
(step, role batch, engine chunk, request, PPO shuffle). A streamed turn's seed is derived from what the turn
is (step, episode, agent, the agent's turn), never from when it reaches an engine, so a run repeats itself
whatever order its requests arrive in.
"""

from __future__ import annotations

import hashlib

SEED_BITS = 31  # every consumer takes it: vLLM's per-request seed, torch.manual_seed, random.Random


def derive_seed(base: int, *parts: int | str) -> int:
    """A seed in [0, 2**31) for `parts` (ints and strings: what the draw is, e.g. "rollout", step) under
    `base`; the same in every process, run and Python version (no salted `hash`)."""
    key = repr((int(base), *parts)).encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << SEED_BITS) - 1)
