"""pytest plugin: each shared real component runs only while the tests that need it run.

* **Order.** Test modules run grouped by the real components they need (:func:`stage_of`):
  none; the control plane; the control plane and a broker; the broker, Spark and the object
  store; the local cluster; the multi-node cluster. Within a stage they keep their file order
  (and a module's tests stay together, for its module-scoped fixtures). So the tests that
  need no component report first, and every component's users run one after the other.
* **Lanes.** ``python -m tests.lanes`` (what ``make test`` runs) runs the suite as three
  pytest processes side by side, each with components of its own (:func:`lane_of`): the
  tests that need a control plane or a local cluster in one, those that break brokers or
  runners for minutes (the replicated Kafka clusters' users, the chaos runs) in another,
  the rest (one broker, Spark, the object store) in the third. ``--lane NAME`` selects one.
* **Release.** Once the last test of the run that uses one of :data:`COMPONENTS` (requests
  its fixture, or carries a marker of its name, as a parameter that runs on ``field_broker``
  does) has finished, that fixture is torn down (the component stops) instead of idling until
  the session ends and taking CPU from every test after it: an idle control plane or cluster
  of kubelets costs a 2-core machine a noticeable share. A test that asks for it again
  later (``request.getfixturevalue``) gets it started anew.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

#: Session fixtures that start a real component, released after their last user. (The
#: one-node local cluster stops before the multi-node stage, whose cluster stops when the
#: session ends.)
COMPONENTS = (
    "control_plane",
    "local_cluster",
    "short_retention_broker",
    "short_retention_cluster",
    "other_cluster_broker",
    "field_broker",
    "kafka_cluster",
    "field_cluster",
    "s3_server",
)

#: The fixtures that start a Kafka broker or cluster (their users are marked ``kafka``).
BROKERS = frozenset(
    {
        "kafka_broker",
        "kafka_cluster",
        "field_broker",
        "field_cluster",
        "short_retention_broker",
        "short_retention_cluster",
        "other_cluster_broker",
    }
)

#: Per session (a pytest run inside a test, as ``pytester``'s, has its own): fixture name ->
#: the node id of its last user.
_LAST_USE = pytest.StashKey[dict[str, str]]()


def uses(item: pytest.Item) -> set[str]:
    """The fixtures a test requests, and the components it gets by a marker of their name
    (a test parameter marked ``field_broker`` runs on that broker, see make_pipeline)."""
    markers = {m.name for m in item.iter_markers()}
    return set(getattr(item, "fixturenames", ())) | (markers & set(COMPONENTS))


def stage_of(item: pytest.Item) -> int:
    """The stage a test runs in, from the fixtures it uses and its tier markers (see the
    module docstring)."""
    fixtures = uses(item)
    markers = {m.name for m in item.iter_markers()}
    if {"nodes_cluster", "nodes_e2e", "_nodes_cluster_session"} & fixtures or "nodes" in markers:
        return 5
    if "local_cluster" in fixtures or "e2e" in markers:
        return 4
    kafka = BROKERS & fixtures
    if "control_plane" in fixtures or "kube" in markers:
        return 2 if kafka else 1
    if kafka or {"spark_jars", "s3_server"} & fixtures or {"kafka", "spark", "s3"} & markers:
        return 3
    return 0


#: The lanes, in the order ``python -m tests.lanes`` starts them.
LANES = ("cluster", "faults", "data")
#: The replicated Kafka clusters: their users run in the ``faults`` lane, so each cluster
#: starts in one lane only. (The cross-cluster tests' second broker starts in two lanes.)
REPLICATED = frozenset(
    {
        "kafka_cluster",
        "kafka_cluster_chaos",
        "field_cluster",
        "field_cluster_chaos",
        "short_retention_cluster",
    }
)


def _module_marks(item: pytest.Item) -> set[str]:
    """The names of the marks of ``item``'s module as a whole (its ``pytestmark``)."""
    marks = getattr(getattr(item, "module", None), "pytestmark", [])
    return {m.name for m in (marks if isinstance(marks, list) else [marks])}


def lane_of(module: list[pytest.Item]) -> str:
    """The lane a test module runs in: ``cluster`` for the control plane's and the local
    clusters' stages; ``faults`` for the users of :data:`REPLICATED` and the modules that are
    ``slow`` as a whole (chaos runs, broker faults: minutes of kills, restarts and waits
    each); ``data`` for the rest. The three take about as long; a test module stays in one
    lane, for its module-scoped fixtures."""
    fixtures = {name for item in module for name in getattr(item, "fixturenames", ())}
    stage = max(stage_of(item) for item in module)
    if stage in (1, 2, 4, 5):
        return "cluster"
    if REPLICATED & fixtures or "slow" in _module_marks(module[0]):
        return "faults"
    return "data"


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--lane NAME``: run only that lane's test modules (see :data:`LANES`)."""
    parser.addoption(
        "--lane", choices=LANES, default=None, help="run only this lane's test modules"
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the lane's modules (with ``--lane``), order them by stage (stable), then note each
    component's last user."""
    modules: dict[Path, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(Path(str(item.path)), []).append(item)
    lane = config.getoption("--lane", None)
    if lane is not None:
        other = [path for path, module in modules.items() if lane_of(module) != lane]
        config.hook.pytest_deselected(items=[i for path in other for i in modules.pop(path)])
    stages = {path: max(stage_of(i) for i in module) for path, module in modules.items()}
    ordered = sorted(modules, key=lambda path: stages[path])  # sorted() is stable
    items[:] = [item for path in ordered for item in modules[path]]
    last_use = config.stash[_LAST_USE] = {}
    for item in items:
        for name in COMPONENTS:
            if name in uses(item):
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
        # A component a marker asked for was requested at run time (getfixturevalue): not in
        # the test's own closure, the session knows its definition.
        definitions = item._fixtureinfo.name2fixturedefs.get(  # type: ignore[attr-defined]
            name
        ) or item.session._fixturemanager.getfixturedefs(name, item)
        if definitions:
            definitions[-1].finish(item._request)  # type: ignore[attr-defined]
    return result
