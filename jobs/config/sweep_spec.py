"""The sweep file: a base train config, a grid of config values (every combination is one cell), optional
random search within each cell, and what Tune optimises. Validated before anything runs: every cell's
train config goes through `jobs.config.load_config`, so a bad key or value names the key and the cell.

```yaml
name: my_sweep
base: jobs/configs/tiny.yaml        # a train config file
overrides: [steps=3]                # key=value for every trial (as on the train command line)
grid:                               # config dotpath -> values; trials = the cross product
  marl.workflow: [voting, eval_opt]
  marl.sharing: [shared, isolated]
  task:                             # a mapping sets several keys together; `task` is only its label
    - {data.task: math, data.train: digit}
    - {data.task: code, data.train: code_synthetic}
exclude:                            # partial assignments: a cell matching one entry is not run
  - {marl.workflow: voting, data.task: code}
where:                              # after the grid, in order: each matching rule sets its keys
  - when: {data.task: math, marl.workflow: [voting, eval_opt]}   # a list matches any of its values
    set: {rollout.sampling.max_new_tokens: 512}
search:                             # sampled afresh for each of num_samples repeats of every cell
  learner.optim.lr: {loguniform: [1.0e-5, 1.0e-4]}
num_samples: 1
metric: reward/mean
mode: max
vars: {steps: 3}                    # the file's own values, read as ${vars.steps}: one override changes all
```

`when` and `exclude` name config dotpaths the grid sets (a mapping's keys, not its label), and each must match
some cell; `set` keys may not be grid or search keys, so a cell's label says all that varies.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from ray import tune

from jobs.config import ConfigError, load_config

# Search spaces a sweep file may name, each taking its list of arguments.
SEARCH_SPACES = {
    "uniform": tune.uniform,
    "loguniform": tune.loguniform,
    "randint": tune.randint,
    "choice": lambda *values: tune.choice(list(values)),
}


class SweepError(ValueError):
    """A sweep file problem; the message names the key (and the cell, for a train config problem)."""


@dataclass
class SweepRayConfig:
    address: str = ""  # as the train config's ray.address: ""/local embedded, auto, host:port
    num_cpus: int = 0  # for the embedded cluster; 0 = Ray's own detection
    connect_timeout_s: float = 30.0  # a cluster to join must answer within this


@dataclass
class WhereRule:
    when: dict[str, Any] = MISSING  # dotpath -> value, or a list of values (any of them)
    set: dict[str, Any] = MISSING  # dotpath -> value for every cell `when` matches


@dataclass
class SweepConfig:
    name: str = MISSING
    base: str = MISSING
    overrides: list[str] = field(default_factory=list)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    exclude: list[dict[str, Any]] = field(default_factory=list)
    where: list[WhereRule] = field(default_factory=list)
    search: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    num_samples: int = 1
    metric: str = "reward/mean"
    mode: str = "max"
    storage_path: str = "runs/sweeps"  # shared storage on a multi-node cluster; runs go to <it>/<name>/runs
    max_concurrent_trials: int = 0  # 0: as many as the cluster holds
    max_failures: int = 0  # restarts of a failed trial (it resumes from its newest checkpoint)
    driver_cpus: float = 1.0  # the trial's own driver bundle (bundle 0 of its placement group)
    # At the end, print the trials side by side (held-out curves, coordinating roles' parse rate and choice
    # accuracy at base and after training: jobs/compare.py) and write the report to
    # <storage_path>/<name>/report.
    compare: bool = False
    ray: SweepRayConfig = field(default_factory=SweepRayConfig)
    # Values the file itself reads by interpolation (`${vars.workflow}` in its name, overrides, grid), so that
    # one command-line override (`vars.workflow=orch_workers`) changes every place that names it.
    vars: dict[str, Any] = field(default_factory=dict)


def load_sweep(path: str, overrides: list[str] | None = None) -> SweepConfig:
    """Sweep file ← `key=value` overrides, typed by the schema. Raises SweepError naming the key."""
    try:
        raw = OmegaConf.load(path)
        _check_rule_keys(raw)
        spec = OmegaConf.merge(
            OmegaConf.structured(SweepConfig), raw, OmegaConf.from_dotlist(list(overrides or []))
        )
        missing = sorted(OmegaConf.missing_keys(spec))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        raise SweepError(f"sweep: {key + ': ' if key else ''}{str(e).splitlines()[0]}") from None
    except FileNotFoundError:
        raise SweepError(f"sweep: file not found: {path}") from None
    if missing:
        raise SweepError(f"sweep: missing required value for {', '.join(missing)}")
    return OmegaConf.to_object(spec)  # type: ignore[return-value]


def _check_rule_keys(raw: Any) -> None:
    # OmegaConf names a bad key inside a list item without the item's index; this names both.
    rules = raw.get("where") if isinstance(raw, DictConfig) else None
    for i, rule in enumerate(rules or []):
        unknown = [k for k in rule if k not in ("when", "set")] if isinstance(rule, DictConfig) else []
        if unknown:
            raise SweepError(f"sweep: where[{i}].{unknown[0]!s}: a rule has only `when` and `set`")


WHERE = "where"  # the cell entry holding what `where` rules set (a mapping, like a grid label's)


def grid_cells(spec: SweepConfig) -> list[dict[str, Any]]:
    """Every combination of the grid's values, in file order (one empty cell without a grid)."""
    keys = list(spec.grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(spec.grid[k] for k in keys))]


