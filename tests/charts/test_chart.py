"""The Helm chart (charts/eop), linted and rendered by the real helm binary.

What a user of the chart would notice: it lints strictly, the operator runs non-root on a
read-only root filesystem, the RBAC is cluster-wide or per namespace as asked, reads Secrets only
by name (for lag reporting) and never grants escalation verbs, replicas elect a leader, the
optional Prometheus monitors scrape what the operator and the drivers serve, a typo in values
fails, the CRD matches the models, and (on the real API server) the operator's ServiceAccount can
do everything the operator does.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.kube import ControlPlane, ControlPlaneError, build_binaries
from eop_operator import API_VERSION, KIND, PLURAL
from eop_operator.api.crd import crd_yaml
from eop_operator.api.load import load_pipeline
from eop_operator.cli import build_parser
from eop_operator.render import render_pipeline
from eop_operator.render.rbac import DRIVER_RULES

CHART = Path(__file__).resolve().parents[2] / "charts" / "eop"
CRD_FILE = CHART / "crds" / f"{PLURAL}.exactlyonce.io.yaml"
RELEASE_NAMESPACE = "eop-system"
FORBIDDEN_VERBS = {"*", "escalate", "bind", "impersonate"}
#: What server-side apply of a new object needs (apply creates it), plus read and delete.
APPLY_VERBS = {"create", "patch", "get", "list", "watch", "delete"}

Manifest = dict[str, Any]


# --- helm ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Helm:
    """The helm binary with private cache/config/data dirs."""

    binary: Path
    home: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ)
        for kind in ("CACHE", "CONFIG", "DATA"):
            env[f"HELM_{kind}_HOME"] = str(self.home / kind.lower())
        return subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, env=env, timeout=120
        )


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """helm as devenv/build-kube.sh builds it (a no-op when cached)."""
    try:
        binary = build_binaries(["helm"], quiet=True).helm
    except ControlPlaneError as exc:
        pytest.skip(f"devenv/build-kube.sh cannot build helm here: {exc}")
    return Helm(binary, tmp_path_factory.mktemp("helm-home"))


def set_args(values: tuple[str, ...]) -> list[str]:
    return [arg for value in values for arg in ("--set", value)]


def render(helm: Helm, *values: str) -> list[Manifest]:
    """``helm template`` of the chart with ``--set``-style ``values``; the parsed objects."""
    result = helm.run(
        "template", "eop", str(CHART), "--namespace", RELEASE_NAMESPACE, *set_args(values)
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def of_kind(objects: list[Manifest], kind: str) -> list[Manifest]:
    return [o for o in objects if o["kind"] == kind]


def deployment(objects: list[Manifest]) -> Manifest:
    (found,) = of_kind(objects, "Deployment")
    return found


def is_leader_election(role: Manifest) -> bool:
    name: str = role["metadata"]["name"]
    return name.endswith("-leader-election")


def pipeline_roles(objects: list[Manifest]) -> list[Manifest]:
    return [r for r in of_kind(objects, "Role") if not is_leader_election(r)]


def all_rules(objects: list[Manifest]) -> list[Manifest]:
    return [
        rule for o in objects if o["kind"] in ("Role", "ClusterRole") for rule in o.get("rules", [])
    ]


def granted(rules: list[Manifest], group: str, resource: str) -> set[str]:
    """The verbs ``rules`` grant on ``resource`` of API ``group``."""
    return {
        verb
        for rule in rules
        if group in rule.get("apiGroups", []) and resource in rule.get("resources", [])
        for verb in rule["verbs"]
    }


NAMESPACED = ("watchNamespaces={team-a,team-b}",)
MODES = pytest.mark.parametrize("values", [(), NAMESPACED], ids=["cluster-wide", "namespaced"])


# --- lint and render -----------------------------------------------------------------------------


@pytest.mark.kube
@MODES
def test_lint_strict_passes(helm: Helm, values: tuple[str, ...]) -> None:
    result = helm.run("lint", "--strict", str(CHART), *set_args(values))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.kube
def test_operator_runs_non_root_on_read_only_root_fs(helm: Helm) -> None:
    dep = deployment(render(helm))
    assert dep["spec"]["replicas"] == 1
    assert "strategy" not in dep["spec"]  # rolling: the new pod waits as a standby
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "hostNetwork" not in pod
    (container,) = pod["containers"]
    ctx = container["securityContext"]
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    tmp = next(m for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
    volume = next(v for v in pod["volumes"] if v["name"] == tmp["name"])
    assert "emptyDir" in volume
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    assert probe["port"] == "health"
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]


@pytest.mark.kube
def test_args_follow_values(helm: Helm) -> None:
    dep = deployment(
        render(
            helm,
            "image.repository=registry.example.com/team/eop-operator",
            "image.tag=v9",
            "logLevel=debug",
            "logFormat=json",
            "hostNetwork=true",
        )
    )
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/team/eop-operator:v9"
    assert container["args"][:2] == ["operator", "--all-namespaces"]
    # The Spark image defaults to eop-spark beside the operator image, with the same tag.
    assert "--default-image=registry.example.com/team/eop-spark:v9" in container["args"]
    assert {"--log-format=json", "--verbose"} <= set(container["args"])
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"

    explicit = deployment(render(helm, "defaultPipelineImage=spark.example.com/s:1"))
    (container,) = explicit["spec"]["template"]["spec"]["containers"]
    assert "--default-image=spark.example.com/s:1" in container["args"]


@pytest.mark.kube
@pytest.mark.parametrize(
    "values", [(), NAMESPACED, ("logLevel=debug", "logFormat=json")], ids=["all", "ns", "debug"]
)
def test_args_are_understood_by_eop_operator(helm: Helm, values: tuple[str, ...]) -> None:
    (container,) = deployment(render(helm, *values))["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["args"])  # exits on an unknown flag
    assert args.command == "operator"
    assert args.liveness == "http://0.0.0.0:8080/healthz"
    assert args.default_image == "localhost/eop-spark:0.1.0"


# --- RBAC ----------------------------------------------------------------------------------------


@pytest.mark.kube
def test_cluster_wide_uses_a_cluster_role(helm: Helm) -> None:
    objects = render(helm)
    (role,) = of_kind(objects, "ClusterRole")
    (binding,) = of_kind(objects, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "eop", "namespace": RELEASE_NAMESPACE}
    ]
    assert pipeline_roles(objects) == []
    (container,) = deployment(objects)["spec"]["template"]["spec"]["containers"]
    assert "--all-namespaces" in container["args"]
    assert not [a for a in container["args"] if a.startswith("--namespace")]


@pytest.mark.kube
def test_namespace_list_uses_a_role_per_namespace(helm: Helm) -> None:
    objects = render(helm, *NAMESPACED)
    assert of_kind(objects, "ClusterRole") == []
    assert of_kind(objects, "ClusterRoleBinding") == []
    roles = {r["metadata"]["namespace"]: r for r in pipeline_roles(objects)}
    bindings = {
        b["metadata"]["namespace"]: b
        for b in of_kind(objects, "RoleBinding")
        if not is_leader_election(b)
    }
    assert sorted(roles) == sorted(bindings) == ["team-a", "team-b"]
    for namespace, binding in bindings.items():
        assert binding["roleRef"]["name"] == roles[namespace]["metadata"]["name"]
        assert binding["subjects"][0]["namespace"] == RELEASE_NAMESPACE
    # The same rules as the cluster-wide mode: one list, two renderings.
    (cluster_role,) = of_kind(render(helm), "ClusterRole")
    for role in roles.values():
        assert role["rules"] == cluster_role["rules"]
    (container,) = deployment(objects)["spec"]["template"]["spec"]["containers"]
    assert {"--namespace=team-a", "--namespace=team-b"} <= set(container["args"])
    assert "--all-namespaces" not in container["args"]


@pytest.mark.kube
@MODES
def test_leases_only_in_the_release_namespace(helm: Helm, values: tuple[str, ...]) -> None:
    objects = render(helm, *values)
    (election,) = [r for r in of_kind(objects, "Role") if is_leader_election(r)]
    assert election["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert election["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "patch"],
        }
    ]
    pipeline_rules = [
        r
        for o in objects
        if o["kind"] in ("Role", "ClusterRole") and not is_leader_election(o)
        for r in o["rules"]
    ]
    assert granted(pipeline_rules, "coordination.k8s.io", "leases") == set()


@pytest.mark.kube
@MODES
def test_rbac_reads_secrets_by_name_only_and_never_escalates(
    helm: Helm, values: tuple[str, ...]
) -> None:
    rules = all_rules(render(helm, *values))
    assert rules
    for rule in rules:
        assert "*" not in rule.get("apiGroups", []), rule
        assert "*" not in rule["resources"], rule
        assert not FORBIDDEN_VERBS & set(rule["verbs"]), rule
        assert "nonResourceURLs" not in rule, rule
    # The health checks read the Secret a pipeline names; they can never list or watch them.
    assert granted(rules, "", "secrets") == {"get"}
    assert (
        granted(all_rules(render(helm, *values, "rbac.readSecrets=false")), "", "secrets") == set()
    )


def k8s_pipeline(namespace: str) -> Manifest:
    """A pipeline that runs executors on Kubernetes: the operator renders its driver RBAC too."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "chart-probe", "namespace": namespace},
        "spec": {
            "source": {"kafka": {"bootstrapServers": "kafka:9092", "topics": ["in"]}},
            "transform": {"sql": "SELECT key, value FROM source"},
            "sink": {"kafka": {"bootstrapServers": "kafka:9092", "topic": "out"}},
            "spark": {"master": "k8s://https://kubernetes.default.svc"},
        },
    }


