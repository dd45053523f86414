"""cluster.Group: the same calls in-process (n = 0) and on Ray actors (n = 2), deadlines and failures
attributed to `<name>:<index>.<method>`, and shutdown."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
import ray
from ray.exceptions import RayActorError

from cluster.group import Group, GroupError, GroupTimeout, MemberOptions
from cluster.member import Call

CPU = MemberOptions(num_cpus=0.5)
HANG_S = 3.0  # how long a deliberately hanging member sleeps
DEADLINE_S = 0.5


class Counter:
    """A plain member: remembers its construction arguments and the calls it served, in order."""

    def __init__(self, base: int, tag: str = ""):
        self.base, self.tag = base, tag
        self.built_on = threading.get_ident()
        self.seen: list[int] = []

    def add(self, x: int, scale: int = 1) -> int:
        self.seen.append(x)
        return self.base + x * scale

    def history(self) -> list[int]:
        return list(self.seen)

    def ident(self) -> tuple[str, int]:
        return self.tag, os.getpid()

    def threads(self) -> tuple[int, int]:
        """The thread that built this member and the one serving this call."""
        return self.built_on, threading.get_ident()

    def hang(self, seconds: float) -> str:
        time.sleep(seconds)
        return "woke"

    def boom(self, what: str) -> None:
        raise ValueError(f"boom: {what}")


def _run(coro):
    """Run `coro` on a fresh loop and close it without joining executor threads that a timed-out local
    call leaves running (asyncio.run would wait for them at shutdown)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def _make(request, name: str) -> Group:
    n = request.param
    if n:
        request.getfixturevalue("ray_cluster")
    return Group(Counter, n, f"{name}{n}", args=(100,), options=CPU,
                 per_member_kwargs=[{"tag": f"m{i}"} for i in range(max(n, 1))])


@pytest.fixture(scope="module", params=[0, 2], ids=["local", "remote"])
def group(request):
    g = _make(request, "counter")
    yield g
    g.shutdown()


@pytest.fixture(params=[0, 2], ids=["local", "remote"])
def hanging(request):
    """A fresh group per deadline test: a hung member would delay every later call on it."""
    g = _make(request, "hanging")
    yield g
    g.shutdown()


def test_size_and_locality(group):
    assert group.size == max(group.n, 1)
    assert group.local == (group.n == 0)


def test_per_member_kwargs_reach_each_member(group):
    idents = group.submit(Counter.ident).result(30)
    assert [tag for tag, _ in idents] == [f"m{i}" for i in range(group.size)]
    pids = {pid for _, pid in idents}
    if group.local:
        assert pids == {os.getpid()}
    else:
        assert os.getpid() not in pids and len(pids) == 2


def test_call_returns_one_result_per_member_in_order(group):
    assert group.submit(Counter.add, 5, scale=3).result(30) == [115] * group.size
    assert group.submit_to([group.size - 1], Counter.add, 1).result(30) == [101]


def test_submit_each_scatters_args_in_order(group):
    args = [(i + 1, 10 * (i + 1)) for i in range(group.size)]
    assert group.submit_each([Call(Counter.add, *a) for a in args]).result(30) == [
        100 + a * s for a, s in args
    ]


def test_calls_on_one_member_run_in_submission_order(group):
    before = len(group.submit_to([0], Counter.history).result(30)[0])
    pendings = [group.submit_to([0], Counter.add, x) for x in range(6)]
    assert [p.result(30) for p in pendings] == [[100 + x] for x in range(6)]
    assert group.submit_to([0], Counter.history).result(30)[0][before:] == list(range(6))


def test_call_deadline_names_member_and_method(hanging):
    index = hanging.size - 1
    t0 = time.monotonic()
    with pytest.raises(GroupTimeout, match=rf"^{hanging.name}:{index}\.hang missed"):
        hanging.submit_to([index], Counter.hang, HANG_S).result(DEADLINE_S)
    assert time.monotonic() - t0 < HANG_S - 1.0, "the deadline was not enforced"


def test_a_call_that_finishes_in_time_is_not_a_timeout(hanging):
    assert hanging.submit(Counter.hang, 0.0).result(30) == ["woke"] * hanging.size


