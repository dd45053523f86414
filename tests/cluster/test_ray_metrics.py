"""The generic metric table and the Ray metrics sink (key patterns → tags, table checks, what gets recorded),
then the training run's table and the Grafana dashboard built on it."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
import warnings

import pytest
import ray
import torch
from ray.util import metrics as ray_metrics

from cluster.ray_metrics import METRIC_NAME, TAG_KEY, MetricSpec, RayMetricsSink, check_table
from jobs.config import load_config
from jobs.telemetry.dashboard import (
    GRAFANA_JSON,
    RUN_TAGS,
    STEP_METRIC,
    TABLE,
    dashboard_sink,
    grafana_dashboard,
)
from jobs.telemetry.tracking import derived_metrics
from learners.role_grads import advantage_mass, role_grad_metrics, step_role_shares
from marl.episode_metrics import episode_metrics
from marl.types import Completion, Episode, Task, Turn


@pytest.fixture
def recorded(monkeypatch):
    """Every Ray metric record as (kind, name, value, tags), while the real Ray methods still run (so Ray's
    own checks on names, tag keys and values apply)."""
    calls: list[tuple[str, str, float, dict]] = []
    for cls, method, kind in [(ray_metrics.Gauge, "set", "gauge"), (ray_metrics.Counter, "inc", "counter"),
                              (ray_metrics.Histogram, "observe", "histogram")]:
        real = getattr(cls, method)

        def spy(self, value, tags=None, _real=real, _kind=kind):
            calls.append((_kind, self.info["name"], value, dict(tags or {})))
            return _real(self, value, tags=tags)

        monkeypatch.setattr(cls, method, spy)
    return calls


def test_pattern_placeholders_become_tags():
    spec = MetricSpec("grad/cos/{role}__{other}", "m_cos")
    assert spec.tag_keys == ("role", "other")
    assert spec.match("grad/cos/generator__aggregator") == {"role": "generator", "other": "aggregator"}
    assert spec.match("grad/cos/generator") is None
    # A placeholder is one path segment: deeper keys do not match.
    assert MetricSpec("reward/mean/{role}", "m").match("reward/mean/a/b") is None
    assert MetricSpec("reward/mean", "m").match("reward/mean/generator") is None


@pytest.mark.parametrize(("spec", "fragment"), [
    (MetricSpec("a/{role}", "bad-name"), "invalid metric name"),
    (MetricSpec("a/{role}", "ns:name"), "invalid metric name"),
    (MetricSpec("a/{role}", "9lives"), "invalid metric name"),
    (MetricSpec("a/{bad-tag}", "ok"), "invalid tag key"),
    (MetricSpec("a/{__name__}", "ok"), "invalid tag key"),
    (MetricSpec("a/{run}", "ok"), "repeated tag key"),
    (MetricSpec("a", "ok", "summary"), "kind must be one of"),
    (MetricSpec("a", "ok", "histogram"), "boundaries"),
    (MetricSpec("a", "ok", "histogram", boundaries=(0.0, 1.0)), "boundaries"),
])
def test_check_table_names_the_bad_row(spec, fragment):
    with pytest.raises(ValueError, match=fragment):
        check_table([spec], constant_tags=("run",))


def test_one_name_cannot_take_two_shapes():
    with pytest.raises(ValueError, match="already registered"):
        check_table([MetricSpec("a/{role}", "m"), MetricSpec("b/{policy}", "m")])
    check_table([MetricSpec("time/{phase}_s", "m"), MetricSpec("other/{phase}", "m")])  # same shape is fine


def test_sink_records_each_kind_with_constant_and_key_tags(recorded):
    table = [MetricSpec("r/{role}", "t_reward"), MetricSpec("fail/{role}", "t_fail", "counter"),
             MetricSpec("time/step_s", "t_step", "histogram", boundaries=(1.0, 10.0))]
    sink = RayMetricsSink(table, {"run": "r1"}, step_metric="t_last_step")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Ray only warns (and drops the metric) on an invalid name
        sink.on_step(3, {"r/gen": 0.5, "fail/gen": 2.0, "fail/agg": 0.0, "time/step_s": 4.0,
                         "unmapped": 1.0, "r/nan": float("nan"), "r/text": "x"}, None)
    assert sorted(recorded) == sorted([
        ("gauge", "t_last_step", 3.0, {"run": "r1"}),
        ("gauge", "t_reward", 0.5, {"run": "r1", "role": "gen"}),
        ("counter", "t_fail", 2.0, {"run": "r1", "role": "gen"}),  # zero counts are no event
        ("histogram", "t_step", 4.0, {"run": "r1"}),
    ])


def test_sink_rejects_an_invalid_table_at_construction():
    with pytest.raises(ValueError, match="invalid metric name"):
        RayMetricsSink([MetricSpec("a", "a.b")])


# --- The training run's table (jobs.telemetry.dashboard) and its Grafana dashboard
# ---------------------------------

ROLES = ("generator", "aggregator")


def _turn(role: str, n_tokens: int, reward: float) -> Turn:
    completion = Completion("x" * n_tokens, [1, 2], list(range(n_tokens)), [0.0] * n_tokens)
    return Turn(role, role + "0", 0, [], completion, reward=reward)


def real_step_metrics(
    step: int, sharing: str = "isolated", accuracy: float | None = None
) -> dict[str, float]:
    """One voting step's metric dict built with the project's own metric functions (what the driver logs,
    less the learner's loss/lr/clip/entropy, which need a model)."""
    gen = torch.Generator().manual_seed(step)
    task = Task("t", "1+1?", "2", kind="digit")
    episodes = []
    for i in range(4):
        reward = float((i + step) % 2)
        turns = [_turn("generator", 3 + i, reward) for _ in range(3)] + [_turn("aggregator", 2, reward)]
        episodes.append(
            Episode(task, i, "voting", turns, reward=reward, parse_failures={"aggregator": i % 2})
        )
    m = episode_metrics(episodes, list(ROLES))
    grads = torch.randn(len(ROLES), 32, generator=gen)
    policies = [("shared", list(ROLES), grads)] if sharing == "shared" else [(r, [r], grads[[k]]) for k, r in
                                                                             enumerate(ROLES)]
    for pid, roles, g in policies:
        m.update(role_grad_metrics(g, roles, pid))
    turn_roles = [t.role for e in episodes for t in e.turns]
    advantages = torch.randn(len(turn_roles), generator=gen)
    m.update(advantage_mass(turn_roles, advantages, torch.full((len(turn_roles),), 4.0)))
    m.update(step_role_shares(m, list(ROLES)))
    m.update(
        {
            "time/rollout_s": 2.0,
            "time/update_s": 1.0,
            "time/sync_s": 0.5,
            "time/step_s": 3.5,
            "sync/bytes": 1e6,
        }
    )
    if accuracy is not None:
        m["eval/accuracy"] = accuracy
    return m


def test_every_table_name_and_tag_key_is_valid():
    check_table(TABLE, RUN_TAGS)  # also: one shape per name, histogram boundaries
    for spec in TABLE:
        assert METRIC_NAME.match(spec.name), spec
        assert all(TAG_KEY.match(k) for k in (*RUN_TAGS, *spec.tag_keys)), spec
        assert set(spec.tag_keys) <= {"role", "other_role", "policy", "phase"}, (
            f"high-cardinality tag in {spec}"
        )


def test_a_real_step_sets_the_per_role_dashboard_metrics(recorded):
    cfg = load_config("jobs/configs/tiny.yaml", ["run_name=r1"])
    metrics = real_step_metrics(0, accuracy=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dashboard_sink(cfg).on_step(0, {**metrics, **derived_metrics(metrics)}, None)
    run = {"run": "r1", "workflow": "voting", "sharing": "isolated"}
    got = {
        (kind, name, tuple(sorted((k, v) for k, v in tags.items() if k not in run)))
        for kind, name, _, tags in recorded
    }
    assert all({k: t[k] for k in run} == run for *_, t in recorded)
    per_role = {("gauge", n, (("role", r),)) for n in ("marl_reward_mean", "marl_response_length_mean",
                                                        "marl_grad_role_norm", "marl_grad_mass_share",
                                                        "marl_grad_norm_share", "marl_truncated_fraction")
                for r in ROLES}
    assert per_role <= got
    assert {("gauge", "marl_grad_dominance", (("policy", r),)) for r in ROLES} <= got
    assert {
        ("gauge", "marl_phase_seconds", (("phase", p),)) for p in ("rollout", "update", "sync", "step")
    } <= got
    assert {
        ("gauge", "marl_eval_accuracy", ()),
        ("histogram", "marl_step_seconds", ()),
        ("gauge", "marl_step", ()),
        ("gauge", "marl_rollout_tokens_per_second", ()),
    } <= got
    # Parse failures are counted where they happened only (the generator had none this step).
    assert ("counter", "marl_parse_failures", (("role", "aggregator"),)) in got
    assert ("counter", "marl_parse_failures", (("role", "generator"),)) not in got
    values = {(name, tags.get("role")): v for _, name, v, tags in recorded}
    assert values[("marl_reward_mean", "generator")] == metrics["reward/mean/generator"]
    assert (
        values[("marl_parse_failures", "aggregator")] == metrics["rollout/parse_failures/aggregator"] == 2.0
    )


_REF = re.compile(r"\bray_([a-zA-Z_][a-zA-Z0-9_]*)(\{[^}]*\})?")
_SUFFIXES = {"gauge": ("",), "counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def _table_metric(exported: str) -> tuple[MetricSpec, str]:
    for spec in (*TABLE, MetricSpec("step", STEP_METRIC)):
        for suffix in _SUFFIXES[spec.kind]:
            if exported == spec.name + suffix:
                return spec, suffix
    raise AssertionError(
        f"ray_{exported} is not a metric of the table (or has the wrong suffix for its kind)"
    )


def test_grafana_json_is_generated_from_the_table_and_references_only_its_metrics():
    committed = json.loads(GRAFANA_JSON.read_text())
    assert committed == grafana_dashboard(), "stale: regenerate with python -m jobs.telemetry.dashboard"
    panels = [p for p in committed["panels"] if p["type"] != "row"]
    for panel in panels:
        for target in panel["targets"]:
            refs = _REF.findall(target["expr"])
            assert refs, panel["title"]
            for exported, selector in refs:
                spec, suffix = _table_metric(exported)
                labels = set(re.findall(r"(\w+)\s*=~?", selector))
                allowed = {*RUN_TAGS, *spec.tag_keys, *(("le",) if suffix == "_bucket" else ())}
                assert labels <= allowed, (panel["title"], labels - allowed)
    titles = " | ".join(p["title"].lower() for p in panels)
    for topic in ("reward per role", "accuracy", "gradient norm per role", "mass share per role", "phase",
                  "tokens/s", "parse failures per role"):
        assert topic in titles, topic
    for var in committed["templating"]["list"][1:]:
        _table_metric(var["query"].split("(ray_")[1].split(",")[0])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_real_ray_cluster_exports_every_metric_the_dashboard_queries():
    """Scrapes Ray's Prometheus endpoint: the `ray_` prefix and the counter/histogram suffixes the Grafana
    expressions assume are what Ray really exports."""
    port = _free_port()
    ray.init(address="local", num_cpus=1, include_dashboard=False, _metrics_export_port=port,
             _system_config={"metrics_report_interval_ms": 500})
    try:
        sink = dashboard_sink(load_config("jobs/configs/tiny.yaml", []))
        # One key per table row, every placeholder filled in, every value > 0 so counters count too.
        step = {s.pattern.format(**{k: "generator" for k in s.tag_keys}): 1.0 for s in TABLE}
        queried = {name for p in grafana_dashboard()["panels"] for t in p.get("targets", [])
                   for name in re.findall(r"\bray_\w+", t["expr"])}
        exported: set[str] = set()
        deadline = time.monotonic() + 120
        while not queried <= exported and time.monotonic() < deadline:
            sink.on_step(0, step, None)
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            exported = {
                line.split("{")[0].split()[0] for line in text.splitlines() if line.startswith("ray_marl")
            }
            # the exporter runs on its own period; poll it until the names show up or time runs out
            time.sleep(0.5)
        assert queried <= exported, sorted(queried - exported)
    finally:
        ray.shutdown()