def cells(spec: SweepConfig) -> list[dict[str, Any]]:
    """The grid's combinations less the excluded ones, each with what the `where` rules set under WHERE."""
    out = []
    for cell in grid_cells(spec):
        values = flatten(cell)
        if any(matches(entry, values) for entry in spec.exclude):
            continue
        sets = {k: v for rule in spec.where if matches(rule.when, values) for k, v in rule.set.items()}
        out.append({**cell, WHERE: sets} if sets else cell)
    return out


def matches(when: dict[str, Any], values: dict[str, Any]) -> bool:
    """Whether config values (dotpath -> value) hold every condition: a value, or a list of allowed values."""
    return all(k in values and values[k] in (v if isinstance(v, list) else [v]) for k, v in when.items())


def flatten(values: dict[str, Any]) -> dict[str, Any]:
    """Config dotpath -> value. A mapping value sets several keys together; its grid key is only a label."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        out.update(value if isinstance(value, dict) else {key: value})
    return out


def as_overrides(values: dict[str, Any]) -> list[str]:
    """`key=value` strings as the train command line takes them (non-strings as JSON: lists, bools)."""
    return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in flatten(values).items()]


def cell_label(cell: dict[str, Any]) -> str:
    """The grid's values of a cell (what `where` rules set follows from them)."""
    grid = {k: v for k, v in cell.items() if k != WHERE}
    return ", ".join(f"{k}={v}" for k, v in flatten(grid).items()) or "(no grid)"


def search_space(spec: SweepConfig) -> dict[str, Any]:
    """The Tune search domain of every `search` key."""
    out = {}
    for key, space in spec.search.items():
        if len(space) != 1 or next(iter(space)) not in SEARCH_SPACES:
            raise SweepError(f"sweep: search.{key} must be one of {{{', '.join(SEARCH_SPACES)}: [args]}}; "
                             f"got {space}")
        kind, args = next(iter(space.items()))
        try:
            out[key] = SEARCH_SPACES[kind](*args)
        except (TypeError, ValueError) as e:
            raise SweepError(f"sweep: search.{key}: {kind}{tuple(args)}: {e}") from None
    return out


def _representatives(spec: SweepConfig) -> list[dict[str, Any]]:
    """Search values to validate: every choice, and both ends of every range."""
    reps = []
    for key, space in spec.search.items():
        kind, args = next(iter(space.items()))
        values = args if kind == "choice" else [args[0], args[-1] - 1 if kind == "randint" else args[-1]]
        reps += [{key: v} for v in values]
    return reps


