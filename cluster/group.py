"""A group of N members of one plain class, hosted as Ray actors (N >= 1) or in-process (N = 0).

A member method is named by the method itself, never by a string: `group.submit(Member.method, *args)`
takes the unbound method of the member class (or of a Protocol the members satisfy), so a type checker
sees a wrong method name or wrong arguments before anything runs remotely.

Every call carries a deadline. Failures name the member (`<name>:<index>`) and the method, so a hung or
dead actor is attributable. Object refs never leave this package: callers get values, or `Pending`
handles they can wait on or hand to another group's call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from cluster.driver_env import driver_env
from cluster.member import Call
from cluster.placement import GroupPlacement
from cluster.stop import ray_call, wait_refs
from cluster.threads import thread_env, threads_for

M = TypeVar("M", covariant=True)  # the member class (or a Protocol it satisfies)
R = TypeVar("R")  # what the called method returns
R_co = TypeVar("R_co", covariant=True)
P = ParamSpec("P")  # the called method's parameters after `self`


class GroupError(RuntimeError):
    """A member call failed; the message names the member and the method. `member_lost`: the member is gone
    (its actor died) or hung (missed its deadline), as opposed to raising an exception of its own, so callers
    outside this package can decide to replace it without knowing Ray's exception types."""

    def __init__(self, message: str, member_lost: bool = False):
        super().__init__(message)
        self.member_lost = member_lost


class GroupTimeout(GroupError):
    """A member call missed its deadline."""

    def __init__(self, message: str):
        super().__init__(message, member_lost=True)


def _failed(name: str, error: BaseException) -> GroupError:
    """GroupError for a member call that raised `error` (Ray's RayActorError: the actor died)."""
    return GroupError(f"{name} failed: {error}", member_lost=isinstance(error, RayActorError))


@dataclass
class MemberOptions:
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    env: dict[str, str] = field(default_factory=dict)
    max_restarts: int = 0


def _resource_options(opts: MemberOptions, placement: GroupPlacement | None, i: int) -> dict[str, Any]:
    """Ray actor options for member i: its own counts, or its bundle's resources and that bundle."""
    if placement is None:
        return {"num_cpus": opts.num_cpus, "num_gpus": opts.num_gpus}
    custom = dict(placement.bundles[i])
    return {"num_cpus": custom.pop("CPU", 0.0), "num_gpus": custom.pop("GPU", 0.0), "resources": custom,
            "scheduling_strategy": placement.strategy(i)}


def _member_cpus(opts: MemberOptions, placement: GroupPlacement | None, i: int) -> float:
    return float(placement.bundles[i].get("CPU", 0.0)) if placement is not None else opts.num_cpus


def _member_gpus(opts: MemberOptions, placement: GroupPlacement | None, i: int) -> float:
    return float(placement.bundles[i].get("GPU", 0.0)) if placement is not None else opts.num_gpus


