"""Which cluster the driver uses, and a cluster that does not answer failing within its deadline, naming the
address, where it came from and a fix (exit code 2 for jobs.train and jobs.sweep). A live `ray start` head is
in tests/jobs/test_head_runs.py."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import pytest

from cluster import connect as cc
from cluster.connect import (
    CONFIG,
    ENVIRONMENT,
    LOCAL,
    ConnectError,
    Target,
    choose,
    init_kwargs,
    open_cluster,
)
from jobs import sweep, train
from tests.ray_head import free_port

NO_MARKER = Path("/nonexistent/ray_current_cluster")


@pytest.fixture
def marker(tmp_path, monkeypatch) -> Path:
    """Ray's marker file under a private RAY_TMPDIR (never /tmp/ray, which other
    clusters on the machine use)."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (tmp_path / "ray").mkdir()
    return tmp_path / "ray" / "ray_current_cluster"


@pytest.mark.parametrize(
    ("address", "env", "recorded", "expected"),
    [
        ("", {}, "", Target(LOCAL, "default")),
        ("", {}, "10.0.0.1:6379", Target(LOCAL, "default")),  # a `ray start` head does not capture the run
        ("local", {"RAY_ADDRESS": "10.0.0.2:6379"}, "", Target(LOCAL, CONFIG)),
        ("10.0.0.3:6379", {"RAY_ADDRESS": "10.0.0.2:6379"}, "", Target("10.0.0.3:6379", CONFIG)),
        ("", {"RAY_ADDRESS": "10.0.0.2:6379"}, "10.0.0.1:6379", Target("10.0.0.2:6379", ENVIRONMENT)),
        ("auto", {"RAY_ADDRESS": "10.0.0.2:6379"}, "10.0.0.1:6379", Target("10.0.0.2:6379", ENVIRONMENT)),
        ("auto", {}, "10.0.0.1:6379", Target("10.0.0.1:6379", "the `ray start` marker file {marker}")),
        (
            "",
            {"RAY_ADDRESS": "auto"},
            "10.0.0.1:6379",
            Target("10.0.0.1:6379", "the `ray start` marker file {marker}"),
        ),
    ],
)
def test_the_choice_of_cluster(tmp_path, address, env, recorded, expected):
    marker = tmp_path / "ray_current_cluster"
    if recorded:
        marker.write_text(recorded + "\n")
    assert choose(address, env, marker) == Target(expected.address, expected.source.format(marker=marker))


def test_auto_without_a_marker_file_says_what_is_missing():
    with pytest.raises(
        ConnectError, match=r"address 'auto' \(from config \(ray\.address\)\) .* there is none"
    ):
        choose("auto", {}, NO_MARKER)


def test_a_joined_cluster_gets_no_resource_arguments():
    assert init_kwargs(Target("10.0.0.1:6379", CONFIG), num_cpus=4, include_dashboard=True) == {
        "address": "10.0.0.1:6379"}
    assert init_kwargs(Target(LOCAL, "default"), num_cpus=4, include_dashboard=False) == {
        "address": "local", "num_cpus": 4, "include_dashboard": False}


def test_host_port():
    assert cc.host_port("ray://head:10001") == ("head", 10001)
    assert cc.host_port("127.0.0.1:6379") == ("127.0.0.1", 6379)
    with pytest.raises(ValueError, match="'head' is not host:port"):
        cc.host_port("head")


def _accept_until_closed(server: socket.socket) -> None:
    """Accepts connections and never speaks, until the test closes `server` under it."""
    with contextlib.suppress(OSError):
        while True:
            server.accept()


def test_a_dead_port_and_a_socket_that_is_not_grpc_do_not_answer():
    with socket.socket() as silent:  # accepts connections, never speaks
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        threading.Thread(target=_accept_until_closed, args=(silent,), daemon=True).start()
        t0 = time.monotonic()
        assert not cc.answers(f"127.0.0.1:{silent.getsockname()[1]}", 1.0)
        assert not cc.answers(f"127.0.0.1:{free_port()}", 1.0)
        assert time.monotonic() - t0 < 10


def test_the_embedded_line_mentions_a_stale_marker(marker):
    assert cc.local_note(marker) == ""
    dead = f"127.0.0.1:{free_port()}"
    marker.write_text(dead)
    assert (
        cc.local_note(marker, probe_s=0.5) == f"; {marker} names {dead}, which does not answer (a head gone "
        "without `ray stop`)"
    )


@pytest.mark.parametrize("source", ["config", "environment", "marker"])
def test_a_dead_cluster_fails_within_its_deadline_naming_address_source_and_fix(marker, monkeypatch, source):
    dead = f"127.0.0.1:{free_port()}"
    address = {"config": dead, "environment": "", "marker": "auto"}[source]
    if source == "environment":
        monkeypatch.setenv("RAY_ADDRESS", dead)
    marker.write_text(dead)
    named = {
        "config": r"config \(ray\.address\)\) .*; fix ray\.address",
        "environment": r"environment \(RAY_ADDRESS\)\) .*; fix or unset RAY_ADDRESS",
        "marker": rf"the `ray start` marker file {marker}\) .* run `ray stop` or delete the marker file",
    }[source]
    t0 = time.monotonic()
    with pytest.raises(ConnectError, match=rf"no Ray cluster answers at {dead} \(from {named}"):
        open_cluster(address, num_cpus=2, timeout_s=1.5)
    assert time.monotonic() - t0 < 15  # the deadline (1.5 s) and nothing like Ray's own minutes of retries


def test_train_and_sweep_exit_2_on_a_dead_cluster(marker, tmp_path, capsys):
    dead = f"127.0.0.1:{free_port()}"
    overrides = [f"out_dir={tmp_path}", "steps=1", f"ray.address={dead}", "ray.connect_timeout_s=1"]
    assert train.main(["--config", "jobs/configs/tiny.yaml", *overrides]) == 2
    assert (
        f"no Ray cluster answers at {dead} (from config (ray.address)) within 1s" in capsys.readouterr().err
    )
    sweep_overrides = [f"storage_path={tmp_path}/sweeps", f"ray.address={dead}", "ray.connect_timeout_s=1"]
    assert sweep.main(["--config", "jobs/configs/sweeps/tiny_matrix.yaml", *sweep_overrides]) == 2
    assert (
        f"no Ray cluster answers at {dead} (from config (ray.address)) within 1s" in capsys.readouterr().err
    )
