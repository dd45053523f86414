"""The response tokens' log-probs and entropy through a causal LM's head, without a [B, T, V] tensor.

`sequence_logprobs` runs the model's body once (its decoder, captured by a forward hook while the model itself
is called with no logit kept, so engines' and peft's wrappers still run), keeps the final hidden states of the
loss positions only ([N, H], N = loss tokens) and sends them through the LM head `chunk` positions at a time:
the vocabulary-wide tensors alive at once are O(chunk × V), whatever B × T (learner.logits_chunk_tokens; 0 =
the unchunked path, the model's own [B, T−1−s, V] logits, kept for comparison).

With grad, a window of more than one chunk is not kept for backward; each chunk is recomputed there:
- a plain `nn.Linear` head holding its whole weight: `_ChunkedHead`, a torch.autograd.Function that saves
  (hidden, weight, targets) and forms dlogits = (onehot − softmax)·g/τ in place, dh = dlogits @ W and
  dW = dlogitsᵀ @ h per chunk (one [chunk, V] buffer in backward). A tied head's weight is the embedding
  Parameter itself, so its gradient accumulates into that one Parameter.
- any other head (a LoRA'd head, a ZeRO-3 partition that only exists inside the module's
  forward): the head module per chunk under non-reentrant torch.utils.checkpoint, so its own
  wrappers and hooks run again in backward.
Both recompute one head matmul per chunk. Guarded rows (marl/guards.py) come with `allowed`
(learners.compute.guard_masks.LossMasks): each chunk's disallowed logits are set to the lowest float before
the log-softmax, forward and backward, so log-probs, entropy and their gradient are those of the masked
distribution the engine sampled from (one [chunk, V] bool, expanded when its chunk runs). The temperature
scales the fp32 logits as the engines' sampling did; under autocast the head's matmul runs in the autocast
dtype, as the unchunked path's does.

Shapes: B rows, T positions, H hidden, V vocabulary, N loss tokens of the batch's shifted positions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from learners.compute.guard_masks import LossMasks
from learners.compute.padding_free import pack, packed_index
from learners.update.losses import entropy_from_logits, response_start, token_logprobs


def sequence_logprobs(
    model: Any,
    runner: Any,
    input_ids: Tensor,
    attention_mask: Tensor,
    loss_mask: Tensor,
    *,
    temperature: float,
    chunk: int,
    entropy: bool,
    padding_free: bool = False,
    agree: Callable[[int], int] | None = None,
    allowed: LossMasks | None = None,
) -> tuple[Tensor, Tensor | None]:
    """(log-probs [B, T−1] of input_ids[:, 1:], entropy [B, T−1] or None), 0 where loss_mask[:, 1:]
    is False (chunk = 0: the unchunked path, values there too). `runner` is called (the model, an
    engine around it, or the reference); `model` is the HF module (or peft wrapper) whose decoder and
    head it runs. Entropy is detached.
    padding_free: the rows run end to end in one row (learners.compute.padding_free; needs
    chunk > 0). agree: the global maximum of a count over ranks (head_logprobs; used only for a
    head partitioned across ranks). allowed: the guarded rows' masks of the loss positions (chunk > 0)."""
    if chunk <= 0 and allowed is not None:
        raise ValueError("guarded rows need the chunked head (learner.logits_chunk_tokens > 0)")
    if chunk <= 0:
        return _unchunked(runner, input_ids, attention_mask, loss_mask, temperature, entropy)
    targets_mask = loss_mask[:, 1:]
    if padding_free:
        ids, positions, offsets = pack(input_ids, attention_mask)
        hidden = final_hidden(model, runner, ids, None, positions)[0][packed_index(loss_mask, offsets)]
    else:
        hidden = final_hidden(model, runner, input_ids, attention_mask)[:, :-1][targets_mask]  # [N, H]
    lp, ent = head_logprobs(model.get_output_embeddings(), hidden, input_ids[:, 1:][targets_mask],
                            temperature=temperature, chunk=chunk, entropy=entropy, agree=agree,
                            allowed=allowed)
    return _scatter(lp, targets_mask), None if ent is None else _scatter(ent, targets_mask)


def _scatter(values: Tensor, mask: Tensor) -> Tensor:
    """values [N] into a zero [B, T−1] tensor at mask's True positions (differentiable)."""
    return torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(mask, values)


