"""The Helm chart (charts/eop), linted and rendered by the real helm binary.

What a user of the chart would notice: it lints strictly, the operator runs non-root on a
read-only root filesystem, it serves its own namespace by default (a list of namespaces or every
namespace when asked), with Roles there only; it reads Secrets only by name (for lag reporting),
never grants escalation verbs and binds drivers to a pre-made role instead of holding pod rights;
pipelines asking for the node's network or files are refused unless allowed; replicas elect a
leader, the optional Prometheus monitors scrape what the operator and the drivers serve, a typo
in values fails, the CRD matches the models, and (on the real API server) the operator's
ServiceAccount can do everything the operator does and no more.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import time
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
from eop_operator.render import render_pipeline, rpc_secret
from eop_operator.render.executors import RPC_KEY_BYTES
from eop_operator.render.rbac import DEFAULT_DRIVER_ROLE, DRIVER_RULES, DriverRole

CHART = Path(__file__).resolve().parents[2] / "charts" / "eop"
CRD_FILE = CHART / "crds" / f"{PLURAL}.exactlyonce.io.yaml"
RELEASE_NAMESPACE = "eop-system"
FORBIDDEN_VERBS = {"*", "escalate", "impersonate"}
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


#: The namespace the tests' releases serve unless they say otherwise (the chart serves none
#: by default).
SERVED = "pipelines"
SERVE = (f"watchNamespaces={{{SERVED}}}",)


def render(helm: Helm, *values: str) -> list[Manifest]:
    """``helm template`` of the chart with ``--set``-style ``values`` (serving ``SERVED``
    unless they name the namespaces); the parsed objects."""
    if not any(v.startswith(("watchNamespaces=", "clusterWide=")) for v in values):
        values = (*SERVE, *values)
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


#: The pod's IP the kubelet puts in place of ``$(POD_IP)`` in the tests' operator args.
POD_IP = "10.1.0.5"


def operator_args(container: Manifest) -> argparse.Namespace:
    """``eop operator``'s reading of the container's args, ``$(POD_IP)`` expanded as the
    kubelet does; exits on an unknown flag."""
    return build_parser().parse_args([a.replace("$(POD_IP)", POD_IP) for a in container["args"]])


def is_leader_election(role: Manifest) -> bool:
    name: str = role["metadata"]["name"]
    return name.endswith("-leader-election")


def is_driver_role(role: Manifest) -> bool:
    name: str = role["metadata"]["name"]
    return name.endswith("-driver")


def is_guard(obj: Manifest) -> bool:
    """The namespaced mode's ClusterRole (and its RoleBindings) that keeps the operator's rights
    in a namespace until its pipelines are gone."""
    name: str = obj["metadata"]["name"]
    return name.endswith("-guard")


def assert_guard(objects: list[Manifest], namespaces: list[str]) -> None:
    """The only ClusterRole of the namespaced mode: get and patch on the operator's own Role and
    RoleBindings by name, bound in the served namespaces only."""
    (guard,) = of_kind(objects, "ClusterRole")
    assert of_kind(objects, "ClusterRoleBinding") == []
    name, own = guard["metadata"]["name"], pipeline_roles(objects)[0]["metadata"]["name"]
    group = ["rbac.authorization.k8s.io"]
    assert guard["rules"] == [
        {"apiGroups": group, "resources": ["roles"], "verbs": ["get", "patch"],
         "resourceNames": [own]},
        {"apiGroups": group, "resources": ["rolebindings"], "verbs": ["get", "patch"],
         "resourceNames": [own, name]},
    ]  # fmt: skip
    bindings = [b for b in of_kind(objects, "RoleBinding") if is_guard(b)]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == namespaces
    assert all(b["roleRef"]["name"] == name for b in bindings)
    (container,) = deployment(objects)["spec"]["template"]["spec"]["containers"]
    assert f"--rbac-name={own}" in container["args"]


def drivers_role(objects: list[Manifest]) -> Manifest:
    """The drivers' role (one per served namespace, all alike; or one ClusterRole)."""
    (first, *more) = [
        o for o in objects if o["kind"] in ("Role", "ClusterRole") and is_driver_role(o)
    ]
    for other in more:
        assert (other["kind"], other["metadata"]["name"], other["rules"]) == (
            first["kind"],
            first["metadata"]["name"],
            first["rules"],
        )
    return first


