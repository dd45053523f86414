"""Colocated LoRA policies (`learner.lora_colocate`): one learner group holding one base model and every
isolated policy's adapter, each with its own optimizer, LR schedule and gradients (mixed-adapter training).

Under isolated LoRA policies each policy's learner would hold its own copy of the base: R policies, R bases.
Here one process per rank loads the base once, wrapped by peft with one adapter slot ("default"), and an
`AdapterBank` keeps each policy's adapter parameters apart and binds one policy's into the slot at a time.
Every policy is an ordinary learners.learner.Learner built on that module while its adapter is bound, so its
optimizer, schedule, gradients, weight payloads and checkpoint files are exactly those of a separate learner
(the adapter keeps peft's "default" names: a checkpoint reads back under either layout). `ColocatedLearners`
is the member one Ray actor hosts; it runs each call of a policy with that policy's adapter bound.
`PolicyGroup` is one policy's view of the shared group: a Group[LearnerMember], so LearnerGroup, the weight
sync and checkpoints use it unchanged.

Under `learner.backend=deepspeed` (ZeRO-2) each policy keeps its own engine: `deepspeed.initialize` over the
shared module, built while that policy's adapter is bound, with that policy's AdamW (so its adapter parameters
alone). Chosen over one engine with a parameter group per policy, which would step every policy's group on
each `engine.step()` (DeepSpeed clips by one global norm and allows one schedule) and write one checkpoint for
all, where each policy's update, schedule and checkpoint must stay a separate learner's. What the engines
share is harmless at ZeRO-2, read from deepspeed/runtime/engine.py and zero/stage_1_and_2.py:
- the module is cast and moved by each build, but only the parameters bound then: the base casts once (a
  parameter already in the target dtype and device is left alone) and each adapter once, by its own engine;
  every build broadcasts the bound parameters from rank 0 (the base R times, once, at start);
- ZeRO-2 flattens the policy's optimizer parameters into its buffers (their `.data` become views) and hooks
  those parameter objects only: another policy's backward fires none of them, and binding swaps Parameter
  objects into the slots, never their tensors, so every engine's references stay valid;
- the forward pre/post hooks each engine registers on the module run for every policy's forward; at ZeRO-2
  they only start and stop timers (ZeRO-3's parameter gathering is what they would do wrongly, so ZeRO-3 is
  refused at load, jobs/config/colocation.py);
- accumulation counters, the gradient partition and the per-backward reduction bucket (released after each
  backward) are the engine's own; one policy runs on a rank at a time, so one bucket exists at once;
- a checkpoint is the engine's module state with frozen parameters left out: the bound adapter's, under
  peft's "default" names, beside that engine's optimizer partition: a separate learner's files.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from cluster import collective
from cluster.collective import init_collective
from cluster.group import Group, GroupError, MemberOptions, Pending
from cluster.member import Call
from cluster.placement import GroupPlacement
from cluster.threads import thread_env
from learners.group import LearnerGroup
from learners.member import LearnerMember, LearnerSpec


class AdapterBank:
    """One peft module and R policies' adapters: `bound(policy)` puts that policy's adapter parameters into
    the module's trainable slots for the duration of a call (one policy at a time: a lock)."""

    def __init__(self, module: torch.nn.Module, policy_ids: Sequence[str]):
        """Every policy's adapter starts as the module's freshly initialised one, as a separate learner's
        would (its learner seeded alike): the first policy takes it, the others copies."""
        self.module = module
        # Each trainable parameter's owner and attribute: the slots an adapter's parameters are bound into.
        self.slots = [_owner(module, name) for name, p in module.named_parameters() if p.requires_grad]
        fresh = [getattr(owner, attr) for owner, attr in self.slots]
        self.adapters: dict[str, list[torch.nn.Parameter]] = {
            pid: fresh if i == 0 else [torch.nn.Parameter(p.detach().clone()) for p in fresh]
            for i, pid in enumerate(policy_ids)}
        self.lock = threading.RLock()

    @contextmanager
    def bound(self, policy_id: str) -> Iterator[torch.nn.Module]:
        with self.lock:
            for (owner, attr), param in zip(self.slots, self.adapters[policy_id], strict=True):
                setattr(owner, attr, param)
            yield self.module


