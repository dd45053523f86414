"""Members' thread pools follow their CPUs: a pure rule, and the environment an actor really gets."""

import os

from cluster.group import Group, MemberOptions
from cluster.threads import thread_env, threads_for


def test_threads_follow_cpus_unless_configured():
    assert threads_for(0.5) == 1 and threads_for(2.0) == 2 and threads_for(3.7) == 3
    assert threads_for(0.5, configured=4) == 4
    assert thread_env(2) == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2",
                             "OMP_WAIT_POLICY": "PASSIVE"}


class _Probe:
    def env(self) -> dict[str, str]:
        import torch

        keys = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY")
        return {**{k: os.environ.get(k, "") for k in keys}, "torch": str(torch.get_num_threads())}


def test_an_actor_gets_as_many_threads_as_cpus_and_explicit_env_wins(ray_cluster):
    two = Group(_Probe, 1, "threads-two", options=MemberOptions(num_cpus=2))
    pinned = Group(_Probe, 1, "threads-pinned", options=MemberOptions(num_cpus=2, env=thread_env(1)))
    try:
        assert two.submit(_Probe.env).result(60)[0] == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2",
                                                  "OMP_WAIT_POLICY": "PASSIVE", "torch": "2"}
        got = pinned.submit(_Probe.env).result(60)[0]
        assert got["OMP_NUM_THREADS"] == got["MKL_NUM_THREADS"] == got["torch"] == "1"
    finally:
        two.shutdown()
        pinned.shutdown()


class _LogEnv:
    def env(self) -> dict[str, str]:
        return {k: os.environ.get(k, "") for k in ("DS_ACCELERATOR", "TORCH_CPP_LOG_LEVEL", "PYTHONWARNINGS")}


def test_an_actor_gets_the_log_settings_its_creator_set_after_the_cluster_started(ray_cluster, monkeypatch):
    # Values the cluster cannot have inherited at its start: only forwarding gets them to the actor, as a
    # sweep trial's quiet_logs settings must reach its learners.
    monkeypatch.setenv("DS_ACCELERATOR", "cpu-forwarded")
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "FATAL")
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    plain = Group(_LogEnv, 1, "log-env")
    own = Group(_LogEnv, 1, "log-env-own", options=MemberOptions(env={"TORCH_CPP_LOG_LEVEL": "INFO"}))
    try:
        got = plain.submit(_LogEnv.env).result(60)[0]
        assert got["DS_ACCELERATOR"] == "cpu-forwarded" and got["TORCH_CPP_LOG_LEVEL"] == "FATAL"
        assert own.submit(_LogEnv.env).result(60)[0]["TORCH_CPP_LOG_LEVEL"] == "INFO"  # the caller's env wins
    finally:
        plain.shutdown()
        own.shutdown()


def test_a_gpu_member_detects_its_own_accelerator(monkeypatch):
    from cluster.driver_env import driver_env

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # what a driver on a CPU-only head node sets for itself
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "ERROR")
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    assert driver_env(cpu_only=True) == {"DS_ACCELERATOR": "cpu", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    assert driver_env(cpu_only=False) == {"TORCH_CPP_LOG_LEVEL": "ERROR"}