def pipeline_roles(objects: list[Manifest]) -> list[Manifest]:
    """The operator's per-namespace Roles (not its leases', not the drivers')."""
    return [
        r for r in of_kind(objects, "Role") if not is_leader_election(r) and not is_driver_role(r)
    ]


def all_rules(objects: list[Manifest]) -> list[Manifest]:
    return [
        rule for o in objects if o["kind"] in ("Role", "ClusterRole") for rule in o.get("rules", [])
    ]


def operator_rules(objects: list[Manifest]) -> list[Manifest]:
    """What the operator's own (Cluster)Roles grant, the drivers' role left out."""
    return [
        rule
        for o in objects
        if o["kind"] in ("Role", "ClusterRole") and not is_driver_role(o)
        for rule in o.get("rules", [])
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
CLUSTER_WIDE = ("clusterWide=true",)
MODES = pytest.mark.parametrize(
    "values", [SERVE, NAMESPACED, CLUSTER_WIDE], ids=["one", "namespaced", "cluster-wide"]
)


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
    assert container["args"][:2] == ["operator", f"--namespace={SERVED}"]
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
    "values",
    [(), NAMESPACED, CLUSTER_WIDE, ("logLevel=debug", "logFormat=json")],
    ids=["default", "ns", "all", "debug"],
)
def test_args_are_understood_by_eop_operator(helm: Helm, values: tuple[str, ...]) -> None:
    objects = render(helm, *values)
    (container,) = deployment(objects)["spec"]["template"]["spec"]["containers"]
    args = operator_args(container)  # exits on an unknown flag
    assert args.command == "operator"
    assert args.liveness == "http://0.0.0.0:8080/healthz"
    assert args.default_image == "localhost/eop-spark:0.1.0"
    # The drivers' role it binds is the one the chart creates, of the kind the mode needs.
    driver_role = drivers_role(objects)
    assert args.driver_role == DriverRole(driver_role["kind"], driver_role["metadata"]["name"])
    assert (args.all_namespaces, args.driver_role.kind) in [(True, "ClusterRole"), (False, "Role")]
    # Node access is refused unless the values allow it.
    assert not args.allow_host_network and not args.allow_host_path_volumes
    # One driver at a time restarts for an operator upgrade.
    assert args.operator_upgrade_parallelism == 1


@pytest.mark.kube
def test_operator_upgrade_parallelism_survives_an_upgrade_with_reuse_values(helm: Helm) -> None:
    """docs/install.md upgrades with --reuse-values: an older release's values have no
    operatorUpgrade, and the operator still restarts one driver at a time."""
    for value, parallelism in [("operatorUpgrade=null", 1), ("operatorUpgrade.parallelism=3", 3)]:
        (container,) = deployment(render(helm, value))["spec"]["template"]["spec"]["containers"]
        args = operator_args(container)
        assert args.operator_upgrade_parallelism == parallelism, value


@pytest.mark.kube
def test_pipeline_policy_values_allow_node_access(helm: Helm) -> None:
    for value, flag in [
        ("pipelinePolicy.allowHostNetwork=true", "allow_host_network"),
        ("pipelinePolicy.allowHostPathVolumes=true", "allow_host_path_volumes"),
    ]:
        (container,) = deployment(render(helm, value))["spec"]["template"]["spec"]["containers"]
        args = vars(operator_args(container))
        assert args[flag], value
        assert not any(v for k, v in args.items() if k.startswith("allow_") and k != flag)


@pytest.mark.kube
def test_pipelines_run_as_other_accounts_only_as_listed_and_never_as_the_operator(
    helm: Helm,
) -> None:
    (container,) = deployment(render(helm))["spec"]["template"]["spec"]["containers"]
    assert not operator_args(container).allow_service_account
    listed = render(helm, "pipelinePolicy.serviceAccounts={s3-reader,gcs-writer}")
    (container,) = deployment(listed)["spec"]["template"]["spec"]["containers"]
    assert operator_args(container).allow_service_account == ["s3-reader", "gcs-writer"]
    result = helm.run(
        "template", "eop", str(CHART), *set_args((*SERVE, "pipelinePolicy.serviceAccounts={eop}"))
    )
    assert result.returncode != 0 and "the operator's own ServiceAccount" in result.stderr