def validate(spec: SweepConfig) -> list[dict[str, Any]]:
    """Check the whole sweep before anything runs; returns its cells. Raises
    SweepError naming key and cell."""
    if spec.mode not in ("min", "max"):
        raise SweepError(f"sweep: mode must be min or max; got {spec.mode!r}")
    if (
        spec.num_samples < 1
        or spec.max_concurrent_trials < 0
        or spec.max_failures < 0
        or spec.driver_cpus < 0
    ):
        raise SweepError(
            "sweep: num_samples must be >= 1; max_concurrent_trials, max_failures and driver_cpus >= 0"
        )
    if not spec.ray.connect_timeout_s > 0:
        raise SweepError(f"sweep: ray.connect_timeout_s must be > 0; got {spec.ray.connect_timeout_s!r}")
    both = sorted(set(spec.grid) & set(spec.search))
    if both:
        raise SweepError(f"sweep: {', '.join(both)} in both grid and search")
    empty = [k for k, v in spec.grid.items() if not v]
    if empty:
        raise SweepError(f"sweep: grid.{empty[0]} has no values")
    search_space(spec)
    _check_rules(spec)
    all_cells = cells(spec)
    if not all_cells:
        raise SweepError("sweep: exclude removes every cell")
    for cell, sampled in checked_configs(spec, all_cells):
        _check(spec, cell, sampled)
    return all_cells


Sample = tuple[dict[str, Any], dict[str, Any]]  # (a cell, a search sample)


def checked_configs(spec: SweepConfig, all_cells: list[dict[str, Any]]) -> list[Sample]:
    """(cell, search sample) of every config a sweep is checked with before it runs: each cell, and the first
    cell with each representative search value."""
    return [(cell, {}) for cell in all_cells] + [(all_cells[0], rep) for rep in _representatives(spec)]


def _check(spec: SweepConfig, cell: dict[str, Any], sampled: dict[str, Any]) -> None:
    try:
        load_config(spec.base, [*spec.overrides, *as_overrides(cell), *as_overrides(sampled)])
    except ConfigError as e:
        where = cell_label(cell) + (f"; search {cell_label(sampled)}" if sampled else "")
        raise SweepError(f"sweep {spec.name}: cell [{where}]: {e}") from None


def _check_rules(spec: SweepConfig) -> None:
    """`exclude` and `where` name keys the grid sets, each matches some cell,
    and `set` varies nothing else."""
    if WHERE in spec.grid:
        raise SweepError(f"sweep: grid.{WHERE} is reserved for what `where` rules set; rename the axis")
    grid_values = [flatten(c) for c in grid_cells(spec)]
    kept = [v for v in grid_values if not any(matches(e, v) for e in spec.exclude)]
    grid_keys = list(dict.fromkeys(k for values in grid_values for k in values))
    named = [(f"exclude[{i}]", e, grid_values) for i, e in enumerate(spec.exclude)]
    named += [(f"where[{i}].when", r.when, kept) for i, r in enumerate(spec.where)]
    for where, when, pool in named:
        if not when:
            raise SweepError(f"sweep: {where} names no key")
        unknown = [k for k in when if k not in grid_keys]
        if unknown:
            raise SweepError(f"sweep: {where}.{unknown[0]} is not a key the grid sets; grid keys: "
                             f"{', '.join(grid_keys) or 'none'}")
        if not any(matches(when, values) for values in pool):
            excluded = pool is kept and any(matches(when, values) for values in grid_values)
            raise SweepError(
                f"sweep: {where} {when} matches {'only excluded cells' if excluded else 'no cell'}"
            )
    for i, rule in enumerate(spec.where):
        varied = [k for k in rule.set if k in grid_keys or k in spec.search]
        if varied:
            raise SweepError(
                f"sweep: where[{i}].set.{varied[0]} is a grid or search key; a rule may not change "
                "what a cell's label says"
            )
