"""The chart's namespaced default on a real API server with RBAC, watched by its audit log.

The chart is installed with its default values; ``eop operator`` runs with the chart's own
arguments and nothing but its ServiceAccount's token. It reconciles pipelines in its namespace
(a driver with executors on Kubernetes is bound to the chart's drivers' role, and gets its RPC
key Secret), reads the Kafka Secret a pipeline references, and the API server's audit log shows
it never asks for any other Secret, nor lists them; a Secret in another namespace is refused to
its account. A pipeline asking for the node's network gets no driver and a status naming the
field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.kube import ControlPlane, build_binaries
from tests.integration.operators import CHART, OperatorProcess, wait_for

pytestmark = pytest.mark.kube

RELEASE = "eop"
NAMESPACE = "streaming"  # the release's namespace: the only one served by default
ELSEWHERE = "other-team"
REFERENCED, UNREFERENCED = "kafka-client", "payments-db"

#: Every request on Secrets, with who asked for which one and the answer; nothing else.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "resources": [{"group": "", "resources": ["secrets"]}]},
        {"level": "None"},
    ],
}


@dataclass(frozen=True)
class Audited:
    """A control plane whose API server writes Secret requests to ``audit_log``."""

    cp: ControlPlane
    audit_log: Path

    def secret_requests(self, user: str) -> list[dict[str, Any]]:
        """Audit events of ``user`` on Secrets (kubectl's own requests left out)."""
        events = [json.loads(line) for line in self.audit_log.read_text().splitlines() if line]
        return [
            e
            for e in events
            if e["user"]["username"] == user and not e.get("userAgent", "").startswith("kubectl")
        ]


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Audited]:
    """A control plane of its own: the shared one keeps no audit log."""
    work = tmp_path_factory.mktemp("audited")
    policy, log = work / "audit-policy.yaml", work / "audit.log"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    args = [f"--audit-policy-file={policy}", f"--audit-log-path={log}"]
    with ControlPlane(
        work / "kube", binaries=build_binaries(quiet=True), extra_apiserver_args=args
    ) as cp:
        yield Audited(cp, log)


def chart_args(cp: ControlPlane) -> list[str]:
    """The operator's arguments as the installed release's Deployment gives them."""
    manifest = cp.helm("get", "manifest", RELEASE, "-n", NAMESPACE, check=True).stdout
    (deployment,) = [d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args: list[str] = container["args"]
    assert args[0] == "operator"
    # Ports and address of the pod's own: OperatorProcess serves liveness and metrics on free
    # ports of this host.
    own = ("--liveness=", "--metrics-port=", "--metrics-address=")
    return [a for a in args[1:] if not a.startswith(own)]


def pipeline(name: str, **spec: Any) -> dict[str, Any]:
    kafka = {"bootstrapServers": "127.0.0.1:9", "topics": ["raw"]}
    return {
        "apiVersion": "exactlyonce.io/v1alpha1",
        "kind": "ExactlyOncePipeline",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "source": {"kafka": {**kafka, "secretRef": {"name": REFERENCED}}},
            "transform": {"sql": "SELECT key, value FROM source"},
            "sink": {"kafka": {"bootstrapServers": "127.0.0.1:9", "topic": "clean"}},
            **spec,
        },
    }


def get(cp: ControlPlane, kind: str, name: str, namespace: str = NAMESPACE) -> Any:
    result = cp.kubectl("get", kind, name, "-n", namespace, "-o", "json")
    return json.loads(result.stdout) if result.returncode == 0 else None


def degraded_message(cp: ControlPlane, name: str) -> str | None:
    conditions = (get(cp, "eop", name) or {}).get("status", {}).get("conditions", [])
    return next(
        (c["message"] for c in conditions if c["type"] == "Degraded" and c["status"] == "True"),
        None,
    )


@pytest.mark.slow
def test_namespaced_default_runs_pipelines_with_only_its_rbac(
    audited: Audited, tmp_path: Path
) -> None:
    cp = audited.cp
    for ns in (NAMESPACE, ELSEWHERE):
        cp.kubectl("create", "namespace", ns, check=True)
        for secret in (REFERENCED, UNREFERENCED):
            cp.kubectl(
                "create", "secret", "generic", secret, "-n", ns,
                "--from-literal=client.id=eop-least-privilege", check=True,
            )  # fmt: skip
    cp.helm(
        "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
        "--set", f"watchNamespaces={{{NAMESPACE}}}",
        check=True,
    )  # fmt: skip
    args = chart_args(cp)
    assert f"--namespace={NAMESPACE}" in args and "--all-namespaces" not in args
    kubeconfig = cp.service_account_kubeconfig(NAMESPACE, RELEASE)
    operator = OperatorProcess(
        kubeconfig, tmp_path / "operator.log", *args, f"--leader-election-namespace={NAMESPACE}"
    )
    try:
        wait_for(operator.alive, "the operator's liveness endpoint")
        cp.kubectl("apply", "-f", "-", input=json.dumps(pipeline("clean")), check=True)
        executors = pipeline("wide", spark={"master": "k8s://https://kubernetes.default.svc"})
        cp.kubectl("apply", "-f", "-", input=json.dumps(executors), check=True)
        on_host = pipeline("on-host", driver={"hostNetwork": True})
        cp.kubectl("apply", "-f", "-", input=json.dumps(on_host), check=True)

        # Pipelines reach their StatefulSet; the executors' driver is bound to the chart's role.
        for name in ("clean-driver", "wide-driver"):
            wait_for(lambda name=name: get(cp, "statefulset", name), f"StatefulSet {name}")  # type: ignore[misc]
        binding = wait_for(
            lambda: get(cp, "rolebinding", f"wide-driver-role-{RELEASE}-driver"), "the binding"
        )
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": f"{RELEASE}-driver",
        }
        # The health check reads the referenced Secret, by name.
        user = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
        read = wait_for(
            lambda: [
                e
                for e in audited.secret_requests(user)
                if e["objectRef"].get("name") == REFERENCED and e["responseStatus"]["code"] == 200
            ],
            "the operator reading the pipeline's Secret",
        )
        assert {e["objectRef"]["namespace"] for e in read} == {NAMESPACE}
        # Node access is refused before any driver exists, naming the field.
        message = wait_for(lambda: degraded_message(cp, "on-host"), "on-host Degraded")
        assert "spec.driver.hostNetwork" in message and "allowHostNetwork" in message
        assert get(cp, "statefulset", "on-host-driver") is None
    finally:
        operator.stop()

    # Its account is refused Secrets anywhere else, and cannot list them here.
    refused = cp.kubectl("get", "secret", REFERENCED, "-n", ELSEWHERE, kubeconfig=kubeconfig)
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower()
    listed = cp.kubectl("get", "secrets", "-n", NAMESPACE, kubeconfig=kubeconfig)
    assert listed.returncode != 0 and "forbidden" in listed.stderr.lower()
    # In the whole run, the operator asked for no other Secret and never listed or watched any;
    # it created the RPC key of the pipeline with executors on Kubernetes (then found it there).
    requests = audited.secret_requests(user)
    assert {(e["verb"], e["objectRef"].get("namespace"), e["objectRef"].get("name"))
            for e in requests} == {("get", NAMESPACE, REFERENCED),
                                   ("create", NAMESPACE, "wide-spark-rpc")}  # fmt: skip
    assert "Forbidden" not in operator.text(), "the chart's RBAC was not enough"