@pytest.mark.kube
def test_the_local_clusters_values_run_host_network_pipelines(helm: Helm, tmp_path: Path) -> None:
    """The devenv cluster has no pod network: `make demo` and tests/e2e install these values."""
    from types import SimpleNamespace

    from demo.run import Images, operator_values

    # The only things the values read from it.
    cluster = SimpleNamespace(apiserver_port=6443, pod_network=False)
    values = operator_values(
        cluster, Images("localhost/eop-operator:t", "localhost/eop-spark:t"), ["ads"]
    )  # type: ignore[arg-type]
    (tmp_path / "values.json").write_text(json.dumps(values))
    result = helm.run("template", "eop", str(CHART), "-f", str(tmp_path / "values.json"))
    assert result.returncode == 0, result.stderr
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    (container,) = deployment(objects)["spec"]["template"]["spec"]["containers"]
    args = operator_args(container)
    assert args.allow_host_network and args.namespace == ["ads"]


# --- RBAC ----------------------------------------------------------------------------------------


@pytest.mark.kube
def test_no_namespace_is_served_by_default(helm: Helm) -> None:
    """Pipelines are not invited into the operator's namespace: the chart asks which to serve."""
    result = helm.run("template", "eop", str(CHART), "--namespace", RELEASE_NAMESPACE)
    assert result.returncode != 0
    assert "watchNamespaces: list the namespaces whose pipelines the operator serves" in (
        result.stderr
    )


@pytest.mark.kube
def test_one_namespace_is_served_with_roles_there_and_leases_at_home(helm: Helm) -> None:
    objects = render(helm, *SERVE)
    assert_guard(objects, [SERVED])
    namespaces = {
        o["metadata"]["namespace"] for o in objects if o["kind"] in ("Role", "RoleBinding")
    }
    assert namespaces == {SERVED, RELEASE_NAMESPACE}  # leader election at home
    (role,) = pipeline_roles(objects)
    (driver_role,) = [r for r in of_kind(objects, "Role") if is_driver_role(r)]
    assert role["metadata"]["namespace"] == driver_role["metadata"]["namespace"] == SERVED
    (container,) = deployment(objects)["spec"]["template"]["spec"]["containers"]
    assert f"--namespace={SERVED}" in container["args"]
    assert "--all-namespaces" not in container["args"]


@pytest.mark.kube
def test_cluster_wide_uses_a_cluster_role(helm: Helm) -> None:
    objects = render(helm, *CLUSTER_WIDE)
    (role,) = [r for r in of_kind(objects, "ClusterRole") if not is_driver_role(r)]
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
    # The drivers' ClusterRole is bound by nothing the chart makes: it grants nothing by itself.
    (driver_role,) = [r for r in of_kind(objects, "ClusterRole") if is_driver_role(r)]
    assert binding["roleRef"]["name"] != driver_role["metadata"]["name"]
    (container,) = deployment(objects)["spec"]["template"]["spec"]["containers"]
    assert "--all-namespaces" in container["args"]
    assert not [a for a in container["args"] if a.startswith("--namespace")]


@pytest.mark.kube
def test_cluster_wide_with_a_namespace_list_fails(helm: Helm) -> None:
    result = helm.run("template", "eop", str(CHART), *set_args(CLUSTER_WIDE + NAMESPACED))
    assert result.returncode != 0
    assert "watchNamespaces must be empty with clusterWide" in result.stderr


def without_bind(rules: list[Manifest]) -> list[Manifest]:
    return [r for r in rules if r["verbs"] != ["bind"]]


