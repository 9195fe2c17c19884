"""Deleting a served namespace in the chart's namespaced mode, on a real API server.

The control plane runs kube-controller-manager, so the namespace controller deletes
everything in a namespace at once, the operator's Role and RoleBinding among the pipelines:
the namespace must still go, its pipelines' finalizers run with the operator's rights intact.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devenv.kube import ControlPlane
from tests.integration.operators import OperatorProcess, install_chart, wait_for

pytestmark = pytest.mark.kube

RELEASE = "eop-ns"
#: The operator's Role and RoleBinding of each served namespace (the chart names them after a
#: release whose name holds "eop"), and the RoleBinding that lets it release their finalizer.
RBAC_NAME = RELEASE
GUARDED = (("role", RBAC_NAME), ("rolebinding", RBAC_NAME), ("rolebinding", f"{RBAC_NAME}-guard"))
GUARD = "exactlyonce.io/pipelines"


@pytest.fixture
def served(control_plane: ControlPlane, tmp_path: Path) -> Iterator[str]:
    """A namespace served by a namespaced release, whose operator runs as its account."""
    cp, namespace = control_plane, f"t-{uuid.uuid4().hex[:10]}"
    cp.kubectl("create", "namespace", namespace, check=True)
    kubeconfig = install_chart(cp, RELEASE, f"{RELEASE}-system", serve=(namespace,))
    proc = OperatorProcess(kubeconfig, tmp_path / "operator.log", "--namespace", namespace,
                           f"--rbac-name={RBAC_NAME}")  # fmt: skip
    try:
        wait_for(proc.alive, "the operator's liveness endpoint")
        yield namespace
    finally:
        proc.stop()
        cp.helm("uninstall", RELEASE, "--namespace", f"{RELEASE}-system")
        for kind, name in (*GUARDED, ("eop", "alpha"), ("eop", "beta")):  # a failed test's
            cp.kubectl("patch", kind, name, "-n", namespace, "--type=merge",
                       "-p", '{"metadata":{"finalizers":null}}')  # fmt: skip
        cp.kubectl("delete", "namespace", namespace, "--wait=false")


def _finalizers(cp: ControlPlane, kind: str, name: str, namespace: str) -> list[str]:
    result = cp.kubectl("get", kind, name, "-n", namespace, "-o", "json")
    if result.returncode != 0:
        return []
    return list(json.loads(result.stdout)["metadata"].get("finalizers") or [])


def test_deleting_a_served_namespace_with_pipelines_does_not_hang(
    control_plane: ControlPlane, served: str
) -> None:
    cp, ns = control_plane, served
    for name in ("alpha", "beta"):
        manifest = {
            "apiVersion": "exactlyonce.io/v1alpha1",
            "kind": "ExactlyOncePipeline",
            "metadata": {"name": name},
            "spec": {
                "source": {"kafka": {"bootstrapServers": "127.0.0.1:9092", "topics": ["raw"]}},
                "transform": {"sql": "SELECT value FROM source"},
                "sink": {"kafka": {"bootstrapServers": "127.0.0.1:9092", "topic": "clean"}},
            },
        }
        cp.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest), check=True)
    for name in ("alpha", "beta"):
        wait_for(
            lambda n=name: (
                cp.kubectl("get", "statefulset", f"{n}-driver", "-n", ns).returncode == 0
            ),
            f"{name}'s driver",
        )
    # While pipelines remain, the operator's rights in their namespace cannot go first.
    for kind, name in GUARDED:
        assert GUARD in _finalizers(cp, kind, name, ns), f"{kind}/{name}"

    cp.kubectl("delete", "namespace", ns, "--wait=false", check=True)
    try:
        wait_for(
            lambda: cp.kubectl("get", "namespace", ns).returncode != 0,
            "the namespace to be gone",
            timeout=60,
        )
    except AssertionError as exc:
        left = cp.kubectl("get", "namespace", ns, "-o", "jsonpath={.status}").stdout
        raise AssertionError(f"{exc}\nthe namespace's status: {left}") from None
