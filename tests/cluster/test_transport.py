"""cluster.transport.broadcast (versioned weight sync between groups, in-process and Ray) and
cluster.collective (a gloo process group among a group's Ray members).

Ray workers import this module to rebuild the member classes, so torch is imported only where it is used:
the sink processes then start without it (the transport is payload-agnostic; numpy arrays stand in for
tensors there).
"""

from __future__ import annotations

import numpy as np
import pytest

from cluster.fingerprint import fingerprint
from cluster.group import Group, GroupTimeout, MemberOptions
from cluster.member import Call
from cluster.transport import SyncError, broadcast

CPU = MemberOptions(num_cpus=0.5)
TIMEOUT = 60.0


def _state(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": np.arange(5, dtype=np.float64) + seed}


STATE_BYTES = 4 * 3 * 4 + 5 * 8


class Rank:
    """A data-parallel rank (stands in for a learner): joins a process group through cluster.collective
    and exports its state, which differs per rank so a payload taken from the wrong rank is caught."""

    def __init__(self, rank: int):
        self.rank = rank

    def state(self) -> dict[str, np.ndarray]:
        return _state(100 + self.rank)

    def rendezvous_address(self) -> tuple[str, int]:
        from cluster import collective

        return collective.rendezvous_address()

    def join(self, backend: str, host: str, port: int, rank: int, world_size: int, timeout_s: float) -> None:
        from cluster import collective

        collective.join(backend, host, port, rank, world_size, timeout_s)

    def doubled_fingerprint(self) -> float:
        """What a DoublingSink must serve from this rank's state: the sender's side of a payload that the
        destinations transform (as engines merge an adapter) rather than serve as sent."""
        return fingerprint({k: v * 2 for k, v in self.state().items()})

    def all_reduce(self, values: list[float]) -> tuple[int, int, list[float]]:
        import torch
        import torch.distributed as dist

        t = torch.tensor(values)
        dist.all_reduce(t)  # SUM by default
        return dist.get_rank(), dist.get_world_size(), t.tolist()


class Sink:
    """Stands in for an engine: serves what it received. A `stale` member ignores the version it is sent
    and keeps reporting the one it had."""

    def __init__(self, stale: bool = False):
        self.stale, self.version = stale, 0
        self.weights: dict[str, np.ndarray] | None = None

    def receive(self, weights: dict[str, np.ndarray], version: int) -> dict[str, float]:
        self.weights = {k: np.array(v) for k, v in weights.items()}
        if not self.stale:
            self.version = version
        return {"version": self.version, "bytes": sum(v.nbytes for v in weights.values())}

    def served(self) -> tuple[int, dict[str, np.ndarray] | None]:
        return self.version, self.weights


def _sinks(n: int, name: str, stale: tuple[int, ...] = ()) -> Group:
    kwargs = [{"stale": i in stale} for i in range(max(n, 1))]
    return Group(Sink, n, name, options=CPU, per_member_kwargs=kwargs)


@pytest.fixture(scope="module")
def ranks(ray_cluster):
    group = Group(Rank, 2, "ranks", options=CPU, per_member_kwargs=[{"rank": r} for r in range(2)])
    yield group
    group.shutdown()


@pytest.fixture(scope="module")
def sinks(ray_cluster):
    groups = {0: _sinks(0, "sink0"), 2: _sinks(2, "sink2")}
    yield groups
    for g in groups.values():
        g.shutdown()


@pytest.fixture(params=["local", "remote"], ids=["local-src", "remote-src"])
def source(request, ranks):
    """(source group, the payload its rank 0 exports)."""
    if request.param == "remote":
        return ranks, _state(100)
    return Group(Rank, 0, "src0", per_member_kwargs=[{"rank": 0}]), _state(100)


def _assert_serving(groups: list[Group], version: int, expected: dict[str, np.ndarray]) -> None:
    for g in groups:
        for i, (served_version, weights) in enumerate(g.submit(Sink.served).result(TIMEOUT)):
            assert served_version == version, f"{g.name}:{i}"
            assert weights is not None
            assert weights.keys() == expected.keys()
            for k in expected:
                np.testing.assert_array_equal(weights[k], expected[k], err_msg=f"{g.name}:{i} {k}")


@pytest.mark.parametrize("dst_kinds", [(0,), (2,), (0, 2)], ids=["local", "remote", "mixed"])
def test_broadcast_delivers_rank0_payload_and_counts_bytes(source, sinks, dst_kinds):
    src, state = source
    dsts = [sinks[n] for n in dst_kinds]
    version = 10 * src.n + len(dst_kinds) + dst_kinds[-1]  # distinct per case: a stale sink cannot pass
    out = broadcast(src, Rank.state, dsts, Sink.receive, version, TIMEOUT)
    assert out["bytes"] == float(STATE_BYTES * sum(g.size for g in dsts))
    assert out["sync_s"] > 0
    _assert_serving(dsts, version, state)


@pytest.mark.parametrize("stale_n", [0, 2], ids=["local-stale", "remote-stale"])
def test_destination_on_wrong_version_raises_sync_error_naming_it(sinks, stale_n):
    src = Group(Rank, 0, "src-stale", per_member_kwargs=[{"rank": 0}])
    index = max(stale_n - 1, 0)  # the last member is the stale one
    stale = _sinks(stale_n, f"stale{stale_n}", stale=(index,))
    try:
        with pytest.raises(
            SyncError, match=rf"^stale{stale_n}:{index} reports weight version 0, expected 42$"
        ):
            broadcast(src, Rank.state, [sinks[0], stale], Sink.receive, 42, TIMEOUT)
    finally:
        stale.shutdown()
        src.shutdown()


class CheckedSink(Sink):
    """Reports the fingerprint of what it serves. A `skipping` member keeps its old weights but still claims
    the new version (the failure only a fingerprint catches); a `hung` one never answers in time."""

    def __init__(self, skipping: bool = False, hung: bool = False):
        super().__init__()
        self.skipping, self.hung, self.weights = skipping, hung, _state(0)

    def receive(self, weights: dict[str, np.ndarray], version: int) -> dict[str, float]:
        if self.hung:
            import time

            time.sleep(10)
        if not self.skipping:
            self.weights = {k: np.array(v) for k, v in weights.items()}
        self.version = version
        return {"version": version, "bytes": STATE_BYTES, "fingerprint": fingerprint(self.weights or {})}


class DoublingSink(CheckedSink):
    """Serves twice what it is sent (a `skipping` one: what it was sent) and fingerprints what it serves."""

    def receive(self, weights: dict[str, np.ndarray], version: int) -> dict[str, float]:
        factor = 1 if self.skipping else 2
        return super().receive({k: np.asarray(v) * factor for k, v in weights.items()}, version)


def _checked(n: int, name: str, **flags_of_last: bool) -> Group:
    kwargs: list[dict[str, bool]] = [{} for _ in range(max(n, 1) - 1)] + [flags_of_last]
    return Group(CheckedSink, n, name, options=CPU, per_member_kwargs=kwargs)


@pytest.mark.parametrize("n", [0, 2], ids=["local", "remote"])
def test_fingerprints_of_every_member_are_verified(source, n):
    src, state = source
    dst = _checked(n, f"ok{n}")
    try:
        out = broadcast(src, Rank.state, [dst], Sink.receive, 3, TIMEOUT, fingerprint=fingerprint)
        assert out["verified"] == float(dst.size)
        _assert_serving([dst], 3, state)
    finally:
        dst.shutdown()


@pytest.mark.parametrize("n", [0, 2], ids=["local", "remote"])
def test_member_that_skipped_the_load_is_caught_by_fingerprint_and_named(source, n):
    src, _ = source
    dst = _checked(n, f"run:engine:generator{n}", skipping=True)
    index = max(n - 1, 0)
    try:
        with pytest.raises(
            SyncError, match=rf"^run:engine:generator{n}:{index} serves weights with fingerprint"
        ):
            broadcast(src, Rank.state, [dst], Sink.receive, 4, TIMEOUT, fingerprint=fingerprint)
    finally:
        dst.shutdown()


@pytest.mark.parametrize("n", [0, 1], ids=["local", "remote"])
def test_the_senders_fingerprint_can_come_from_a_member_method_and_still_catches_a_skipped_load(source, n):
    """`expect`: the source member computes what the destinations must serve (they transform the payload)."""
    src, state = source
    ok = Group(DoublingSink, n, f"double{n}", options=CPU)
    skipping = Group(DoublingSink, n, f"run:engine:skip{n}", options=CPU,
                     per_member_kwargs=[{"skipping": True} for _ in range(max(n, 1))])
    try:
        out = broadcast(src, Rank.state, [ok], Sink.receive, 6, TIMEOUT, expect=Rank.doubled_fingerprint)
        assert out["verified"] == float(ok.size)
        _assert_serving([ok], 6, {k: v * 2 for k, v in state.items()})
        with pytest.raises(SyncError, match=rf"^run:engine:skip{n}:0 serves weights with fingerprint"):
            broadcast(src, Rank.state, [skipping], Sink.receive, 7, TIMEOUT, expect=Rank.doubled_fingerprint)
    finally:
        ok.shutdown()
        skipping.shutdown()


@pytest.mark.parametrize("n", [0, 1], ids=["local", "remote"])
def test_hung_member_trips_the_sync_deadline_and_is_named(ray_cluster, n):
    src = Group(Rank, 0, "src-hung", per_member_kwargs=[{"rank": 0}])
    dst = _checked(n, f"run:engine:aggregator{n}", hung=True)
    try:
        with pytest.raises(
            GroupTimeout, match=rf"run:engine:aggregator{n}:0\.receive missed its [0-9.]+s deadline"
        ):
            broadcast(src, Rank.state, [dst], Sink.receive, 5, 1.0, fingerprint=fingerprint)
    finally:
        dst.shutdown()
        src.shutdown()


def test_init_collective_then_all_reduce_sums_across_ranks(ranks):
    from cluster.collective import init_collective

    init_collective(ranks, "gloo", TIMEOUT)
    out = ranks.submit_each([Call(Rank.all_reduce, [1.0, 2.0]), Call(Rank.all_reduce, [10.0, 20.0])]).result(
        TIMEOUT
    )
    assert out == [(0, 2, [11.0, 22.0]), (1, 2, [11.0, 22.0])]


def test_init_collective_is_a_no_op_for_one_member(monkeypatch):
    import torch.distributed as dist

    from cluster.collective import init_collective

    # Watched, not asserted on dist.is_initialized(): an in-process vLLM engine of an earlier module may have
    # left this process a group of its own (vLLM keeps it for the engines after it).
    made: list[dict] = []
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **kw: made.append(kw))
    group = Group(Rank, 0, "solo", per_member_kwargs=[{"rank": 0}])
    init_collective(group, "gloo", TIMEOUT)  # a rendezvous of one would need a port and a process group
    assert made == []
    group.shutdown()


def test_broadcast_to_chosen_members_leaves_the_others_alone(ray_cluster):
    """What a replaced engine's catch-up uses: only member 1 loads, and the report names it by its index."""
    src = Group(Rank, 0, "src-some", per_member_kwargs=[{"rank": 0}])
    dst = _checked(2, "some", skipping=True)  # member 1 skips its load: the error must name index 1
    try:
        with pytest.raises(SyncError, match=r"^some:1 serves weights with fingerprint"):
            broadcast(src, Rank.state, [dst], Sink.receive, 6, TIMEOUT, fingerprint=fingerprint, indices=[1])
        out = broadcast(
            src, Rank.state, [dst], Sink.receive, 7, TIMEOUT, fingerprint=fingerprint, indices=[0]
        )
        assert out["verified"] == 1.0 and out["bytes"] == float(STATE_BYTES)
        assert [v for v, _ in dst.submit(Sink.served).result(TIMEOUT)] == [7, 6]
    finally:
        dst.shutdown()
        src.shutdown()