def _owner(module: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    """(the submodule holding parameter `name`, its attribute name)."""
    path, _, attr = name.rpartition(".")
    return module.get_submodule(path), attr


class ColocatedLearners:
    """One rank of every colocated policy: one base, one Learner per policy on its own adapter."""

    def __init__(self, specs: Sequence[LearnerSpec], rank: int = 0):
        from learners.compute.padding_free import attention_implementation
        from learners.learner import Learner  # on the rank: importing this module (jobs) loads no model code
        from learners.state.weights import load_policy_model

        first = specs[0]
        torch.manual_seed(first.seed)  # each separate learner seeds before its load: the same adapter init
        module = load_policy_model(first.model_path, first.model.dtype, first.model.lora,
                                   attention_implementation(first.learner.padding_free))
        self.bank = AdapterBank(module, [s.policy_id for s in specs])
        self.learners: dict[str, Learner] = {}
        for spec in specs:
            with self.bank.bound(spec.policy_id) as bound:
                self.learners[spec.policy_id] = Learner(spec, rank, module=bound)

    def call(self, policy_id: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """`LearnerMember.<method>` of policy `policy_id`, run with its adapter
        bound (PolicyGroup's calls)."""
        with self.bank.bound(policy_id):
            return getattr(self.learners[policy_id], method)(*args, **kwargs)

    def build(self) -> None:
        """Every policy's gradient backend built (DeepSpeed: its engine), in policy order on every rank, each
        with its adapter bound: before any call, so no policy meets a base its engine has not yet moved."""
        for pid, learner in self.learners.items():
            with self.bank.bound(pid):
                learner.backend.build()

    # -- collective membership: one process group per rank, shared by the policies --
    def rendezvous_address(self) -> tuple[str, int]:
        return collective.rendezvous_address()

    def join(self, backend: str, host: str, port: int, rank: int, world: int, timeout_s: float) -> None:
        """The first policy's backend joins (it picks the transport: DeepSpeed's NCCL on CUDA);
        the others share the group."""
        self.call(next(iter(self.learners)), "join", (backend, host, port, rank, world, timeout_s), {})


class PolicyGroup(Group[LearnerMember]):
    """Policy `policy_id`'s view of the shared colocated group: member calls go
    to its Learner on each rank."""

    def __init__(self, shared: Group[ColocatedLearners], policy_id: str):
        # Not Group.__init__, which starts members: a view starts none and forwards to the shared group's.
        self.shared, self.policy_id = shared, policy_id
        self.name = f"{shared.name}/{policy_id}"
        self.n = shared.n

    @property
    def size(self) -> int:
        return self.shared.size

    def _submit(self, indices: Sequence[int], calls: Sequence[Call[Any, Any]]) -> Pending[Any]:
        return self.shared._submit(
            indices, [Call(ColocatedLearners.call, self.policy_id, c.method, c.args, c.kwargs) for c in calls]
        )

    def run(self, index: int, fn: Any, /, *args: Any, **kwargs: Any) -> Pending[Any]:
        return self.shared.run(index, fn, *args, **kwargs)

    def replace(self, index: int, timeout: float) -> None:
        raise GroupError(
            f"{self.name}:{index} is shared by every colocated policy and cannot be replaced alone"
        )

    def shutdown(self) -> None:
        self.shared.shutdown()  # idempotent: the first policy's call ends the shared members


def colocated_groups(specs: Sequence[LearnerSpec], run_name: str, name: str,
                     placement: GroupPlacement | None = None) -> dict[str, LearnerGroup]:
    """policy -> its LearnerGroup, every one backed by the same ranks, the group `name`."""
    learner = specs[0].learner
    threads = learner.torch_threads
    shared: Group[ColocatedLearners] = Group(
        ColocatedLearners, learner.ranks, name=name, args=(list(specs),),
        options=MemberOptions(num_cpus=learner.rank_num_cpus, env=thread_env(threads) if threads else {}),
        per_member_kwargs=[{"rank": r} for r in range(max(learner.ranks, 1))], placement=placement,
    )
    init_collective(shared, "gloo", learner.update_timeout_s)
    shared.submit(ColocatedLearners.build).result(learner.update_timeout_s)
    return {s.policy_id: LearnerGroup(s, run_name, group=PolicyGroup(shared, s.policy_id)) for s in specs}
