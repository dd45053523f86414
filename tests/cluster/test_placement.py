"""cluster.placement: the layout of bundles, members scheduled into the bundle they were given, adopting an
enclosing placement group (a Tune trial's), an unsatisfiable placement group failing within its deadline
with the resource named, one removed when a stop comes while it waits, and release."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import ray
from ray.util.placement_group import placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from cluster.bundles import TOKEN_CPU, Demand, layout
from cluster.group import Group, GroupError
from cluster.placement import GroupPlacement, PlacementError, place
from cluster.stop import StopRequested, sigterm_stops

SLOTS = {"slot0": 1, "slot1": 1, "slot2": 1}  # one unit each: a bundle holding slotK can only be bundle K
RAY_RESOURCES = SLOTS  # the `ray_cluster` fixture's cluster has them (tests/conftest.py)


class Probe:
    def where(self) -> tuple[str | None, dict[str, float]]:
        ctx = ray.get_runtime_context()
        return ctx.get_placement_group_id(), ctx.get_assigned_resources()


def _state(pg) -> str:
    return placement_group_table(pg)["state"]


def test_layout_gives_every_member_a_bundle_after_the_head():
    plan = layout(
        [Demand("e", 2, {"CPU": 0.5, "GPU": 1}), Demand("l", 0, {"CPU": 1}), Demand("x", 1, {"CPU": 1})],
        head={"CPU": 1},
    )
    assert plan.bundles == [{"CPU": 1.0}, {"CPU": 0.5, "GPU": 1.0}, {"CPU": 0.5, "GPU": 1.0}, {"CPU": 1.0}]
    assert plan.indices == {"e": [1, 2], "l": [], "x": [3]}


def test_a_member_asking_for_nothing_still_gets_a_bundle_of_its_own():
    plan = layout([Demand("e", 1, {"CPU": 0, "GPU": 0})])
    assert plan.bundles == [{"CPU": TOKEN_CPU}]
    with pytest.raises(ValueError, match="two groups named 'e'"):
        layout([Demand("e", 1, {}), Demand("e", 1, {})])


def test_members_run_in_the_bundles_they_are_given(ray_cluster):
    bundles = [{"CPU": 0.5, f"slot{k}": 1.0} for k in range(3)]
    pg = placement_group(bundles, strategy="PACK")
    assert pg.wait(30)
    try:
        # Member 0 into bundle 2, member 1 into bundle 0: each bundle's slot resource shows where it ran.
        group = Group(Probe, 2, "probe", placement=GroupPlacement(pg, [2, 0], [bundles[2], bundles[0]]))
        where = group.submit(Probe.where).result(60)
        assert [w[0] for w in where] == [pg.id.hex()] * 2
        assert where[0][1] == {"CPU": 0.5, "slot2": 1.0} and where[1][1] == {"CPU": 0.5, "slot0": 1.0}
        group.shutdown()
    finally:
        ray.util.remove_placement_group(pg)
    with pytest.raises(GroupError, match="2 members but 1 placement bundles"):
        Group(Probe, 2, "probe", placement=GroupPlacement(pg, [0], [bundles[0]]))


def test_run_placement_holds_every_group_and_is_released(ray_cluster):
    rp = place([Demand("run:a", 2, {"CPU": 0.5}), Demand("run:b", 1, {"CPU": 0.25, "slot1": 1}),
                Demand("run:c", 0, {"CPU": 1})], strategy="PACK", timeout_s=30, name="run:placement")
    assert rp is not None and rp.owned and _state(rp.pg) == "CREATED"
    assert rp.group("run:c") is None  # in-process: no bundles
    with pytest.raises(PlacementError, match="no bundles were laid out for group 'run:d'"):
        rp.group("run:d")
    b = Group(Probe, 1, "run:b", placement=rp.group("run:b"))
    assert b.submit(Probe.where).result(60)[0] == (rp.pg.id.hex(), {"CPU": 0.25, "slot1": 1.0})
    b.shutdown()
    rp.release()
    assert _state(rp.pg) == "REMOVED"
    assert place([Demand("run:a", 0, {"CPU": 1})]) is None  # nothing remote, no placement group


def test_unsatisfiable_placement_fails_within_its_deadline_naming_the_resource(ray_cluster):
    t0 = time.monotonic()
    with pytest.raises(PlacementError) as err:
        place([Demand("run:engine:gen", 2, {"CPU": 0.5, "GPU": 1}), Demand("run:learner:p", 1, {"CPU": 0.5})],
              timeout_s=1.0, name="too_big")
    assert time.monotonic() - t0 < 10
    msg = str(err.value)
    assert "'too_big'" in msg and "GPU: needs 2, cluster has 0" in msg and "run:engine:gen (2 x 1)" in msg
    assert all(v["state"] == "REMOVED" for v in placement_group_table().values() if v["name"] == "too_big")
    with pytest.raises(PlacementError, match="strategy must be one of"):
        place([Demand("a", 1, {"CPU": 0.1})], strategy="TIGHT")


def test_a_stop_while_waiting_for_the_cluster_removes_the_placement_group(ray_cluster):
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    with sigterm_stops():
        timer.start()
        with pytest.raises(StopRequested):
            place([Demand("run:engine:gen", 1, {"CPU": 0.5, "GPU": 1})], timeout_s=60.0, name="stopped")
        timer.join()
    assert all(v["state"] == "REMOVED" for v in placement_group_table().values() if v["name"] == "stopped")


@ray.remote(num_cpus=0)
def _adopt(demands: list[Demand]) -> tuple[str, bool, dict[str, list[int]]] | str:
    try:
        rp = place(demands, strategy="STRICT_SPREAD")  # ignored: the enclosing group's layout is used
    except PlacementError as e:
        return str(e)
    assert rp is not None
    return rp.pg.id.hex(), rp.owned, rp.layout.indices


def test_inside_a_placement_group_its_bundles_after_the_head_are_used(ray_cluster):
    pg = placement_group([{"CPU": 0.5}, {"CPU": 0.25}, {"CPU": 0.25}, {"CPU": 0.5}])
    assert pg.wait(30)
    try:
        inside = _adopt.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0))
        demands = [Demand("e", 2, {"CPU": 0.25}), Demand("l", 1, {"CPU": 0.5})]
        assert ray.get(inside.remote(demands), timeout=60) == (pg.id.hex(), False, {"e": [1, 2], "l": [3]})
        msg = ray.get(inside.remote([Demand("e", 2, {"CPU": 1.0})]), timeout=60)
        assert "current placement group has bundles" in msg
    finally:
        ray.util.remove_placement_group(pg)
