"""What a Learner rank builds before it trains: its precision, and its parts (the policy module, the trainable
parameters, AdamW, the LR schedule and the frozen reference) in the order a seeded run depends on.

learners/learner.py composes these with its backend, forward passes and weight server.
"""

from __future__ import annotations

import torch

from learners.compute.padding_free import attention_implementation
from learners.gradients.backends import GradientBackend, LearnerParts
from learners.member import LearnerSpec
from learners.schedule import lr_lambda
from learners.state.weights import PolicyModel, is_lora, load_policy_model


def precision(spec: LearnerSpec, backend: type[GradientBackend]) -> tuple[torch.dtype | None, str]:
    """(the autocast dtype, None for none; the dtype the trained weights are held in).

    bfloat16 on a backend that autocasts is mixed precision: trained weights are fp32 masters under autocast;
    a LoRA policy's frozen base stays in the serving dtype (peft keeps adapters in fp32), so its merge rounds
    W0 + ΔW from the very base the engines hold."""
    model = spec.model
    autocast = torch.bfloat16 if backend.capabilities.autocast_bf16 and model.dtype == "bfloat16" else None
    return autocast, "float32" if autocast and not model.lora.enabled else model.dtype


def build_parts(spec: LearnerSpec, rank: int, master_dtype: str, module: PolicyModel | None) -> LearnerParts:
    """The rank's policy module (`module`, or the one loaded from `spec.model_path`) in `master_dtype`, its
    AdamW over the trainable parameters, the LR schedule and the frozen reference (None without KL, and for
    LoRA, whose reference is its base with the adapter disabled: no second copy in memory)."""
    learner, algo, opt = spec.learner, spec.algo, spec.learner.optim
    attention = attention_implementation(learner.padding_free)
    model = _policy_module(spec, master_dtype, attention, module)
    params = [p for p in model.parameters() if p.requires_grad]
    beta1, beta2 = opt.betas  # two, checked at config load
    optimizer = torch.optim.AdamW(params, lr=opt.lr, betas=(beta1, beta2), weight_decay=opt.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(opt, spec.total_steps, spec.num_policies, spec.policy_index))
    reference = (
        load_policy_model(spec.model_path, master_dtype, spec.model.lora, attention)
        .eval()
        .requires_grad_(False)
        if algo.uses_kl and not is_lora(model)
        else None
    )
    return LearnerParts(spec=spec, rank=rank, model=model, params=params, optimizer=optimizer,
                        scheduler=scheduler, reference=reference)


def _policy_module(spec: LearnerSpec, dtype: str, attention: str | None,
                   module: PolicyModel | None) -> PolicyModel:
    """The module a rank trains: `module` when given, else the policy loaded
    from `spec.model_path` in `dtype`;
    with gradient checkpointing where the run layout turned it on (LearnerSpec.gradient_checkpointing).
    Non-reentrant: per-role gradients use torch.autograd.grad."""
    model = (
        module
        if module is not None
        else load_policy_model(spec.model_path, dtype, spec.model.lora, attention)
    )
    resolved = spec.gradient_checkpointing
    if resolved if resolved is not None else bool(spec.learner.gradient_checkpointing):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model
