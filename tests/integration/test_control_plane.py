"""The local control plane behaves like a real cluster: versions, RBAC, garbage collection."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from devenv.kube import ControlPlane
from devenv.versions import versions

pytestmark = pytest.mark.kube


def _eventually(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)


def _configmap(
    namespace: str, name: str, owners: list[dict[str, str]] | None = None
) -> dict[str, object]:
    metadata: dict[str, object] = {"name": name, "namespace": namespace}
    if owners:
        metadata["ownerReferences"] = owners
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"k": "v"}}


def _create(cp: ControlPlane, obj: dict[str, object]) -> dict[str, object]:
    result = cp.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(obj), check=True)
    created: dict[str, object] = json.loads(result.stdout)
    return created


def _exists(cp: ControlPlane, namespace: str, name: str) -> bool:
    result = cp.kubectl(
        "get", "configmap", name, "-n", namespace, "--ignore-not-found", "-o", "name"
    )
    assert result.returncode == 0, result.stderr
    return bool(result.stdout.strip())


def test_server_reports_pinned_version(control_plane: ControlPlane) -> None:
    result = control_plane.kubectl("version", "-o", "json", check=True)
    info = json.loads(result.stdout)
    expected = "v" + versions()["KUBERNETES_VERSION"]
    assert info["serverVersion"]["gitVersion"] == expected
    assert info["clientVersion"]["gitVersion"] == expected


def test_rbac_is_enforced_for_service_accounts(
    control_plane: ControlPlane, kube_namespace: str
) -> None:
    ns = kube_namespace
    sa_config = control_plane.service_account_kubeconfig(ns, "reader", create=True)

    def list_configmaps(namespace: str) -> tuple[int, str]:
        r = control_plane.kubectl("get", "configmaps", "-n", namespace, kubeconfig=sa_config)
        return r.returncode, r.stderr

    code, err = list_configmaps(ns)
    assert code != 0
    assert "Forbidden" in err and f"system:serviceaccount:{ns}:reader" in err, err

    control_plane.kubectl(
        "create", "role", "cm-reader", "-n", ns, "--verb=get,list", "--resource=configmaps",
        check=True,
    )  # fmt: skip
    control_plane.kubectl(
        "create", "rolebinding", "cm-reader", "-n", ns, "--role=cm-reader",
        f"--serviceaccount={ns}:reader", check=True,
    )  # fmt: skip
    _eventually(lambda: list_configmaps(ns)[0] == 0, 30, "the RoleBinding to take effect")

    # The Role grants exactly that: reading elsewhere or writing is still forbidden.
    code, err = list_configmaps("default")
    assert code != 0 and "Forbidden" in err, err
    r = control_plane.kubectl("create", "configmap", "x", "-n", ns, kubeconfig=sa_config)
    assert r.returncode != 0 and "cannot create resource" in r.stderr, r.stderr


def test_garbage_collector_deletes_dependents(
    control_plane: ControlPlane, kube_namespace: str
) -> None:
    ns = kube_namespace
    owner = _create(control_plane, _configmap(ns, "owner"))
    owner_meta = owner["metadata"]
    assert isinstance(owner_meta, dict)
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_meta["uid"]}
    _create(control_plane, _configmap(ns, "dependent", [ref]))
    _create(control_plane, _configmap(ns, "bystander"))
    # An owner that never existed (UID unknown to the cluster) counts as deleted too.
    ghost = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "ghost",
        "uid": "00000000-0000-0000-0000-000000000001",
    }
    _create(control_plane, _configmap(ns, "orphan", [ghost]))

    control_plane.kubectl("delete", "configmap", "owner", "-n", ns, check=True)
    _eventually(lambda: not _exists(control_plane, ns, "dependent"), 90, "GC of 'dependent'")
    _eventually(lambda: not _exists(control_plane, ns, "orphan"), 90, "GC of 'orphan'")
    assert _exists(control_plane, ns, "bystander")
