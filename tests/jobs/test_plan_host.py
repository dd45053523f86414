"""The host's memory on a one-machine CPU run: the CPU members plus Ray and the driver against the machine,
a warning above 80 % naming what lowers it, not checked where the members may spread over nodes, and the
plan CLI printing it."""

import sys
import types

import psutil
import pytest

from jobs.config import load_config
from jobs.plan import host
from jobs.plan.layout import run_layout
from jobs.plan.planner import make_plan
from jobs.train import main
from learners.compute.memory import GIB

TINY = "jobs/configs/tiny.yaml"


@pytest.fixture(scope="module")
def tiny_plan():
    return make_plan(run_layout(load_config(TINY, [])), times=False)


def test_the_host_holds_every_cpu_member_and_ray_and_the_driver(tiny_plan):
    cpu = [m for m in tiny_plan.members if m.gpus <= 0]
    assert len(cpu) == 4  # tiny.yaml: voting isolated, an engine and a learner per policy
    assert host.host_planned(tiny_plan) == pytest.approx(sum(m.peak for m in cpu) + host.HOST_OVERHEAD)


def test_the_line_warns_above_80_percent_and_says_which_side_of_the_monitor():
    assert host.host_line(0.0, 24 * GIB) == ""  # no CPU member
    assert "not checked" in host.host_line(10 * GIB, 0.0)
    quiet = host.host_line(10 * GIB, 20 * GIB)
    assert "(50%)" in quiet and "WARNING" not in quiet
    close = host.host_line(17 * GIB, 20 * GIB)
    assert "(85%)" in close and "close to the 95%" in close and "rollout.vllm.kv_cache_gb" in close
    assert "over the 95%" in host.host_line(19.5 * GIB, 20 * GIB)


def test_the_warning_at_start_comes_only_above_80_percent(tiny_plan, capsys):
    planned = host.host_planned(tiny_plan)
    assert host.host_warning(tiny_plan, planned / 0.79) is None
    assert "WARNING" in host.host_warning(tiny_plan, planned / 0.81)
    assert host.host_warning(tiny_plan, 0.0) is None  # not checked


def fake_ray(nodes: list[dict], here: str) -> types.ModuleType:
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: True
    ray.nodes = lambda: nodes
    ray.util = types.SimpleNamespace(get_node_ip_address=lambda: here)
    return ray


def test_the_host_is_this_machine_only_where_every_member_must_live_on_it(monkeypatch):
    total = float(psutil.virtual_memory().total)
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert host.this_host_memory(None) == total  # an embedded cluster will start here
    assert host.this_host_memory("ray://head:10001") == 0.0
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    assert host.this_host_memory(None) == 0.0
    node = {"Alive": True, "NodeManagerAddress": "10.0.0.1"}
    monkeypatch.setitem(sys.modules, "ray", fake_ray([node, {"Alive": False}], "10.0.0.1"))
    assert host.this_host_memory("auto") == total  # connected: one alive node, this one
    monkeypatch.setitem(sys.modules, "ray", fake_ray([node], "10.0.0.2"))
    assert host.this_host_memory("auto") == 0.0  # the one node is another machine
    monkeypatch.setitem(sys.modules, "ray", fake_ray([node, {**node, "NodeManagerAddress": "10.0.0.2"}],
                                                     "10.0.0.1"))
    assert host.this_host_memory("auto") == 0.0  # two nodes: Ray may place members on either


def test_the_plan_cli_prints_the_host_against_this_machine(monkeypatch, capsys):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["--config", TINY, "--plan"]) == 0
    out = capsys.readouterr().out
    assert f"of this machine's {psutil.virtual_memory().total / GIB:.1f} GiB" in out
    assert main(["--config", TINY, "--plan", "ray.address=ray://head:10001"]) == 0
    assert "not checked (the members may spread over nodes)" in capsys.readouterr().out
