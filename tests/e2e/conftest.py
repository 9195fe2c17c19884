"""Fixtures for the end-to-end tests on the local cluster (``devenv/cluster.py``).

* ``local_cluster`` (session): the cluster in ``$EOP_CLUSTER_DIR`` (default
  ``~/.cache/eop/cluster``), started if it is not running, with the current images built and
  imported. A cluster this session started is stopped at the end (its data stays, so the next
  start is warm) unless ``EOP_E2E_KEEP_CLUSTER=1``; one that was already running is left
  running. Pipelines a killed demo left are deleted
  first.
* ``e2e_namespace`` (function): a fresh namespace, deleted after the test.

The binaries and the images are built right after collection, when a selected test needs the
cluster, so that a cold build does not count against a test's timeout; the cluster itself
starts when its first test does (an idle cluster would take CPU from the tiers before it).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from demo.run import remove_previous_run
from devenv.cluster import LocalCluster, build_images
from devenv.kube import build_binaries


@dataclass
class E2ECluster:
    """The running local cluster and the refs of the images imported into it."""

    cluster: LocalCluster
    operator_image: str
    spark_image: str
    started_here: bool

    @property
    def tag(self) -> str:
        """The images' tag (both share it)."""
        return self.operator_image.rsplit(":", 1)[1]


_session: dict[str, E2ECluster] = {}


def _bring_up() -> E2ECluster:
    if "cluster" not in _session:
        cluster = LocalCluster()
        was_running = cluster.is_running()
        cluster.up(images=False)
        # A demo that was killed left its pipelines running, or in the data of the cluster
        # it stopped: their drivers would hold a core of the node this tier needs.
        remove_previous_run(cluster, timeout=60.0)
        refs = cluster.load_images()
        _session["cluster"] = E2ECluster(
            cluster, refs["operator"], refs["spark"], started_here=not was_running
        )
    return _session["cluster"]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the cluster's binaries and the images before the first test, if one needs them."""
    if session.config.option.collectonly:
        return
    if any("local_cluster" in getattr(item, "fixturenames", ()) for item in session.items):
        build_binaries(("cluster",), quiet=True)
        build_images()


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[E2ECluster]:
    """The running cluster with the current images (see the module docstring)."""
    e2e = _bring_up()
    yield e2e
    if e2e.started_here and os.environ.get("EOP_E2E_KEEP_CLUSTER", "") in ("", "0"):
        e2e.cluster.down()
        _session.clear()


@pytest.fixture
def e2e_namespace(local_cluster: E2ECluster) -> Iterator[str]:
    """A new, uniquely named namespace; deleted (without waiting) after the test."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    local_cluster.cluster.kubectl("create", "namespace", name, check=True)
    yield name
    local_cluster.cluster.kubectl("delete", "namespace", name, "--wait=false")
