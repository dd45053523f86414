"""tests/conftest.py's shared cluster: the modules that use it run after the others, grouped by shape, and a
module that leaves a named actor holding a CPU behind is caught, so the next module gets a fresh cluster."""

from __future__ import annotations

from types import SimpleNamespace

from tests import conftest


def _item(path: str, uses_cluster: bool, **module_attrs):
    fixtures = ["ray_cluster", "tmp_path"] if uses_cluster else ["tmp_path"]
    return SimpleNamespace(path=path, fixturenames=fixtures, module=SimpleNamespace(**module_attrs))


def test_cluster_modules_run_after_the_others_grouped_by_shape():
    # Module a asks for the cluster in one test of two; c asks for 2 CPUs, d for a custom resource.
    items = [_item("a", True), _item("b", False), _item("c", True, RAY_CPUS=2), _item("a", False),
             _item("d", True, RAY_RESOURCES={"slot0": 1}), _item("e", True), _item("f", False)]
    config = SimpleNamespace(stash={})
    conftest.pytest_collection_modifyitems(config, items)  # type: ignore[arg-type]
    assert [(i.path, "ray_cluster" in i.fixturenames) for i in items] == [
        ("b", False), ("f", False), ("a", True), ("a", False), ("e", True), ("c", True), ("d", True)]
    assert config.stash[conftest._SHAPES] == {
        "a": (4, ()),
        "b": None,
        "c": (2, ()),
        "d": (4, (("slot0", 1),)),
        "e": (4, ()),
        "f": None,
    }


class _Idle:
    def ping(self) -> int:
        return 1


def test_a_named_actor_left_behind_is_caught_and_its_release_seen(ray_cluster):
    import ray

    actor = ray.remote(num_cpus=1)(_Idle).options(name="conftest-left-behind").remote()
    ray.get(actor.ping.remote())
    try:
        assert not conftest._CLUSTER.left_clean(deadline_s=0.5)
    finally:
        ray.kill(actor)
    assert conftest._CLUSTER.left_clean()