@pytest.mark.kube
def test_namespace_list_uses_a_role_per_namespace(helm: Helm) -> None:
    objects = render(helm, *NAMESPACED)
    assert_guard(objects, ["team-a", "team-b"])
    roles = {r["metadata"]["namespace"]: r for r in pipeline_roles(objects)}
    bindings = {
        b["metadata"]["namespace"]: b
        for b in of_kind(objects, "RoleBinding")
        if not is_leader_election(b) and not is_guard(b)
    }
    driver_roles = {
        r["metadata"]["namespace"] for r in of_kind(objects, "Role") if is_driver_role(r)
    }
    assert sorted(roles) == sorted(bindings) == sorted(driver_roles) == ["team-a", "team-b"]
    for namespace, binding in bindings.items():
        assert binding["roleRef"]["name"] == roles[namespace]["metadata"]["name"]
        assert binding["subjects"][0]["namespace"] == RELEASE_NAMESPACE
    # The same rules as the cluster-wide mode (one list, two renderings), but for which kind of
    # drivers' role the operator may bind.
    (cluster_role,) = [r for r in of_kind(render(helm, *CLUSTER_WIDE), "ClusterRole")
                       if not is_driver_role(r)]  # fmt: skip
    for role in roles.values():
        assert without_bind(role["rules"]) == without_bind(cluster_role["rules"])
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
    objects = render(helm, *values)
    rules = all_rules(objects)
    assert rules
    driver_role = drivers_role(objects)
    for rule in rules:
        assert "*" not in rule.get("apiGroups", []), rule
        assert "*" not in rule["resources"], rule
        assert not FORBIDDEN_VERBS & set(rule["verbs"]), rule
        assert "nonResourceURLs" not in rule, rule
        if "bind" in rule["verbs"]:
            # bind only the drivers' pre-made role, by name: never a role of one's choosing.
            assert rule["verbs"] == ["bind"], rule
            assert rule["resources"] == [driver_role["kind"].lower() + "s"], rule
            assert rule["resourceNames"] == [driver_role["metadata"]["name"]], rule
    # The health checks read the Secret a pipeline names; they can never list or watch them.
    # The operator creates its pipelines' Spark RPC keys (and nothing else: the chart's
    # admission policy, test_operator_account_can_do_its_job_and_no_more).
    assert granted(rules, "", "secrets") == {"get", "create"}
    without_reads = render(helm, *values, "rbac.readSecrets=false")
    assert granted(all_rules(without_reads), "", "secrets") == {"create"}
    kinds = {o["kind"] for o in objects}
    assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= kinds


@MODES
def test_rbac_creates_and_reads_only_the_checkpoint_deletion_job(
    helm: Helm, values: tuple[str, ...]
) -> None:
    """retention Delete of an object-store checkpoint: the operator makes a Job (which holds
    the store's keys by Secret reference) and reads its status; it never deletes or lists
    Jobs (the garbage collector removes it with the pipeline)."""
    rules = operator_rules(render(helm, *values))
    assert granted(rules, "batch", "jobs") == {"get", "create"}
    assert not granted(rules, "batch", "cronjobs")


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


def rendered_objects(
    namespace: str, driver_role: DriverRole = DEFAULT_DRIVER_ROLE
) -> list[Manifest]:
    pipeline = load_pipeline(k8s_pipeline(namespace))
    return render_pipeline(
        pipeline, default_image="eop-spark:test", generation=0, driver_role=driver_role
    ).objects


@pytest.mark.kube
@MODES
def test_rbac_covers_what_the_operator_renders_and_no_pod_rights(
    helm: Helm, values: tuple[str, ...]
) -> None:
    objects = render(helm, *values)
    rules = operator_rules(objects)
    rendered = rendered_objects("team-a")
    assert {o["kind"] for o in rendered} >= {"ServiceAccount", "RoleBinding", "StatefulSet"}
    assert "Role" not in {o["kind"] for o in rendered}  # the drivers' role is the chart's
    for obj in rendered:
        group = obj["apiVersion"].rpartition("/")[0]
        # Every kind the operator renders pluralises regularly (configmaps, statefulsets, ...).
        resource = obj["kind"].lower() + "s"
        missing = APPLY_VERBS - granted(rules, group, resource)
        assert not missing, f"{obj['kind']}: the chart lacks {sorted(missing)}"
    # What drivers need is in their pre-made role, not with the operator: it cannot create pods
    # or roles, nor delete collections; of roles it may bind the drivers' and, namespaced, patch
    # its own (a finalizer, see assert_guard), by name.
    driver_role = drivers_role(objects)
    assert driver_role["rules"] == DRIVER_RULES
    assert granted(rules, "", "pods") == {"get", "list", "watch", "delete"}
    for rule in rules:
        if rule["resources"] in (["roles"], ["clusterroles"]):
            assert not set(rule["verbs"]) - {"bind", "get", "patch"}, rule
            assert len(rule["resourceNames"]) == 1, rule
    assert not any("deletecollection" in r["verbs"] for r in rules)


# --- high availability and monitoring ------------------------------------------------------------


@pytest.mark.kube
def test_replicas_elect_a_leader(helm: Helm) -> None:
    dep = deployment(render(helm, "replicaCount=2", "leaderElection.leaseDuration=20"))
    assert dep["spec"]["replicas"] == 2
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    args = operator_args(container)
    assert args.leader_election and args.leader_election_id == "eop"
    assert args.lease_duration == 20 and args.metrics_port == 9090
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
        "POD_IP": "status.podIP",
    }
    # Host-network pods cannot surge on one node (same ports): the old one stops first.
    on_host = deployment(render(helm, "hostNetwork=true"))
    assert on_host["spec"]["strategy"] == {"type": "Recreate"}


