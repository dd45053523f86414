"""What one learner rank reports of a training step, by value across Ray, and how a group merges its
ranks' reports into the policy's flat metrics.

A rank returns a `RankMetrics`: its `TokenSums` (sums over its own loss tokens, which only mean something
added across ranks, so the group adds them before it divides) and its `StepMetrics` (per optimizer step,
taken from all-reduced gradients: every rank holds the same values). `merge_rank_metrics` names them as the
driver logs them (`loss/<policy>`, `clip_frac/<policy>`, `entropy/<role>`, ...). Sums accumulate term by
term in the order they are gathered, so a rerun adds up to the same floats.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

K = TypeVar("K")
RoleTerms = Iterable[tuple[str, float]]  # (role, value): one term per row, in row order


def added(sums: Mapping[K, float], terms: Iterable[tuple[K, float]]) -> dict[K, float]:
    """A copy of `sums` with each (key, value) term added in order (a missing key counts from 0.0)."""
    out = dict(sums)
    for key, value in terms:
        out[key] = out.get(key, 0.0) + value
    return out


def _plus(a: float | None, b: float | None) -> float | None:
    """a + b where None is a sum nothing added to (None + None stays None)."""
    if b is None:
        return a
    return (0.0 if a is None else a) + b


@dataclass(frozen=True)
class RoleSums:
    """A rank's per-role sums over loss tokens, role → sum. A role absent from a map had no such term here:
    the clip fraction counts rows that trained only, KL exists only with a KL term."""

    tokens: Mapping[str, float] = field(default_factory=dict)
    entropy: Mapping[str, float] = field(default_factory=dict)
    logprob_diff: Mapping[str, float] = field(default_factory=dict)  # |learner − engine| log-prob
    clip_frac: Mapping[str, float] = field(default_factory=dict)
    kl: Mapping[str, float] = field(default_factory=dict)

    def added(self, *, tokens: RoleTerms = (), entropy: RoleTerms = (), logprob_diff: RoleTerms = (),
              clip_frac: RoleTerms = (), kl: RoleTerms = ()) -> RoleSums:
        """A copy with each (role, value) term added to its role's sum, in order."""
        return RoleSums(added(self.tokens, tokens), added(self.entropy, entropy),
                        added(self.logprob_diff, logprob_diff), added(self.clip_frac, clip_frac),
                        added(self.kl, kl))

    def plus(self, other: RoleSums) -> RoleSums:
        return self.added(tokens=other.tokens.items(), entropy=other.entropy.items(),
                          logprob_diff=other.logprob_diff.items(), clip_frac=other.clip_frac.items(),
                          kl=other.kl.items())


@dataclass(frozen=True, kw_only=True)
class TokenSums:
    """A rank's sums of one training step: the loss (the mean over its optimizer steps), clipped tokens and
    loss tokens, the micro-batches' padded and total positions (rows × widest row), and, when measured, tokens
    the dual clip held (`algo.dual_clip_c`) and the policy's movement (learners/policy_move.py): None = not
    measured."""

    loss: float = 0.0
    clip_frac: float = 0.0
    tokens: float = 0.0
    padded_positions: float = 0.0
    positions: float = 0.0
    dual_clip_frac: float | None = None
    move: float | None = None
    move_tokens: float | None = None
    roles: RoleSums = field(default_factory=RoleSums)

    def plus(self, other: TokenSums) -> TokenSums:
        """Each of `other`'s sums added to this one's."""
        return TokenSums(
            loss=self.loss + other.loss, clip_frac=self.clip_frac + other.clip_frac,
            tokens=self.tokens + other.tokens,
            padded_positions=self.padded_positions + other.padded_positions,
            positions=self.positions + other.positions,
            dual_clip_frac=_plus(self.dual_clip_frac, other.dual_clip_frac),
            move=_plus(self.move, other.move), move_tokens=_plus(self.move_tokens, other.move_tokens),
            roles=self.roles.plus(other.roles))


