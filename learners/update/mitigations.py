"""Per-row loss weights that counter the two failure patterns, as pure functions of the batch's roles.

- role_balance (shared policies): each role's mean loss counts equally, instead of by its token mass, so
  the role with the most tokens cannot capture the policy.
- parallel_agent_norm: a role's loss is divided by its number of parallel instances (generator0..2 on
  identical prompts get identical advantages and would triple that role's gradient). Under an isolated policy
  every row is scaled alike, which Adam undoes; there the mitigation acts through the mini-batch size instead
  (learners/update/ppo_plan.effective_mini_batch_size: the role takes the optimizer steps of one agent).
Weights multiply the advantages (the loss is linear in them for ratio-1 PPO and positive weights keep
the clip's sign logic), so they compose with any aggregation.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import Tensor


def role_balance_weights(roles: list[str], loss_tokens: Tensor) -> Tensor:
    """[B] weights making Σ_rows w·ℓ / N = (1/R) Σ_roles (Σ_{role rows} ℓ / N_role).

    loss_tokens [B]: loss tokens per row; N = Σ loss_tokens; N_role = that role's tokens; R = roles present.
    """
    per_role: Counter[str] = Counter()
    for role, n in zip(roles, loss_tokens.tolist(), strict=True):
        per_role[role] += n
    present = [r for r, n in per_role.items() if n > 0]
    total = float(loss_tokens.sum())
    if not present:
        return torch.ones(len(roles))
    return torch.tensor([total / (len(present) * per_role[r]) if per_role[r] > 0 else 0.0 for r in roles])


def parallel_agent_weights(roles: list[str], agents: list[str]) -> Tensor:
    """[B] weights 1 / (number of distinct agents of the row's role in the batch)."""
    instances: dict[str, set[str]] = {}
    for role, agent in zip(roles, agents, strict=True):
        instances.setdefault(role, set()).add(agent)
    return torch.tensor([1.0 / len(instances[r]) for r in roles])


def kl_coefficients(roles: list[str], base: float, anchors: dict[str, float]) -> Tensor:
    """[B] per-row KL coefficient: `base` for every row plus `anchors[role]` for the anchored roles' rows.

    The per-role KL anchor pulls only a drifting role (e.g. a captured evaluator) back toward the reference,
    leaving the other roles' tokens at the global coefficient. Both aggregations are linear in the per-token
    loss, so scaling a row's KL terms by its coefficient applies the anchor to that role's tokens alone.
    """
    return torch.tensor([base + anchors.get(r, 0.0) for r in roles], dtype=torch.float32)