@pytest.mark.kube
def test_metrics_listen_on_the_pod_ip_unless_the_chart_says_otherwise(helm: Helm) -> None:
    (container,) = deployment(render(helm))["spec"]["template"]["spec"]["containers"]
    args = operator_args(container)
    assert args.metrics_address == POD_IP  # not every address of a host-network pod
    (container,) = deployment(render(helm, "metrics.address=0.0.0.0"))["spec"]["template"]["spec"][
        "containers"
    ]
    assert operator_args(container).metrics_address == "0.0.0.0"


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
    expected = {
        SERVE: {"matchNames": [SERVED]},
        NAMESPACED: {"matchNames": ["team-a", "team-b"]},
        CLUSTER_WIDE: {"any": True},
    }[values]
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
        ("pipelinePolicy.allowHostNetworks=true", "allowHostNetworks"),
        ("clusterWide=yes", "clusterWide"),
        ("operatorUpgrade.parallelism=0", "parallelism"),
        ("metrics.address=everywhere", "address"),
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


@dataclass(frozen=True)
class Release:
    """An installed release: its name (= the operator's ServiceAccount), where it is installed,
    a namespace it serves and the drivers' role it binds there."""

    name: str
    operator_namespace: str
    namespace: str
    mode: str

    @property
    def driver_role(self) -> DriverRole:
        return DriverRole(
            "ClusterRole" if self.mode == "cluster-wide" else "Role", f"{self.name}-driver"
        )


