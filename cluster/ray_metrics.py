"""Dashboard metrics: flat metric dicts with stable keys → Ray Gauges, Counters and Histograms.

A declarative table of `MetricSpec`s says which key becomes which Ray metric: the key pattern's `{tag}`
placeholders each match one `/`-separated segment and become tags (low cardinality by construction: a
segment names a role or a policy, never a sample). Constant tags (run, workflow, ...) are added to every
record. This module knows nothing of what the keys mean; the table is data handed in by the caller.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KINDS = ("gauge", "counter", "histogram")
# Prometheus' metric-name grammar without ':' (reserved for recording rules; Ray warns it will reject it).
METRIC_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# Prometheus label names; a leading "__" is reserved for Prometheus' own labels.
TAG_KEY = re.compile(r"^(?!__)[a-zA-Z_][a-zA-Z0-9_]*$")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")

# An inf value, or a NaN under NAN_IS_A_VALUE (a gradient gone non-finite; elsewhere NaN means "undefined this
# step"), as every metric sink of a run records it (jobs/telemetry/tracking.py).
NONFINITE_SENTINEL = 3.0e38  # the top of float32's range, which every sink stores
NAN_IS_A_VALUE = ("grad/", "last/grad/")


@dataclass(frozen=True)
class MetricSpec:
    """One row of the table: metric keys matching `pattern` are recorded as Ray metric `name`.

    pattern: a literal key with `{tag}` placeholders (`reward/mean/{role}`); kind: gauge (last value),
    counter (adds each step's value; only values > 0 are counted) or histogram (observes each value into
    `boundaries`)."""

    pattern: str
    name: str
    kind: str = "gauge"
    description: str = ""
    boundaries: tuple[float, ...] = ()

    @property
    def tag_keys(self) -> tuple[str, ...]:
        return tuple(_PLACEHOLDER.findall(self.pattern))

    def match(self, key: str) -> dict[str, str] | None:
        """The tags a metric key yields, or None when the key does not match."""
        m = _compiled(self.pattern).match(key)
        return None if m is None else m.groupdict()


@functools.cache
def _compiled(pattern: str) -> re.Pattern[str]:
    parts = _PLACEHOLDER.split(pattern)  # literal, tag, literal, tag, ..., literal
    regex = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+?)" for i, p in enumerate(parts))
    return re.compile(f"^{regex}$")


def check_table(table: Iterable[MetricSpec], constant_tags: Iterable[str] = ()) -> None:
    """Raises ValueError naming every invalid row: bad metric names or tag keys, unknown kinds, histograms
    without boundaries, one name used with two kinds or tag sets (Ray registers a name once)."""
    errors: list[str] = []
    seen: dict[str, tuple[str, tuple[str, ...]]] = {}
    constant = tuple(constant_tags)
    for spec in table:
        keys = (*constant, *spec.tag_keys)
        if not METRIC_NAME.match(spec.name):
            errors.append(f"{spec.pattern}: invalid metric name {spec.name!r}")
        errors += [f"{spec.pattern}: invalid tag key {k!r}" for k in keys if not TAG_KEY.match(k)]
        if len(set(keys)) != len(keys):
            errors.append(f"{spec.pattern}: repeated tag key in {keys}")
        if spec.kind not in KINDS:
            errors.append(f"{spec.pattern}: kind must be one of {KINDS}; got {spec.kind!r}")
        if spec.kind == "histogram" and not (spec.boundaries and _ascending_positive(spec.boundaries)):
            errors.append(f"{spec.pattern}: a histogram needs ascending positive boundaries")
        shape = (spec.kind, tuple(sorted(keys)))
        if seen.setdefault(spec.name, shape) != shape:
            errors.append(f"{spec.pattern}: {spec.name} already registered as {seen[spec.name]}")
    if errors:
        raise ValueError("metric table: " + "; ".join(errors))


def _ascending_positive(bounds: tuple[float, ...]) -> bool:
    return bounds[0] > 0 and all(a < b for a, b in zip(bounds, bounds[1:], strict=False))


def _ray_factories() -> dict[str, Callable[..., Any]]:
    from ray.util import metrics

    return {"gauge": metrics.Gauge, "counter": metrics.Counter, "histogram": metrics.Histogram}


class RayMetricsSink:
    """A step callback that records each step's metric dict as Ray metrics (dashboard, Prometheus).

    Ray metric objects are created on first use, so the sink can be built before Ray is connected; keys
    are matched against the table once each (they are stable from step to step)."""

    def __init__(self, table: Iterable[MetricSpec], tags: Mapping[str, str] | None = None,
                 step_metric: str | None = None):
        self.table = tuple(table)
        self.tags = {k: str(v) for k, v in (tags or {}).items()}
        step_rows = (MetricSpec("step", step_metric, "gauge", "last finished step"),) if step_metric else ()
        check_table((*self.table, *step_rows), self.tags)
        self._step_spec = step_rows[0] if step_rows else None
        self._metrics: dict[str, Any] = {}
        self._routes: dict[str, list[tuple[MetricSpec, dict[str, str]]]] = {}

    def on_step(self, step: int, metrics: Mapping[str, float], checkpoint: Path | None = None) -> None:
        if self._step_spec is not None:
            self._record(self._step_spec, float(step), {})
        for key, value in metrics.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isinf(value) or (math.isnan(value) and key.startswith(NAN_IS_A_VALUE)):
                value = -NONFINITE_SENTINEL if value < 0 else NONFINITE_SENTINEL  # shown, not dropped
            elif math.isnan(value):  # undefined this step
                continue
            for spec, tags in self._route(key):
                self._record(spec, float(value), tags)

    def close(self) -> None:
        """Nothing to release: Ray exports the last values until the process ends."""

    def _route(self, key: str) -> list[tuple[MetricSpec, dict[str, str]]]:
        if key not in self._routes:
            self._routes[key] = [(s, t) for s in self.table if (t := s.match(key)) is not None]
        return self._routes[key]

    def _record(self, spec: MetricSpec, value: float, tags: dict[str, str]) -> None:
        metric = self._metrics.get(spec.name)
        if metric is None:
            metric = self._metrics[spec.name] = _create(spec, tuple(self.tags))
        final = {**self.tags, **tags}
        if spec.kind == "gauge":
            metric.set(value, tags=final)
        elif spec.kind == "counter":
            if value > 0:  # Ray counters only go up; a zero count is no event
                metric.inc(value, tags=final)
        else:
            metric.observe(value, tags=final)


def _create(spec: MetricSpec, constant_tags: tuple[str, ...]) -> Any:
    factory = _ray_factories()[spec.kind]
    kwargs: dict[str, Any] = {"description": spec.description, "tag_keys": (*constant_tags, *spec.tag_keys)}
    if spec.kind == "histogram":
        kwargs["boundaries"] = list(spec.boundaries)
    return factory(spec.name, **kwargs)