# `member`: __ray_call__ passes the actor's instance first; the function needs only its arguments.
def _apply(member: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


class Pending(Generic[R_co]):
    """Results of one call on some members, not yet awaited."""

    def __init__(self, group: Group[Any], method: str, indices: list[int], items: list[Any]):
        self._group, self._method, self._indices, self._items = group, method, indices, items

    def result(self, timeout: float) -> list[R_co]:
        if self._group.local:
            return self._group._get_local(self._items, self._indices, self._method, timeout)
        return self._group._get(self._items, self._indices, self._method, timeout)

    @property
    def indices(self) -> list[int]:
        return list(self._indices)

    def payload(self, timeout: float) -> Any:
        """The first member's result as an argument for another group's call: a remote group's object ref
        (not fetched), or an in-process member's value (awaited with the deadline)."""
        if self._group.local:
            return self.result(timeout)[0]
        return self._items[0]


class Group(Generic[M]):
    """N members of `cls`. Members of a remote group are named `<name>:<index>` in the Ray dashboard."""

    def __init__(
        self,
        cls: type[M],
        n: int,
        name: str,
        args: Sequence[Any] = (),
        options: MemberOptions | None = None,
        per_member_kwargs: Sequence[dict[str, Any]] | None = None,
        per_member_env: Sequence[dict[str, str]] | None = None,
        placement: GroupPlacement | None = None,
    ):
        """`placement`: the placement-group bundle of each member (remote groups); members then
        take their bundle's resources instead of `options`' counts, so they always fit the
        bundle they are scheduled into."""
        self.name, self.n = name, n
        kwargs = list(per_member_kwargs or [{} for _ in range(max(n, 1))])
        if n == 0:
            # One thread per in-process member gives it an actor's semantics (one call at a time, in
            # submission order) and lets the caller stop waiting at a deadline. The member is built on that
            # thread too, as an actor is: OpenMP thread counts are per thread, and a native kernel that sizes
            # its work in the constructor's thread and runs it in another one refuses to run.
            self._executors = [ThreadPoolExecutor(1, thread_name_prefix=f"{name}:0")]
            self._members: list[Any] = [self._executors[0].submit(cls, *args, **kwargs[0]).result()]
            return
        opts = options or MemberOptions()
        envs = [{**opts.env, **e} for e in per_member_env] if per_member_env else [dict(opts.env)] * n
        if placement is not None and len(placement.indices) != n:
            raise GroupError(f"{name}: {n} members but {len(placement.indices)} placement bundles")
        # Thread pools as large as the member's CPUs and the driver's log settings, unless the caller's
        # environment says otherwise.
        envs = [
            {**driver_env(cpu_only=not _member_gpus(opts, placement, i)),
             **thread_env(threads_for(_member_cpus(opts, placement, i))), **env}
            for i, env in enumerate(envs)
        ]
        remote_cls: Any = ray.remote(cls)

        def spawn(i: int) -> Any:
            return remote_cls.options(
                name=f"{name}:{i}", max_restarts=opts.max_restarts, runtime_env={"env_vars": envs[i]},
                **_resource_options(opts, placement, i),
            ).remote(*args, **kwargs[i])

        self._spawn, self._placement = spawn, placement  # replace() rebuilds a member exactly as it was built
        self._members = [spawn(i) for i in range(n)]

    @property
    def local(self) -> bool:
        return self.n == 0

    @property
    def size(self) -> int:
        return len(self._members)

    def submit(
        self, method: Callable[Concatenate[M, P], R], /, *args: P.args, **kwargs: P.kwargs
    ) -> Pending[R]:
        """method(member, *args, **kwargs) on every member; `method` is `Member.method`."""
        return self._submit(range(self.size), [Call(method, *args, **kwargs)] * self.size)

    def submit_to(self, indices: Sequence[int], method: Callable[Concatenate[M, P], R], /,
                  *args: P.args, **kwargs: P.kwargs) -> Pending[R]:
        """`submit` on the members `indices` only."""
        return self._submit(indices, [Call(method, *args, **kwargs)] * len(indices))

    def submit_each(self, calls: Sequence[Call[M, R]]) -> Pending[R]:
        """Member i runs calls[i] (scatter); every call names the same method."""
        if len({c.method for c in calls}) > 1:
            raise GroupError(
                f"{self.name}: submit_each takes one method, got {sorted({c.method for c in calls})}"
            )
        return self._submit(range(len(calls)), calls)

    def _submit(self, indices: Sequence[int], calls: Sequence[Call[Any, R]]) -> Pending[R]:
        idx = list(indices)
        if self.local:
            items = [self._call_local(i, c.method, c.args, c.kwargs) for i, c in zip(idx, calls, strict=True)]
        else:
            items = [getattr(self._members[i], c.method).remote(*c.args, **c.kwargs)
                     for i, c in zip(idx, calls, strict=True)]
        return Pending(self, calls[0].method if calls else "", idx, items)

    async def acall(self, index: int, method: Callable[Concatenate[M, P], Coroutine[Any, Any, R]], /,
                    *args: P.args, **kwargs: P.kwargs) -> R:
        """An async member method (`Member.method`) on member `index`, awaited with no deadline of its own:
        the caller bounds it (by the member's progress, say). Many such calls may be in flight on one member
        at once: a Ray actor with an async method runs them concurrently on its event loop, and an in-process
        member's coroutine runs on the caller's loop (it must hand blocking work to threads of its own)."""
        call = Call(method, *args, **kwargs)
        try:
            if self.local:
                out: R = await getattr(self._members[index], call.method)(*args, **kwargs)
            else:
                out = await getattr(self._members[index], call.method).remote(*args, **kwargs)
            return out
        except asyncio.CancelledError:
            raise
        except Exception as e:  # an in-process member's own exception, or Ray's wrapper of a remote one
            raise _failed(f"{self.name}:{index}.{call.method}", e) from e

    def run(self, index: int, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Pending[R]:
        """fn(*args) inside member `index`'s process, after its queued calls: work next to what the member
        holds (its own results, say) without starting a task worker for it. `fn` must be importable."""
        name = getattr(fn, "__name__", "run")
        if self.local:
            return Pending(self, name, [index], [self._executors[index].submit(fn, *args, **kwargs)])
        return Pending(
            self, name, [index], [self._members[index].__ray_call__.remote(_apply, fn, *args, **kwargs)]
        )

    def replace(self, index: int, timeout: float) -> None:
        """Kill member `index` (dead or hung) and start a new one under the same name and slot. Ray frees a
        killed actor's name asynchronously, so the new one is retried until the name is free or `timeout`."""
        if self.local:
            raise GroupError(f"{self.name}:{index} is in-process and cannot be replaced")
        ray.kill(self._members[index], no_restart=True)
        gone = self._placement.node_gone(index) if self._placement is not None else None
        if gone is not None:  # its replacement would wait in the bundle until the node is back or replaced
            raise GroupError(f"{self.name}:{index} cannot be replaced: {gone}")
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._members[index] = self._spawn(index)
                return
            except ValueError as e:  # "The name ... is already taken"
                if time.monotonic() > deadline:
                    raise GroupTimeout(
                        f"{self.name}:{index} could not be replaced within {timeout:g}s: {e}"
                    ) from e
                time.sleep(0.05)

    def _call_local(
        self, index: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Future[Any]:
        return self._executors[index].submit(getattr(self._members[index], method), *args, **kwargs)

    def _get_local(
        self, futures: list[Future[Any]], indices: list[int], method: str, timeout: float
    ) -> list[Any]:
        _, not_done = wait_futures(futures, timeout=timeout)
        if not_done:
            late = [f"{self.name}:{i}" for i, f in zip(indices, futures, strict=True) if f in not_done]
            raise GroupTimeout(f"{', '.join(late)}.{method} missed its {timeout:g}s deadline")
        for i, fut in zip(indices, futures, strict=True):
            if fut.exception() is not None:
                raise GroupError(f"{self.name}:{i}.{method} failed: {fut.exception()}") from fut.exception()
        return [f.result() for f in futures]

    def _get(self, refs: list[Any], indices: list[int], method: str, timeout: float) -> list[Any]:
        deadline = time.monotonic() + timeout
        not_ready = wait_refs(refs, timeout)
        if not_ready:
            late = [f"{self.name}:{indices[refs.index(r)]}" for r in not_ready]
            raise GroupTimeout(f"{', '.join(late)}.{method} missed its {timeout:g}s deadline")
        out = []
        for i, ref in zip(indices, refs, strict=True):
            try:
                with ray_call():
                    out.append(ray.get(ref, timeout=max(deadline - time.monotonic(), 1.0)))
            except GetTimeoutError:
                raise GroupTimeout(f"{self.name}:{i}.{method} missed its {timeout:g}s deadline") from None
            except (RayActorError, RayTaskError) as e:
                raise _failed(f"{self.name}:{i}.{method}", e) from e
        return out

    def shutdown(self) -> None:
        if self.local:
            for ex in self._executors:
                ex.shutdown(wait=False, cancel_futures=True)
        else:
            for m in self._members:
                ray.kill(m, no_restart=True)
        self._members = []
