"""Fixtures shared by the test packages, and the order modules on a local Ray cluster run in."""

from __future__ import annotations

import os
import sys
import time

import pytest

# The size of the `ray_cluster` fixture's cluster; a module that needs another sets `RAY_CPUS` at its top, and
# one that needs custom resources sets `RAY_RESOURCES` ({name: amount}).
DEFAULT_RAY_CPUS = 4

# A cluster's shape: its CPUs and its custom resources, sorted.
Shape = tuple[int, tuple[tuple[str, float], ...]]


def module_shape(module: object) -> Shape:
    """The cluster shape a test module asks for through `RAY_CPUS` and `RAY_RESOURCES`."""
    resources = getattr(module, "RAY_RESOURCES", {})
    return getattr(module, "RAY_CPUS", DEFAULT_RAY_CPUS), tuple(sorted(resources.items()))


class SharedCluster:
    """The local Ray cluster `ray_cluster` starts, kept up from one module to the next while they ask for the
    same shape: starting one costs 5–15 s on 2 cores, and about twenty modules ask. It is always started here
    (address="local"), so a `ray start` head on the machine cannot capture the tests; a Ray connection made by
    someone else is used as it is and never shut down here."""

    def __init__(self) -> None:
        self.shape: Shape | None = None  # the shape of the cluster this object started; None: none is up

    def use(self, shape: Shape) -> None:
        import ray  # here, not at the top: the in-process tests also run on a GPU machine that has no Ray

        if self.shape == shape and ray.is_initialized():
            return
        self.stop()
        if ray.is_initialized():
            return
        cpus, resources = shape
        ray.init(address="local", num_cpus=cpus, resources=dict(resources), include_dashboard=False)
        self.shape = shape

    def stop(self) -> None:
        if self.shape is None:
            return
        import ray

        ray.shutdown()
        self.shape = None

    def left_clean(self, deadline_s: float = 10.0) -> bool:
        """Whether a module gave back every CPU, custom resource and named actor (ray.kill releases them
        asynchronously): a module that leaks one hands the next a fresh cluster instead of a smaller one."""
        import ray

        if self.shape is None or not ray.is_initialized():
            return True
        cpus, resources = self.shape
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            free = ray.available_resources()
            given_back = free.get("CPU", 0.0) >= cpus and all(free.get(k, 0.0) >= v for k, v in resources)
            if given_back and not ray.util.list_named_actors(all_namespaces=True):
                return True
            time.sleep(0.2)
        return False


_CLUSTER = SharedCluster()
# Per module file, the cluster shape its tests ask for (None: they use no `ray_cluster`), set at collection.
_SHAPES = pytest.StashKey[dict[str, "Shape | None"]]()


def _module_shapes(items: list[pytest.Item]) -> dict[str, Shape | None]:
    """Per module file, in collection order: the cluster shape its tests ask for, None when none
    asks for `ray_cluster` (a test may also ask through `request.getfixturevalue`, if another
    test of its module names it)."""
    shapes: dict[str, Shape | None] = {}
    for item in items:
        shapes.setdefault(str(item.path), None)
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            shapes[str(item.path)] = module_shape(getattr(item, "module", None))
    return shapes


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules on the shared cluster run after the others, grouped by cluster shape, each module's tests in
    their own order: one cluster start per shape instead of one per module (about 20 modules, 5–15 s each)."""
    shapes = _module_shapes(items)
    first = {path: i for i, path in enumerate(shapes)}
    order = list(dict.fromkeys(shape for shape in shapes.values() if shape is not None))

    def key(item: pytest.Item) -> tuple[int, int]:
        shape = shapes[str(item.path)]
        return (0 if shape is None else 1 + order.index(shape)), first[str(item.path)]

    items.sort(key=key)
    config.stash[_SHAPES] = shapes


def pytest_runtest_setup(item: pytest.Item) -> None:
    # A module that does not use the shared cluster finds no Ray connection it did not make: `jobs.train` and
    # `jobs.sweep` join a connected cluster instead of starting their own.
    if item.config.stash.get(_SHAPES, {}).get(str(item.path)) is None:
        _CLUSTER.stop()


_EXIT_STATUS: list[int] = []  # pytest's exit status, kept for pytest_unconfigure


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _CLUSTER.stop()
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """End the test process with pytest's own exit status once every result and summary is written, skipping
    the interpreter's teardown. This process has hosted in-process vLLM engines, DeepSpeed process groups and
    a Ray driver; their native finalizers crashed it intermittently after the slow tier had passed (exit 139
    after "56 passed", 1 of 2 runs), which would fail a green run. Only the test process is spared: the
    commands a user runs are tested as subprocesses, and those tests check their exit codes."""
    if _EXIT_STATUS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])


@pytest.fixture(scope="module")
def ray_cluster(request: pytest.FixtureRequest):
    """A local Ray cluster of the module's shape (`RAY_CPUS`, default 4; `RAY_RESOURCES`) for one test module,
    shared with the modules next to it that ask for the same shape, and restarted for the next module when
    this one leaves a CPU, a custom resource or a named actor behind."""
    _CLUSTER.use(module_shape(request.module))
    yield
    if not _CLUSTER.left_clean():
        _CLUSTER.stop()


@pytest.fixture(scope="module")
def ray_gpus():
    """A Ray instance for the gpu tier's NCCL tests between two devices (the running one, or a local one for
    the module); skipped below two GPUs, as NCCL refuses two ranks on one device."""
    import ray
    import torch  # here, not at the top: the conftest is imported by every test run

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: NCCL refuses two ranks on one device")
    owned = not ray.is_initialized()
    if owned:
        ray.init(address="local", include_dashboard=False)
    yield
    if owned:
        ray.shutdown()