def as_operator(
    cp: ControlPlane, release: Release, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """kubectl with the token of the operator's ServiceAccount (the release's fullname)."""
    config = cp.service_account_kubeconfig(release.operator_namespace, release.name)
    return cp.kubectl(*args, kubeconfig=config, input=stdin)


def can_i(cp: ControlPlane, release: Release, *args: str) -> bool:
    result = as_operator(cp, release, "auth", "can-i", *args)
    return result.stdout.strip() == "yes"


def install(cp: ControlPlane, mode: str) -> Release:
    """Install the chart in a new namespace: its default, a namespace list, or cluster-wide."""
    # The chart's full name is the release name when that contains "eop": unique per test.
    release = f"eop-{uuid.uuid4().hex[:6]}"
    operator_ns = f"{release}-system"
    served = {
        "default": [operator_ns],
        "namespaced": [f"{release}-a", f"{release}-b"],
        "cluster-wide": [f"{release}-any"],
    }[mode]
    for ns in {operator_ns, *served}:
        cp.kubectl("create", "namespace", ns, check=True)
    if not CRD_FILE.exists():
        cp.kubectl("apply", "--server-side", "-f", "-", input=crd_yaml(), check=True)
    values = {
        "default": ["--set", f"watchNamespaces={{{operator_ns}}}"],
        "namespaced": ["--set", "watchNamespaces={" + ",".join(served) + "}"],
        "cluster-wide": ["--set", "clusterWide=true"],
    }[mode]
    result = cp.helm("install", release, str(CHART), "--namespace", operator_ns, *values)
    assert result.returncode == 0, result.stderr
    return Release(release, operator_ns, served[0], mode)


def uninstall(cp: ControlPlane, release: Release) -> None:
    cp.helm("uninstall", release.name, "--namespace", release.operator_namespace)
    for ns in {release.operator_namespace, release.namespace}:
        cp.kubectl("delete", "namespace", ns, "--wait=false")


@pytest.fixture
def installed(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[Release]:
    """The chart installed in mode ``request.param`` (no kubelet needed: RBAC is the point)."""
    release = install(control_plane, request.param)
    yield release
    uninstall(control_plane, release)


def apply_as_operator(
    cp: ControlPlane, release: Release, obj: Manifest
) -> subprocess.CompletedProcess[str]:
    """Server-side apply of ``obj`` with the operator's field manager and token."""
    return as_operator(
        cp,
        release,
        "apply",
        "--server-side",
        "--field-manager=eop-operator",
        "-f",
        "-",
        stdin=json.dumps(obj),
    )


def account_of(rendered: list[Manifest]) -> str:
    """The driver's ServiceAccount among a pipeline's rendered objects."""
    (account,) = [o["metadata"]["name"] for o in rendered if o["kind"] == "ServiceAccount"]
    return str(account)


def eventually_refused(cp: ControlPlane, release: Release, secret: Manifest) -> str:
    """Create ``secret`` as the operator until the API server refuses it; its answer.

    A policy is in force a moment after it is created: what got through before is deleted.
    """
    deadline = time.monotonic() + 30
    while True:
        result = as_operator(cp, release, "create", "-f", "-", stdin=json.dumps(secret))
        if result.returncode != 0:
            return result.stderr
        meta = secret["metadata"]
        cp.kubectl("delete", "secret", meta["name"], "-n", meta["namespace"], check=True)
        assert time.monotonic() < deadline, f"the operator could create {meta['name']}"
        time.sleep(1)


@pytest.mark.kube
@pytest.mark.parametrize("installed", ["default", "namespaced", "cluster-wide"], indirect=True)
def test_operator_account_can_do_its_job_and_no_more(
    control_plane: ControlPlane, installed: Release
) -> None:
    cp, release, ns = control_plane, installed, installed.namespace

    # Everything the operator applies for a pipeline with executors on Kubernetes, including
    # the driver's binding to the chart's drivers' role (RBAC allows it by `bind` on that role).
    rendered = rendered_objects(ns, release.driver_role)
    for obj in rendered:
        result = apply_as_operator(cp, release, obj)
        assert result.returncode == 0, f"{obj['kind']}: {result.stderr}"
    # ... and the pipeline's Spark RPC key, which it creates (never applies, reads or updates).
    key = rpc_secret(load_pipeline(k8s_pipeline(ns)), secrets.token_bytes(RPC_KEY_BYTES))
    created = as_operator(cp, release, "create", "-f", "-", stdin=json.dumps(key))
    assert created.returncode == 0, created.stderr
    # Any other Secret is refused to it, a token of one of the namespace's accounts above all
    # (the admission policy may take a moment to be in force after the install).
    token = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "mint-spark-rpc",
            "namespace": ns,
            "labels": key["metadata"]["labels"],
            "annotations": {"kubernetes.io/service-account.name": account_of(rendered)},
        },
        "type": "kubernetes.io/service-account-token",
    }
    other = {**key, "metadata": {**key["metadata"], "name": "payments-db"}}
    for refused in (token, other):
        answer = eventually_refused(cp, release, refused)
        assert "creates only the Opaque <pipeline>-spark-rpc Secrets" in answer, answer
    # The driver can run its executors in its namespace, and nothing more.
    account = account_of(rendered)
    as_driver = ("--as", f"system:serviceaccount:{ns}:{account}")
    for verb in ("create", "delete", "deletecollection"):
        assert (
            cp.kubectl("auth", "can-i", verb, "pods", "-n", ns, *as_driver).stdout.strip() == "yes"
        )
    assert (
        cp.kubectl("auth", "can-i", "get", "secrets", "-n", ns, *as_driver).stdout.strip() == "no"
    )
    assert (
        cp.kubectl("auth", "can-i", "create", "pods", "-n", "default", *as_driver).stdout.strip()
        == "no"
    )

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
    assert can_i(
        cp, release, "patch", "leases.coordination.k8s.io", "-n", release.operator_namespace
    )
    assert can_i(cp, release, "get", "secrets", "-n", ns)  # the pipeline's Kafka Secret
    assert can_i(cp, release, "delete", "pods", "-n", ns)  # restarts a stalled driver

    # And no more: no pods or roles of its own making, no binding of any other role.
    for verb, resource in [
        ("create", "pods"),
        ("deletecollection", "pods"),
        ("create", "roles"),
        ("create", "clusterroles"),
        ("list", "secrets"),
        ("watch", "secrets"),
    ]:
        assert not can_i(cp, release, verb, resource, "-n", ns), f"{verb} {resource}"
    admin = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "chart-probe-admin", "namespace": ns},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "admin",
        },
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
    }
    escalation = apply_as_operator(cp, release, admin)
    assert escalation.returncode != 0 and "forbidden" in escalation.stderr.lower()
    assert not can_i(cp, release, "list", "secrets", "--all-namespaces")
    assert not can_i(cp, release, "patch", "leases.coordination.k8s.io", "-n", "kube-system")
    assert not can_i(cp, release, "list", "nodes")
    if installed.mode != "cluster-wide":
        assert not can_i(cp, release, "list", PLURAL, "-n", "default")
        assert not can_i(cp, release, "get", "secrets", "-n", "default")
        assert not can_i(cp, release, "create", "serviceaccounts", "-n", "default")