def rendered_objects(namespace: str) -> list[Manifest]:
    pipeline = load_pipeline(k8s_pipeline(namespace))
    return render_pipeline(pipeline, default_image="eop-spark:test", generation=0).objects


@pytest.mark.kube
def test_rbac_covers_what_the_operator_renders(helm: Helm) -> None:
    rules = all_rules(render(helm))
    objects = rendered_objects("default")
    assert {o["kind"] for o in objects} >= {"Role", "RoleBinding", "StatefulSet"}
    for obj in objects:
        group = obj["apiVersion"].rpartition("/")[0]
        # Every kind the operator renders pluralises regularly (configmaps, statefulsets, ...).
        resource = obj["kind"].lower() + "s"
        missing = APPLY_VERBS - granted(rules, group, resource)
        assert not missing, f"{obj['kind']}: the chart lacks {sorted(missing)}"
    # No escalate/bind: the operator must itself hold what the drivers' Role grants.
    for rule in DRIVER_RULES:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                missing = set(rule["verbs"]) - granted(rules, group, resource)
                assert not missing, f"driver Role grants {resource} {sorted(missing)}"


# --- high availability and monitoring ------------------------------------------------------------


@pytest.mark.kube
def test_replicas_elect_a_leader(helm: Helm) -> None:
    dep = deployment(render(helm, "replicaCount=2", "leaderElection.leaseDuration=20"))
    assert dep["spec"]["replicas"] == 2
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.leader_election and args.leader_election_id == "eop"
    assert args.lease_duration == 20 and args.metrics_port == 9090
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    # Host-network pods cannot surge on one node (same ports): the old one stops first.
    on_host = deployment(render(helm, "hostNetwork=true"))
    assert on_host["spec"]["strategy"] == {"type": "Recreate"}