def final_hidden(model: Any, runner: Any, input_ids: Tensor, attention_mask: Tensor | None,
                 position_ids: Tensor | None = None) -> Tensor:
    """The decoder's last hidden states [B, T, H] (after its final norm), from one call of `runner` that keeps
    no logits (an empty index tensor as `logits_to_keep`), read by a forward hook on `model.get_decoder()`."""
    got: list[Tensor] = []
    handle = model.get_decoder().register_forward_hook(lambda _m, _a, out: got.append(out.last_hidden_state))
    try:
        # No KV cache: nothing decodes after this pass (and transformers reads packed
        # position ids only without one).
        runner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
               logits_to_keep=torch.empty(0, dtype=torch.long, device=input_ids.device))
    finally:
        handle.remove()
    return got[-1]


def head_logprobs(head: torch.nn.Module, hidden: Tensor, targets: Tensor, *, temperature: float, chunk: int,
                  entropy: bool, agree: Callable[[int], int] | None = None,
                  allowed: LossMasks | None = None) -> tuple[Tensor, Tensor | None]:
    """log softmax(head(hidden)/τ)[target] per position, `chunk` positions at a time: hidden [N, H], targets
    [N] long → ([N] fp32, entropy [N] fp32 detached, or None).

    A ZeRO-3 head gathers its weight from every rank on each call (and on each recompute in backward), so
    every rank must call it equally often: `agree` gives the global maximum of the chunk counts and the ranks
    with fewer loss tokens run empty chunks up to it. `allowed`: the positions' token masks (None: none)."""
    masks = _Masks(allowed.to(hidden.device) if allowed is not None else None, chunk)
    weight = getattr(head, "weight", None)
    partitioned = hasattr(weight, "ds_id")
    whole = type(head) is torch.nn.Linear and head.bias is None and not partitioned
    split = zip(hidden.split(chunk), targets.split(chunk), strict=True)
    pieces = [(h, t, j) for j, (h, t) in enumerate(split)]
    if partitioned and agree is not None:
        pieces += [(hidden[:0], targets[:0], -1)] * (agree(len(pieces)) - len(pieces))
    if torch.is_grad_enabled() and len(pieces) > 1 and whole:
        lp, ent = _ChunkedHead.apply(hidden, weight, targets, temperature, chunk, entropy, masks)
        return lp, ent if entropy else None
    if torch.is_grad_enabled() and len(pieces) > 1:
        parts = [_checkpointed(head, h, t, temperature, entropy, masks, j) for h, t, j in pieces]
    else:  # no grad, or a single chunk: nothing is recomputed, so nothing needs to be
        scores = (_chunk_scores(head(h), t, temperature, entropy, masks[j]) for h, t, j in pieces)
        parts = [(lp, ent) for lp, _, ent in scores]
    lp = torch.cat([p[0] for p in parts])
    return lp, torch.cat([p[1] for p in parts]) if entropy else None