@dataclass(frozen=True, kw_only=True)
class StepMetrics:
    """A rank's optimizer steps of one training step: the taken steps' mean grad norm and lr and the last
    step's (no step taken: a zero norm at the lr the step would have used), the steps taken and skipped, and
    with role diagnostics the per-role gradient metrics under their logged names (`grad/...`, the last step's
    `last/grad/...`; learners/role_grads.py)."""

    grad_norm: float
    last_grad_norm: float
    lr: float
    last_lr: float
    optimizer_steps: int
    skipped_steps: int
    role_grads: Mapping[str, float] = field(default_factory=dict)
    # Of the steps taken, those that did not apply (non-finite gradient: DeepSpeed's overflow skip, or the
    # torch backend's), and the run of consecutive ones up to this step's last (across training steps).
    nonfinite_steps: int = 0
    nonfinite_run: int = 0


@dataclass(frozen=True)
class RankMetrics:
    """What `LearnerMember.update` returns."""

    sums: TokenSums
    step: StepMetrics


# A role's clip fraction is `clip_frac/role/<role>`: `clip_frac/<policy>` exists too and a policy may share
# a role's name (isolated maps), so the two must not collide.
def _role_means(roles: RoleSums) -> dict[str, float]:
    """Each per-role sum over the role's tokens, under its logged name."""
    out: dict[str, float] = {}
    for name, sums in (("entropy", roles.entropy), ("rollout/logprob_diff", roles.logprob_diff),
                       ("kl", roles.kl), ("clip_frac/role", roles.clip_frac)):
        out.update({f"{name}/{role}": v / max(roles.tokens.get(role, 0.0), 1.0) for role, v in sums.items()})
    return out


def merge_rank_metrics(per_rank: Sequence[RankMetrics], policy_id: str,
                       unmeasured: TokenSums | None = None) -> dict[str, float]:
    """The policy's metrics of one training step from its ranks' reports: the ranks' sums added (then
    `unmeasured`, sums no rank holds: the tokens of skipped rows the diagnostics' sample left out) and
    divided; the step metrics are every rank's, so rank 0's are taken."""
    total = TokenSums()
    for sums in [*(r.sums for r in per_rank), *([unmeasured] if unmeasured is not None else [])]:
        total = total.plus(sums)
    first = per_rank[0].step
    # Grad norm, lr and the per-role gradient metrics are per optimizer step: the step's mean, and the last
    # optimizer step's under `last/`.
    out = {f"loss/{policy_id}": total.loss, f"grad/norm/{policy_id}": first.grad_norm,
           f"last/grad/norm/{policy_id}": first.last_grad_norm, f"lr/{policy_id}": first.lr,
           f"last/lr/{policy_id}": first.last_lr, f"optim/steps/{policy_id}": float(first.optimizer_steps),
           f"clip_frac/{policy_id}": total.clip_frac / max(total.tokens, 1.0),
           # The share of the micro-batches' positions (rows × widest row) that were padding.
           f"batch/padding_frac/{policy_id}": total.padded_positions / max(total.positions, 1.0),
           # Optimizer steps that did not change the weights: planned skips and non-finite ones.
           f"update/skipped_steps/{policy_id}": float(first.skipped_steps + first.nonfinite_steps),
           f"update/nonfinite_steps/{policy_id}": float(first.nonfinite_steps),
           f"update/nonfinite_run/{policy_id}": float(first.nonfinite_run)}
    if total.dual_clip_frac is not None:  # tokens whose loss the −A·c cap held (verl's clipfrac_lower)
        out[f"clip_frac/dual/{policy_id}"] = total.dual_clip_frac / max(total.tokens, 1.0)
    if total.move_tokens is not None:
        out[f"update/policy_move/{policy_id}"] = (total.move or 0.0) / max(total.move_tokens, 1.0)
    return {**out, **first.role_grads, **_role_means(total.roles)}
