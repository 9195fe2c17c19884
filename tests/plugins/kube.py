"""pytest plugin: a real Kubernetes control plane (etcd + kube-apiserver + controller-manager).

Fixtures:

* ``control_plane`` (session): builds the binaries if needed (``devenv/build-kube.sh``, a
  no-op when cached), starts a :class:`devenv.kube.ControlPlane` in a temp dir, stops it at
  the end. Nothing is built or started unless a test requests it.
* ``kube_namespace`` (function): a fresh namespace in that control plane, deleted afterwards.

Tests using them should be marked ``@pytest.mark.kube``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from devenv.kube import ControlPlane, build_binaries


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the binaries before any test runs (a cold build takes ~20 min on 2 cores,
    which must not count against a test's timeout), but only if a selected test needs them.
    """
    if session.config.option.collectonly:
        return
    if any("control_plane" in getattr(item, "fixturenames", ()) for item in session.items):
        build_binaries(quiet=True)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A running control plane shared by the whole session; use its ``kubeconfig``.

    Its apiserver keeps an audit log (``audit_log``): tests count the requests a client sent.
    """
    binaries = build_binaries(quiet=True)
    with ControlPlane(tmp_path_factory.mktemp("kube"), binaries=binaries, audit=True) as cp:
        yield cp


@pytest.fixture
def kube_namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A new, uniquely named namespace; deleted (without waiting) after the test."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    control_plane.kubectl("create", "namespace", name, check=True)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false")