@pytest.mark.kube
def test_monitors_are_off_by_default(helm: Helm) -> None:
    kinds = {o["kind"] for o in render(helm)}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "Service"}


@pytest.mark.kube
def test_service_monitor_scrapes_the_operator(helm: Helm) -> None:
    objects = render(
        helm, "metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom"
    )
    (service,) = of_kind(objects, "Service")
    (monitor,) = of_kind(objects, "ServiceMonitor")
    pod = deployment(objects)["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    # The Service selects the operator pods, on the container port serving /metrics.
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "metrics" and ports["metrics"] == 9090
    assert f"--metrics-port={ports['metrics']}" in container["args"]
    # The ServiceMonitor selects that Service and its port by name.
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [RELEASE_NAMESPACE]}
    assert monitor["spec"]["endpoints"][0]["port"] == port["name"]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


@pytest.mark.kube
@MODES
def test_driver_pod_monitor_selects_the_driver_pods(helm: Helm, values: tuple[str, ...]) -> None:
    (monitor,) = of_kind(
        render(helm, *values, "metrics.driverPodMonitor.enabled=true"), "PodMonitor"
    )
    (statefulset,) = [o for o in rendered_objects("team-a") if o["kind"] == "StatefulSet"]
    pod = statefulset["spec"]["template"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    (driver,) = [c for c in pod["spec"]["containers"] if c["name"] == "driver"]
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] in {p["name"] for p in driver["ports"]}
    assert endpoint["path"] == "/metrics"
    expected = {"matchNames": ["team-a", "team-b"]} if values else {"any": True}
    assert monitor["spec"]["namespaceSelector"] == expected


# --- values schema -------------------------------------------------------------------------------


@pytest.mark.kube
@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("imagee.tag=x", "imagee"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("logLevel=verbose", "logLevel"),
        ("watchNamespaces={Team_A}", "watchNamespaces"),
        ("metrics.serviceMonitor.enable=true", "serviceMonitor"),
        ("replicaCount=0", "replicaCount"),
    ],
)
def test_values_typos_fail_the_schema(helm: Helm, value: str, complaint: str) -> None:
    result = helm.run("template", "eop", str(CHART), "--set", value)
    assert result.returncode != 0
    assert "schema" in result.stderr
    assert complaint in result.stderr


# --- the CRD -------------------------------------------------------------------------------------


def test_chart_crd_is_the_generated_one() -> None:
    assert CRD_FILE.exists(), f"{CRD_FILE} is missing: run `make crds`"
    assert CRD_FILE.read_text() == crd_yaml(), f"{CRD_FILE} drifted from the models: `make crds`"