def _chunk_scores(logits: Tensor, targets: Tensor, temperature: float,
                  entropy: bool, allowed: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """One chunk: logits [C, V] (any dtype) → (log-prob of targets [C], logsumexp of the scaled logits [C],
    entropy [C] detached, or an empty [0]); `allowed` [C, V] bool: the guard's tokens, the rest masked."""
    z = logits.float()  # the head's own output when fp32: scaled in place, one [C, V] buffer (no op saves it)
    z = z.div_(temperature) if temperature != 1.0 else z
    z = _masked(z, allowed)
    lse = torch.logsumexp(z, -1)
    lp = z.gather(-1, targets[:, None]).squeeze(-1) - lse
    return lp, lse, _entropy(z.detach(), lse.detach()) if entropy else z.new_zeros(0)


class _Masks:
    """Chunk j's allowed tokens [C, V] bool (None: no guarded position in it, or no guards), expanded from the
    packed LossMasks when asked for, so one chunk's worth exists at a time."""

    def __init__(self, allowed: LossMasks | None, chunk: int):
        self.allowed, self.chunk = allowed, chunk

    def __getitem__(self, j: int) -> Tensor | None:
        if self.allowed is None or j < 0:
            return None
        return self.allowed.chunk(j * self.chunk, (j + 1) * self.chunk)


def _masked(z: Tensor, allowed: Tensor | None) -> Tensor:
    """z [C, V] fp32 with the tokens `allowed` [C, V] does not hold at the lowest float, in place: not
    −inf, so the entropy's 0 · z stays 0 and softmax gives them exactly 0."""
    return z if allowed is None else z.masked_fill_(~allowed, torch.finfo(torch.float32).min)


@torch.no_grad()
def _entropy(z: Tensor, lse: Tensor) -> Tensor:
    """H = lse − Σ softmax(z)·z per row: z [C, V] fp32, lse [C] = logsumexp(z) → [C]; one [C, V] temporary."""
    return lse - (z - lse[:, None]).exp_().mul_(z).sum(-1)


def _checkpointed(head: torch.nn.Module, hidden: Tensor, targets: Tensor, temperature: float,
                  entropy: bool, masks: _Masks, j: int) -> tuple[Tensor, Tensor]:
    """One chunk through the head module, recomputed in backward; its entropy is taken in forward only."""
    sink: list[Tensor] = []

    def score(h: Tensor) -> Tensor:
        lp, _, ent = _chunk_scores(head(h), targets, temperature, entropy and not sink, masks[j])
        sink.append(ent)  # the recompute in backward finds sink filled and skips the entropy
        return lp

    lp = checkpoint(score, hidden, use_reentrant=False)
    return lp, sink[0]


class _ChunkedHead(torch.autograd.Function):
    """Log-probs (and entropy) of targets under logits = hidden @ weightᵀ / τ, chunk by chunk;
    backward recomputes each chunk's logits. hidden [N, H], weight [V, H], targets [N] → (lp [N] fp32,
    entropy [N] fp32, no grad)."""

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float, chunk: int,
                entropy: bool, masks: _Masks) -> tuple[Tensor, Tensor]:
        device = hidden.device.type
        # Backward runs outside the caller's autocast: it re-enters the same one, so its logits round alike.
        ctx.autocast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        ctx.temperature, ctx.chunk, ctx.masks = temperature, chunk, masks
        parts = [_chunk_scores(F.linear(h, weight), t, temperature, entropy, masks[j])
                 for j, (h, t) in enumerate(zip(hidden.split(chunk), targets.split(chunk), strict=True))]
        lp, lse, ent = (torch.cat(p) for p in zip(*parts, strict=True))
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx: Any, grad_lp: Tensor, _grad_ent: Tensor) -> tuple[Tensor | None, ...]:
        hidden, weight, targets, lse = ctx.saved_tensors
        grad_h = torch.empty_like(hidden)
        # A frozen head (LoRA elsewhere) takes no weight gradient: its [C, V] × [C, H] matmuls are skipped.
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        device, c = hidden.device.type, ctx.chunk
        cast = torch.autocast(device, dtype=ctx.autocast) if ctx.autocast else contextlib.nullcontext()
        for i in range(0, hidden.shape[0], c):
            h, t, g = hidden[i:i + c], targets[i:i + c], grad_lp[i:i + c]
            rows = torch.arange(len(t), device=t.device)
            with cast:
                z = F.linear(h, weight)
            # d lp / d z = (onehot(t) − softmax(z/τ)) / τ, built in place in one fp32 [C, V] buffer.
            d = _masked(z.float().div_(ctx.temperature), ctx.masks[i // c])
            d = d.sub_(lse[i:i + c, None]).exp_().neg_()
            d[rows, t] += 1.0
            # the logits' dtype, as autograd's would be
            dz = d.mul_((g / ctx.temperature)[:, None]).to(z.dtype)
            with cast:
                grad_h[i:i + c] = dz @ weight
                if grad_w is not None:
                    grad_w += dz.t() @ h
        return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None, None, None, None


def _unchunked(runner: Any, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor, temperature: float,
               entropy: bool) -> tuple[Tensor, Tensor | None]:
    """The model's own logits of the response window [B, T−1−s, V] (positions before s =
    response_start predict prompt tokens only and get none), in fp32 and temperature-scaled; log-probs
    and entropy padded to [B, T−1]."""
    s = response_start(loss_mask)
    logits = runner(input_ids=input_ids, attention_mask=attention_mask,
                    logits_to_keep=input_ids.shape[1] - s).logits[:, :-1].float() / temperature
    lp = F.pad(token_logprobs(logits, input_ids[:, 1 + s:]), (s, 0))
    if not entropy:
        return lp, None
    with torch.no_grad():
        return lp, F.pad(entropy_from_logits(logits), (s, 0))
