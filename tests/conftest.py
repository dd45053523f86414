"""Fixtures shared by the test packages."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 4 CPUs for one test module, always started here (address="local"), so a
    `ray start` head on the machine cannot capture the tests; a module that finds Ray initialised uses it as
    it is. Modules that need another size define their own `ray_cluster`."""
    import ray  # here, not at the top: the in-process tests also run on a GPU machine that has no Ray

    owned = not ray.is_initialized()
    if owned:
        ray.init(address="local", num_cpus=4, include_dashboard=False)
    yield
    if owned:
        ray.shutdown()