def test_failing_member_raises_group_error_naming_it(group):
    index = group.size - 1
    with pytest.raises(GroupError, match=rf"(?s)^{group.name}:{index}\.boom failed.*boom: sync") as info:
        group.submit_to([index], Counter.boom, "sync").result(30)
    assert not isinstance(info.value, GroupTimeout)
    with pytest.raises(GroupError, match=rf"(?s)^{group.name}:{index}\.boom failed.*boom: async") as info:
        group.submit_to([index], Counter.boom, "async").result(30)
    assert not isinstance(info.value, GroupTimeout)
    # The member survives its method's exception.
    assert group.submit_to([index], Counter.add, 1).result(30) == [101]


def test_remote_members_are_named_and_shutdown_kills_them(ray_cluster):
    g = Group(Counter, 2, "named", args=(0,), options=CPU)
    assert g.submit(Counter.add, 1).result(30) == [1, 1]
    handles = [ray.get_actor(f"named:{i}") for i in range(2)]
    assert ray.get([h.add.remote(2) for h in handles], timeout=30) == [2, 2]
    g.shutdown()
    for h in handles:
        with pytest.raises(RayActorError):
            ray.get(h.add.remote(3), timeout=30)
    with pytest.raises(ValueError):
        ray.get_actor("named:0")


def test_run_executes_a_function_inside_the_member_after_its_queued_calls(group):
    _, member_pid = group.submit_to([1 if group.n else 0], Counter.ident).result(30)[0]
    index = 1 if group.n else 0
    slow = group.submit_to([index], Counter.hang, 0.3)
    ran = group.run(index, os.getpid)  # queued behind `hang`, in the member's own process
    assert ran.result(30) == [member_pid]
    assert slow.result(30) == ["woke"]
    assert (member_pid == os.getpid()) == group.local


def test_submit_each_takes_one_method(group):
    with pytest.raises(
        GroupError, match=rf"^{group.name}: submit_each takes one method, got \['add', 'ident'\]"
    ):
        group.submit_each([Call(Counter.add, 1), Call(Counter.ident)])


def test_a_member_method_is_named_by_the_method_itself():
    for not_a_method in ("add", lambda member: 1):
        with pytest.raises(TypeError, match=r"unbound method \(Member\.method\)"):
            Call(not_a_method)  # type: ignore[arg-type]
    assert Call(Counter.add, 1, scale=2).method == "add"


def test_a_member_is_built_on_the_thread_that_serves_its_calls(group):
    """An actor's constructor and methods share one thread; in-process members must too (per-thread native
    state such as OpenMP counts is set up in the constructor)."""
    for built_on, serving in group.submit(Counter.threads).result(30):
        assert built_on == serving
    if group.local:
        assert group.submit(Counter.threads).result(30)[0][0] != threading.get_ident()


class Gate:
    """A member with async methods: calls wait at a gate until `open_` is called (the
    caller's loop, in-process)."""

    def __init__(self) -> None:
        self.waiting = 0
        self.opened: asyncio.Event | None = None

    async def through(self, k: int) -> int:
        self.opened = self.opened or asyncio.Event()
        self.waiting += 1
        await self.opened.wait()
        return k

    async def open_(self) -> int:
        assert self.opened is not None
        self.opened.set()
        return self.waiting

    async def fail(self) -> None:
        raise ValueError("gate stuck")


def test_acall_keeps_many_calls_of_one_in_process_member_in_flight_and_names_its_failures():
    group: Group[Gate] = Group(Gate, 0, name="gates")
    try:
        async def main() -> tuple[list[int], int]:
            calls = [asyncio.ensure_future(group.acall(0, Gate.through, k)) for k in range(5)]
            await asyncio.sleep(0)  # one pass of the loop: every call reaches the gate
            waiting = await group.acall(0, Gate.open_)
            return list(await asyncio.gather(*calls)), waiting

        assert _run(main()) == ([0, 1, 2, 3, 4], 5)  # all five were waiting at once
        with pytest.raises(GroupError, match=r"^gates:0\.fail failed: gate stuck$"):
            _run(group.acall(0, Gate.fail))
    finally:
        group.shutdown()
