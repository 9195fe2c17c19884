"""A pipeline's executor pods as the API server shows them, and what each must carry.

Shared by the executor tests of the single-node cluster (``test_executors.py``) and of the
multi-node one (``test_scale_out.py``).
"""

from __future__ import annotations

import json
from typing import Any

from tests.e2e.conftest import E2ECluster
from tests.e2e.test_cluster import _describe, _driver_pod, _get, _termination_messages


def executor_pods(e2e: E2ECluster, ns: str, pipeline: str) -> list[dict[str, Any]]:
    """The pipeline's executor pods that exist (terminating ones included)."""
    selector = f"exactlyonce.io/pipeline={pipeline},app.kubernetes.io/component=executor"
    return list(_get(e2e, "pods", "-n", ns, "-l", selector).get("items", []))


def running(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods that run and are not being deleted."""
    return [
        p
        for p in pods
        if p.get("status", {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    ]


def container_env(pod: dict[str, Any]) -> dict[str, Any]:
    """The first container's environment, by name."""
    return {e["name"]: e for e in pod["spec"]["containers"][0].get("env", [])}


def assert_hardened(
    pod: dict[str, Any], pipeline: str, *, driver_uid: str, cpu: str, memory: str
) -> None:
    """The executor pod is hardened as its driver, gets the RPC key only as a file, has the
    resources asked for and goes with its driver pod."""
    spec = pod["spec"]
    (container,) = spec["containers"]
    security = spec["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 1000
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    hardened = container["securityContext"]
    assert hardened["readOnlyRootFilesystem"] is True
    assert hardened["allowPrivilegeEscalation"] is False
    assert hardened["capabilities"]["drop"] == ["ALL"]
    # No API token in an executor; the driver's, which makes pods, stays with it.
    assert spec["automountServiceAccountToken"] is False
    assert not [m for m in container["volumeMounts"] if "serviceaccount" in m["mountPath"]]
    # Spark's RPC key reaches it as a file, never in the pod's spec.
    assert "_SPARK_AUTH_SECRET" not in container_env(pod)
    rpc = [
        v
        for v in spec["volumes"]
        if v.get("secret", {}).get("secretName") == f"{pipeline}-spark-rpc"
    ]
    assert rpc, spec["volumes"]
    assert container["resources"]["requests"]["cpu"] == cpu
    assert container["resources"]["limits"]["memory"] == memory
    # Owned by the driver pod: they go with it.
    assert [o["uid"] for o in pod["metadata"]["ownerReferences"]] == [driver_uid]
    assert container["args"] == ["executor"]


def ids_held_by_executors(
    e2e: E2ECluster, ns: str, id_prefix: str, pods: list[dict[str, Any]]
) -> dict[str, str]:
    """Transactional id -> the executor pod whose JVM logged taking it (ids starting with
    ``id_prefix``: ``eop.<ns>.<pipeline>.<source topic>.``)."""
    held: dict[str, str] = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        for line in e2e.cluster.kubectl("logs", "-n", ns, name).stdout.splitlines():
            if id_prefix in line and "transactional producer in executor" in line:
                held[line.split(": transactional producer")[0].rsplit(" ", 1)[-1]] = name
    return held


def pipeline_diagnostics(
    e2e: E2ECluster, ns: str, pipeline: str, operator: tuple[str, str] | None = None
) -> str:
    """The pipeline's status, its driver's and executors' last log lines, the operator's
    (``operator``: its namespace and pod) and the namespace's pods: for a failure message."""
    cluster = e2e.cluster
    driver = _driver_pod(e2e, ns, pipeline)
    logs = cluster.kubectl("logs", "-n", ns, f"{pipeline}-driver-0", "--tail=60").stdout
    executors = ""
    for pod in executor_pods(e2e, ns, pipeline):
        name = pod["metadata"]["name"]
        tail = cluster.kubectl("logs", "-n", ns, name, "--tail=30").stdout
        executors += f"\n--- {name} ({pod['status'].get('phase')}):\n{tail}"
    text = ""
    if operator is not None:
        ops_ns, operator_pod = operator
        text = cluster.kubectl("logs", "-n", ops_ns, operator_pod, "--tail=30").stdout
    status = _get(e2e, "eop", pipeline, "-n", ns).get("status")
    return (
        f"\n--- status: {json.dumps(status)}"
        f"\n--- driver: {_termination_messages(driver)}\n{logs}{executors}"
        f"\n--- operator:\n{text}\n--- pods:\n{_describe(e2e, ns, 'pods')}"
    )
