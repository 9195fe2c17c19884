"""pytest plugin: the multi-node local cluster (``devenv.cluster --nodes``) for the ``nodes`` tier.

Fixtures:

* ``nodes_cluster`` (function): the :class:`devenv.cluster.LocalCluster` of :data:`NODES` nodes
  in ``$EOP_NODES_CLUSTER_DIR`` (default ``~/.cache/eop/cluster-nodes``), running, every node
  Ready (a node a test lost is restored first). One that was already running is reused and
  left running; one this session started is stopped at the end (its data stays, so the next
  start is warm) unless ``EOP_KEEP_NODES_CLUSTER=1``. It has no eop images: pods use
  ``nodes_cluster.toolbox_image`` (busybox) or call ``load_images()``.
* ``nodes_namespace`` (function): a fresh namespace on it, deleted (without waiting) after.
* ``nodes_e2e`` (module): the same cluster with the current eop images built
  (``devenv/images.sh``) and imported into every node, as the e2e tests'
  :class:`tests.e2e.conftest.E2ECluster`; for a module that installs the operator and runs
  pipelines there.

The cluster starts when the first test asks for it (not at collection: idle kubelets would
take CPU from the tiers that run before). Tests using either get the marker ``nodes``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from devenv.cluster import LocalCluster
from tests.e2e.conftest import E2ECluster

#: The node count of the tier's cluster.
NODES = 3

_session: dict[str, LocalCluster] = {}
_started_here: list[bool] = []


def _fixture_users(items: list[pytest.Item]) -> list[pytest.Item]:
    return [
        i for i in items if {"nodes_cluster", "nodes_e2e"} & set(getattr(i, "fixturenames", ()))
    ]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the multi-node cluster ``nodes``."""
    for item in _fixture_users(items):
        item.add_marker(pytest.mark.nodes)


def _running_cluster() -> LocalCluster:
    """The tier's cluster, started (without eop images) if it is not running."""
    cluster = _session.get("cluster")
    if cluster is None:
        cluster = LocalCluster(nodes=NODES)
        _session["cluster"] = cluster
    if not cluster.is_running():
        _started_here.append(True)
        cluster.up(images=False)
    for name, state in cluster.node_states().items():
        if state == "lost":
            cluster.restore_node(name)
    return cluster


@pytest.fixture(scope="session")
def _nodes_cluster_session() -> Iterator[None]:
    yield
    cluster = _session.get("cluster")
    if (
        cluster is not None
        and _started_here
        and os.environ.get("EOP_KEEP_NODES_CLUSTER", "")
        in (
            "",
            "0",
        )
    ):
        cluster.down()


@pytest.fixture
def nodes_cluster(_nodes_cluster_session: None) -> LocalCluster:
    """The running multi-node cluster, every node Ready (see the module docstring)."""
    return _running_cluster()


@pytest.fixture
def nodes_namespace(nodes_cluster: LocalCluster) -> Iterator[str]:
    """A new, uniquely named namespace; deleted (without waiting) after the test."""
    name = f"nodes-{uuid.uuid4().hex[:8]}"
    nodes_cluster.kubectl("create", "namespace", name, check=True)
    yield name
    if nodes_cluster.is_running():
        nodes_cluster.kubectl("delete", "namespace", name, "--wait=false")


@pytest.fixture(scope="module")
def nodes_e2e(_nodes_cluster_session: None) -> E2ECluster:
    """The running multi-node cluster with the current eop images in every node."""
    cluster = _running_cluster()
    refs = cluster.load_images()
    return E2ECluster(cluster, refs["operator"], refs["spark"], started_here=bool(_started_here))