def test_notes_example_is_a_valid_pipeline() -> None:
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    example = notes.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    load_pipeline(yaml.safe_load(example))


# --- on the real API server ----------------------------------------------------------------------


def as_operator(
    cp: ControlPlane, release: str, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """kubectl with the token of the operator's ServiceAccount ``<release>`` (fullname)."""
    config = cp.service_account_kubeconfig(RELEASE_NAMESPACE, release)
    return cp.kubectl(*args, kubeconfig=config, input=stdin)


def can_i(cp: ControlPlane, release: str, *args: str) -> bool:
    result = as_operator(cp, release, "auth", "can-i", *args)
    return result.stdout.strip() == "yes"


@dataclass(frozen=True)
class Release:
    """An installed release: its name (= the operator's ServiceAccount) and a served namespace."""

    name: str
    namespace: str
    namespaced: bool


@pytest.fixture
def installed(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[Release]:
    """The chart installed with ``request.param`` values (no kubelet needed: RBAC is the point)."""
    cp = control_plane
    # The chart's full name is the release name when that contains "eop": unique per test.
    release = f"eop-{uuid.uuid4().hex[:6]}"
    values: tuple[str, ...] = request.param
    namespaced = bool(values)
    namespaces = [f"{release}-a", f"{release}-b"] if namespaced else [f"{release}-any"]
    for ns in namespaces:
        cp.kubectl("create", "namespace", ns, check=True)
    if not CRD_FILE.exists():
        cp.kubectl("apply", "--server-side", "-f", "-", input=crd_yaml(), check=True)
    watch = ["--set", "watchNamespaces={" + ",".join(namespaces) + "}"] if namespaced else []
    result = cp.helm(
        "install",
        release,
        str(CHART),
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
        *watch,
    )
    assert result.returncode == 0, result.stderr
    yield Release(release, namespaces[0], namespaced)
    cp.helm("uninstall", release, "--namespace", RELEASE_NAMESPACE)
    for ns in namespaces:
        cp.kubectl("delete", "namespace", ns, "--wait=false")


@pytest.mark.kube
@pytest.mark.parametrize(
    "installed", [(), NAMESPACED], ids=["cluster-wide", "namespaced"], indirect=True
)
def test_operator_account_can_do_its_job_and_no_more(
    control_plane: ControlPlane, installed: Release
) -> None:
    cp, release, ns = control_plane, installed.name, installed.namespace

    # Everything the operator applies for a pipeline with executors on Kubernetes, including
    # the drivers' Role and its binding (which RBAC allows only without escalation).
    for obj in rendered_objects(ns):
        result = as_operator(
            cp,
            release,
            "apply",
            "--server-side",
            "--field-manager=eop-operator",
            "-f",
            "-",
            stdin=json.dumps(obj),
        )
        assert result.returncode == 0, f"{obj['kind']}: {result.stderr}"

    # Its own resource: status and finalizers.
    cp.kubectl("apply", "-f", "-", input=json.dumps(k8s_pipeline(ns)), check=True)
    status = as_operator(
        cp,
        release,
        "patch",
        PLURAL,
        "chart-probe",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Pending"}}),
    )
    assert status.returncode == 0, status.stderr
    finalizers = {"metadata": {"finalizers": ["exactlyonce.io/test"]}}
    patched = as_operator(
        cp,
        release,
        "patch",
        PLURAL,
        "chart-probe",
        "-n",
        ns,
        "--type=merge",
        "-p",
        json.dumps(finalizers),
    )
    assert patched.returncode == 0, patched.stderr
    cp.kubectl(
        "patch",
        PLURAL,
        "chart-probe",
        "-n",
        ns,
        "--type=merge",
        "-p",
        json.dumps({"metadata": {"finalizers": None}}),
        check=True,
    )
    assert can_i(cp, release, "create", "events", "-n", ns)
    assert can_i(cp, release, "patch", "events.events.k8s.io", "-n", ns)
    assert can_i(cp, release, "patch", "leases.coordination.k8s.io", "-n", RELEASE_NAMESPACE)
    assert can_i(cp, release, "get", "secrets", "-n", ns)  # the pipeline's Kafka Secret

    # And no more.
    assert not can_i(cp, release, "list", "secrets", "-n", ns)
    assert not can_i(cp, release, "watch", "secrets", "-n", ns)
    assert not can_i(cp, release, "list", "secrets", "--all-namespaces")
    assert not can_i(cp, release, "patch", "leases.coordination.k8s.io", "-n", "kube-system")
    assert not can_i(cp, release, "create", "clusterroles")
    assert not can_i(cp, release, "list", "nodes")
    if installed.namespaced:
        assert not can_i(cp, release, "list", PLURAL, "-n", "default")
