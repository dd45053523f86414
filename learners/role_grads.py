"""Per-role gradient diagnostics as pure functions: which role's turns drive a policy's update.

A policy's gradient is the sum of its roles' gradients (the loss is a sum over rows), so computing each
role's share separately and summing gives the plain update. From the per-role gradients [R, P] we report
each role's norm, its share of the total norm, the dominance index (largest share: "role capture" under a
shared policy) and the cosine similarity between roles (do they pull the weights the same way?).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor


def flat_grads(params: list[torch.nn.Parameter]) -> Tensor:
    """[P] concatenation of every parameter's gradient (zeros where a gradient is missing)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def flat_autograd(grads: Sequence[Tensor | None], params: list[torch.nn.Parameter]) -> Tensor:
    """[P] fp32 concatenation of torch.autograd.grad's result (zeros for
    parameters the loss did not reach)."""
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).float()
                      for g, p in zip(grads, params, strict=True)])


def assign_flat_grads(params: list[torch.nn.Parameter], flat: Tensor) -> None:
    """Write a [P] vector back into the parameters' .grad (inverse of flat_grads)."""
    offset = 0
    for p in params:
        n = p.numel()
        # The flat buffer is fp32 (sums of per-role gradients); a bf16 parameter takes its gradient in bf16.
        p.grad = flat[offset:offset + n].view_as(p).to(dtype=p.dtype, copy=True)
        offset += n


def role_grad_metrics(role_grads: Tensor, roles: list[str], policy_id: str) -> dict[str, float]:
    """role_grads [R, P] (row r = gradient of role r's share of the loss) → flat metrics.

    grad/role_norm/<role>, grad/norm_share/<role> (‖g_r‖ / Σ‖g‖), grad/dominance/<policy> (max share),
    grad/cos/<a>__<b> for each pair of roles with a non-zero gradient.
    """
    return metrics_from_gram(gram(role_grads), roles, policy_id)


def gram(role_grads: Tensor, chunk: int = 1 << 24) -> Tensor:
    """[R, R] float64 on the CPU: G[a, b] = <g_a, g_b> for role_grads [R, P], on role_grads' own device.

    Computed in column chunks so the float64 copy is at most R × chunk: a GPU learner's [R, P] buffer (P in
    the billions) never travels to the host, only the R × R result does.
    """
    out = torch.zeros(role_grads.shape[0], role_grads.shape[0], dtype=torch.float64, device=role_grads.device)
    for part in role_grads.split(chunk, dim=1):
        part = part.double()
        out += part @ part.T
    return out.cpu()


def metrics_from_gram(g: Tensor, roles: list[str], policy_id: str) -> dict[str, float]:
    """The role_grad_metrics of a Gram matrix g [R, R] (float64)."""
    norms = g.diagonal().clamp_min(0.0).sqrt()
    total = float(norms.sum())
    out: dict[str, float] = {}
    for r, role in enumerate(roles):
        out[f"grad/role_norm/{role}"] = float(norms[r])
        out[f"grad/norm_share/{role}"] = float(norms[r]) / total if total > 0 else 0.0
    out[f"grad/dominance/{policy_id}"] = max((out[f"grad/norm_share/{r}"] for r in roles), default=0.0)
    for a, b in itertools.combinations(range(len(roles)), 2):
        if norms[a] > 0 and norms[b] > 0:
            out[f"grad/cos/{roles[a]}__{roles[b]}"] = float(g[a, b] / (norms[a] * norms[b]))
    return out


def advantage_mass(roles: list[str], advantages: Tensor, loss_tokens: Tensor) -> dict[str, float]:
    """Each role's Σ tokens × |advantage| (cheap, no backward) and its share of the policy's total:
    grad/mass/<role>, grad/mass_share/<role>. advantages, loss_tokens [B]."""
    mass = advantages.abs().double() * loss_tokens.double()
    total = float(mass.sum())
    out: dict[str, float] = {}
    for role in sorted(set(roles)):
        rows = torch.tensor([r == role for r in roles])
        out[f"grad/mass/{role}"] = float(mass[rows].sum())
        out[f"grad/mass_share/{role}"] = out[f"grad/mass/{role}"] / total if total > 0 else 0.0
    return out


def step_role_shares(metrics: dict[str, float], roles: list[str]) -> dict[str, float]:
    """Each role's share of the whole step across policies, from the merged per-policy metrics: of the
    gradient mass (grad/step_mass_share/<role>, from grad/mass/<role>) and of the sum of the roles' gradient
    norms (grad/step_norm_share/<role>, from grad/role_norm/<role>, where diagnostics recorded them).

    Under a shared policy these equal the per-policy shares; under isolated policies the per-policy share of a
    policy's only role is 1 by construction, and only these say which role drives the step."""
    out: dict[str, float] = {}
    for key, share in (("mass", "step_mass_share"), ("role_norm", "step_norm_share")):
        values = {r: metrics[f"grad/{key}/{r}"] for r in roles if f"grad/{key}/{r}" in metrics}
        total = sum(values.values())
        out.update({f"grad/{share}/{r}": v / total if total > 0 else 0.0 for r, v in values.items()})
    return out
