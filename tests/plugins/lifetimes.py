"""pytest plugin: each shared real component runs only while the tests that need it run.

* **Order.** Test modules run grouped by the real components they need (:func:`stage_of`):
  none; the control plane; the control plane and a broker; the broker, Spark and the object
  store; the local cluster; the multi-node cluster. Within a stage they keep their file order
  (and a module's tests stay together, for its module-scoped fixtures). So the tests that
  need no component report first, and every component's users run one after the other.
* **Release.** Once the last test of the run that uses one of :data:`COMPONENTS` has
  finished, that fixture is torn down (the component stops) instead of idling until the
  session ends and taking CPU from every test after it: an idle control plane or cluster
  of kubelets costs a 2-core machine a noticeable share. A test that asks for it again
  later (``request.getfixturevalue``) gets it started anew.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

#: Session fixtures that start a real component, released after their last user. (The local
#: clusters run in the last two stages; they stop when the session ends.)
COMPONENTS = (
    "control_plane",
    "short_retention_broker",
    "other_cluster_broker",
    "kafka_cluster",
    "s3_server",
)

#: Per session (a pytest run inside a test, as ``pytester``'s, has its own): fixture name ->
#: the node id of its last user.
_LAST_USE = pytest.StashKey[dict[str, str]]()


def stage_of(item: pytest.Item) -> int:
    """The stage a test runs in, from the fixtures it uses and its tier markers (see the
    module docstring)."""
    fixtures = set(getattr(item, "fixturenames", ()))
    markers = {m.name for m in item.iter_markers()}
    if {"nodes_cluster", "nodes_e2e", "_nodes_cluster_session"} & fixtures or "nodes" in markers:
        return 5
    if "local_cluster" in fixtures or "e2e" in markers:
        return 4
    brokers = {"kafka_broker", "short_retention_broker", "other_cluster_broker", "kafka_cluster"}
    kafka = brokers & fixtures
    if "control_plane" in fixtures or "kube" in markers:
        return 2 if kafka else 1
    if kafka or {"spark_jars", "s3_server"} & fixtures or {"kafka", "spark", "s3"} & markers:
        return 3
    return 0


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the modules by stage (stable), then note each component's last user."""
    modules: dict[Path, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(Path(str(item.path)), []).append(item)
    stages = {path: max(stage_of(i) for i in module) for path, module in modules.items()}
    ordered = sorted(modules, key=lambda path: stages[path])  # sorted() is stable
    items[:] = [item for path in ordered for item in modules[path]]
    last_use = config.stash[_LAST_USE] = {}
    for item in items:
        for name in COMPONENTS:
            if name in getattr(item, "fixturenames", ()):
                last_use[name] = item.nodeid


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    """After a test's own teardown: stop the components it was the last user of."""
    result = yield
    if nextitem is None:  # the session's end tears everything down anyway
        return result
    last_use = item.config.stash.get(_LAST_USE, {})
    for name, last in list(last_use.items()):
        if last != item.nodeid:
            continue
        del last_use[name]
        definitions = item._fixtureinfo.name2fixturedefs.get(name)  # type: ignore[attr-defined]
        if definitions:
            definitions[-1].finish(item._request)  # type: ignore[attr-defined]
    return result
