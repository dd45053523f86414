"""Padding-free micro-batches: a micro-batch's rows laid end to end in one row, with position ids restarting
at 0 at each row's first token and no attention mask (`learner.padding_free`).

transformers reads such position ids as packed sequences: flash-attention 2 runs its varlen kernel
over them (`_is_packed_sequence` / `prepare_fa_kwargs_from_position_ids`), and the mask builder of the
other attentions (`find_packed_sequence_indices` in masking_utils) keeps each row's tokens from
attending to another row's (exact, but through an [N, N] mask: only flash-attention saves the memory).
A log-prob never crosses a row boundary: only loss positions are read, and each is taken from the
hidden state of its own row's previous token.

Shapes: B rows, T positions (right-padded), N = Σ row lengths.
"""

from __future__ import annotations

import torch
from torch import Tensor


def pack(input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(ids [1, N], position_ids [1, N], offsets [B]) of right-padded rows: input_ids, attention_mask [B, T].
    offsets[i] is where row i starts in the packed row."""
    lengths = attention_mask.sum(-1)
    positions = (attention_mask.cumsum(-1) - 1)[attention_mask]
    return input_ids[attention_mask][None], positions[None], lengths.cumsum(0) - lengths


def packed_index(loss_mask: Tensor, offsets: Tensor) -> Tensor:
    """The packed positions [K] whose hidden states predict the loss tokens, in the order of
    loss_mask[:, 1:]'s True entries (row by row): shifted position t of row i (predicting
    token t + 1) is offsets[i] + t."""
    rows, t = loss_mask[:, 1:].nonzero(as_tuple=True)
    return offsets[rows] + t


def attention_implementation(padding_free: bool, cuda: bool | None = None,
                             flash_attn: bool | None = None) -> str | None:
    """The attention transformers should load the policy with: flash-attention 2 for packed rows on a GPU,
    None (the model's default) otherwise. `cuda`/`flash_attn`: whether a GPU and the flash_attn package
    are there (detected when None).

    Packed rows on a GPU without flash_attn raise: the default attention would build an [N, N] mask per layer
    (N = the token budget: ~3 GiB a layer in bf16 at 40,960 tokens), which the memory plan
    (learners.compute.memory.mask_entries) does not charge, so the run would fail out of memory far from its
    cause. On CPU the [N, N] mask is planned."""
    import importlib.util

    if not padding_free or not (torch.cuda.is_available() if cuda is None else cuda):
        return None
    if flash_attn is None:
        flash_attn = importlib.util.find_spec("flash_attn") is not None
    if not flash_attn:
        raise RuntimeError(
            "learner.padding_free=true on a GPU needs the flash_attn package (flash-attention 2's "
            "varlen kernel): install it on the learner nodes, or set learner.padding_free=false"
        )
    return "flash_attention_2"
