"""Every seed of a run, derived in one place from the run's seed and what it is for.

Seeds made by adding small offsets (seed + step, + request index, + batch index) collide: request i of step
t + 1 would get the seed of request i + 1 of step t, and consecutive steps would sample the same responses
shifted by one agent. A hash of all the parts gives unrelated seeds for unrelated draws; callers may still add
a small index (a request's position) to a derived seed.
"""

from __future__ import annotations

import hashlib

# Below 2**31, leaving room for the small indices callers add (vLLM takes 32-bit-safe seeds).
_SPAN = 2**31 - 2**20


def derive_seed(*parts: object) -> int:
    """A seed in [0, 2**31 - 2**20) from `parts` (ints and strings), the same in every process and run."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % _SPAN
