"""The learner's replay of the output guards (marl/guards.py): the allowed-token mask at every loss position
of a micro-batch's guarded rows, rebuilt by running the role's grammar matcher over the row's sampled tokens
(marl.guard_grammar.TokenMasks, the masks both engines sampled under).

Why a replay and not masks shipped in the TrainBatch: a mask is ceil(V / 32) int32 words per position (6 KiB
at V = 49,152, 19 KiB at Qwen3's 151,936), so one 256-token guarded turn would add 1.5-5 MiB to the batch; the
replay ships the role's grammar text alone and costs xgrammar's matcher ~0.3 ms a token on the learner's CPU.
Each row's masks are kept (by grammar and tokens) for the passes of one update that see the row again (the
behaviour policy's, every optimizer step's, the reference's).

The masks cross into the LM head as `LossMasks`: the packed words of the guarded positions only ([G, words])
and, per loss position, its row in them; the head expands one chunk's worth to [C, V] bool at a time, so no
[rows, length, vocabulary] tensor is built.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from marl.guard_grammar import TokenMasks, merged_eos

# Enough rows for the passes of one update of a few hundred guarded turns; older ones are replayed again.
_CACHE_ROWS = 4096
_BITS = torch.arange(32, dtype=torch.int32)


@dataclass(frozen=True)
class LossMasks:
    """Allowed tokens at a micro-batch's N loss positions (loss_mask[:, 1:] row by row): `index` [N] long, the
    position's row in `bits` or -1 (unconstrained); `bits` [G, ceil(V / 32)] int32 (xgrammar's bitmask)."""

    index: Tensor
    bits: Tensor
    vocab_size: int

    def chunk(self, start: int, end: int) -> Tensor | None:
        """Allowed [end − start, V] bool of positions start..end−1 (on the bits' device), None when none of
        them is guarded."""
        idx = self.index[start:end]
        if not bool((idx >= 0).any()):
            return None
        words = self.bits[idx.clamp(min=0)]
        words[idx < 0] = -1
        bits = _BITS.to(words.device)
        flat = ((words[:, :, None] >> bits) & 1).bool().reshape(len(idx), -1)
        return flat[:, :self.vocab_size]

    def to(self, device: torch.device | str) -> LossMasks:
        return LossMasks(self.index.to(device), self.bits.to(device), self.vocab_size)


def stop_ids(model_path: str, tokenizer: Any) -> list[int]:
    """The end tokens a turn stops on, as the vLLM engine reads them (marl.guard_grammar.merged_eos of the
    folder's generation config and the tokenizer)."""
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json
        eos = None
    return merged_eos(eos, tokenizer.eos_token_id)


class GuardReplay:
    """The replay of one policy's guarded rows: its tokenizer's TokenMasks (built on first use), the masks
    of the rows seen lately."""

    def __init__(self, model_path: str, vocab_size: int):
        self.model_path, self.vocab_size = model_path, vocab_size
        self._masks: TokenMasks | None = None
        self._rows: OrderedDict[tuple[str, tuple[int, ...]], np.ndarray] = OrderedDict()

    def token_masks(self) -> TokenMasks:
        if self._masks is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            self._masks = TokenMasks(tokenizer, self.vocab_size, stop_ids(self.model_path, tokenizer))
        return self._masks

    def row(self, grammar: str, tokens: list[int]) -> np.ndarray:
        """The mask before each response token [len(tokens), words] int32 (kept for the next passes)."""
        key = (grammar, tuple(tokens))
        if key in self._rows:
            self._rows.move_to_end(key)
            return self._rows[key]
        bits = self.token_masks().replay(grammar, tokens)
        self._rows[key] = bits
        if len(self._rows) > _CACHE_ROWS:
            self._rows.popitem(last=False)
        return bits

    def loss_masks(self, input_ids: Tensor, loss_mask: Tensor, roles: list[str],
                   guards: dict[str, str]) -> LossMasks | None:
        """The masks of the loss positions of rows whose role is guarded (`guards`: role -> grammar text), or
        None when no row is. input_ids, loss_mask [B, T]."""
        targets = loss_mask[:, 1:].cpu()
        if not guards or not any(r in guards for r in roles):
            return None
        ids = input_ids[:, 1:].cpu()
        counts = targets.sum(-1).tolist()
        index = torch.full((int(targets.sum()),), -1, dtype=torch.long)
        parts, start, used = [], 0, 0
        for r, (role, n) in enumerate(zip(roles, counts, strict=True)):
            if role in guards and n:
                parts.append(torch.from_numpy(self.row(guards[role], ids[r][targets[r]].tolist())))
                index[start:start + n] = torch.arange(used, used + n)
                used += n
            start += n
        if not parts:
            return None
        return LossMasks(index, torch.cat(parts), self.vocab_size)
