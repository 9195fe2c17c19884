"""The operator, installed by the chart and run with only its RBAC, on a real API server.

etcd, kube-apiserver and kube-controller-manager (for the garbage collector and
the StatefulSet controller) are real; no kubelet runs at this tier, so driver
pods stay Pending and the phase stays Pending.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.kube import ControlPlane
from tests.integration.operators import OperatorProcess, install_chart, wait_for

OPERATOR_NAMESPACE = "eop-system"

pytestmark = pytest.mark.kube


def get(cp: ControlPlane, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    result = cp.kubectl("get", kind, name, "-n", namespace, "-o", "json")
    return json.loads(result.stdout) if result.returncode == 0 else None


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """Install the chart (CRD + RBAC), then run `eop operator` as the chart's ServiceAccount."""
    kubeconfig = install_chart(control_plane, "eop", OPERATOR_NAMESPACE)
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    op = OperatorProcess(kubeconfig, log, "--all-namespaces")
    wait_for(op.alive, "the operator's liveness endpoint", timeout=60)
    yield log
    op.stop()
    # Other modules' namespaces being deleted refuse new events with 403 too; that is not RBAC.
    # The timestamp is left out: its milliseconds can be 403.
    messages = [line.split("]", 1)[-1] for line in log.read_text().splitlines()]
    denied = [
        line
        for line in messages
        if ("Forbidden" in line or re.search(r"\b403\b", line))
        and "is being terminated" not in line
    ]
    assert not denied, "the chart's RBAC was not enough:\n" + "\n".join(denied[:10])


def _pipeline(name: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "source": {"kafka": {"bootstrapServers": "127.0.0.1:9092", "topics": ["raw"]}},
        "transform": {"sql": "SELECT key, value FROM source WHERE value IS NOT NULL"},
        "sink": {"kafka": {"bootstrapServers": "127.0.0.1:9092", "topic": "clean"}},
    }
    base.update(spec)
    return {
        "apiVersion": "exactlyonce.io/v1alpha1",
        "kind": "ExactlyOncePipeline",
        "metadata": {"name": name},
        "spec": base,
    }


def _apply(cp: ControlPlane, namespace: str, obj: dict[str, Any]) -> None:
    cp.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj), check=True)


def _events(cp: ControlPlane, namespace: str, name: str) -> list[dict[str, Any]]:
    items = json.loads(
        cp.kubectl(
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            f"involvedObject.name={name},involvedObject.kind=ExactlyOncePipeline",
            "-o",
            "json",
            check=True,
        ).stdout
    )["items"]
    return list(items)


CHILDREN = [
    ("configmap", "clean-config"),
    ("persistentvolumeclaim", "clean-checkpoint"),
    ("service", "clean-driver"),
    ("statefulset", "clean-driver"),
]


def test_pipeline_lifecycle_create_update_delete(
    control_plane: ControlPlane, operator: Path, kube_namespace: str
) -> None:
    cp, ns = control_plane, kube_namespace
    _apply(cp, ns, _pipeline("clean"))
    owner_uid = wait_for(
        lambda: (get(cp, "eop", "clean", ns) or {}).get("metadata", {}).get("uid"), "uid"
    )

    for kind, name in CHILDREN:
        obj = wait_for(lambda kind=kind, name=name: get(cp, kind, name, ns), f"{kind}/{name}")
        owners = obj["metadata"].get("ownerReferences", [])
        assert [o["uid"] for o in owners] == [owner_uid], f"{kind}/{name} is not owned"

    status = wait_for(
        lambda: (
            (get(cp, "eop", "clean", ns) or {}).get("status", {}).get("specHash")
            and get(cp, "eop", "clean", ns)["status"]
        ),  # type: ignore[index]
        "status",
    )
    assert status["phase"] == "Pending"  # no kubelet at this tier: the driver never gets Ready
    assert status["transactionalIdPrefix"] == f"eop.{ns}.clean"
    assert status["progressGroup"] == f"eop.{ns}.clean"
    assert status["checkpoint"]["generation"] == 0
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions["Ready"] == "False" and conditions["Progressing"] == "True"
    assert any(e["reason"] == "Submitted" for e in _events(cp, ns, "clean"))

    sts = get(cp, "statefulset", "clean-driver", ns)
    assert sts is not None
    old_hash = sts["spec"]["template"]["metadata"]["annotations"]["exactlyonce.io/spec-hash"]
    run = json.loads(get(cp, "configmap", "clean-config", ns)["data"]["run.json"])  # type: ignore[index]
    assert run["transform"]["sql"].startswith("SELECT key, value")

    # A query change rolls the driver: the StatefulSet's pod template follows the spec.
    updated = _pipeline("clean")
    updated["spec"]["transform"]["sql"] = "SELECT value FROM source"
    _apply(cp, ns, updated)
    new_sts = wait_for(
        lambda: (
            (s := get(cp, "statefulset", "clean-driver", ns))
            and s["spec"]["template"]["metadata"]["annotations"]["exactlyonce.io/spec-hash"]
            != old_hash
            and s
        ),
        "the StatefulSet to follow the spec",
    )
    assert new_sts["spec"]["replicas"] == 1
    run = json.loads(get(cp, "configmap", "clean-config", ns)["data"]["run.json"])  # type: ignore[index]
    assert run["transform"]["sql"] == "SELECT value FROM source"

    # Suspend scales the driver to zero and says so.
    updated["spec"]["suspend"] = True
    _apply(cp, ns, updated)
    wait_for(lambda: get(cp, "statefulset", "clean-driver", ns)["spec"]["replicas"] == 0, "suspend")  # type: ignore[index]
    wait_for(lambda: get(cp, "eop", "clean", ns)["status"].get("phase") == "Suspended", "Suspended")  # type: ignore[index]

    # Another owner of the claim (a backup tool's, say) is not eop's to remove.
    cp.kubectl("create", "configmap", "keeper", "-n", ns, check=True)
    keeper = {"apiVersion": "v1", "kind": "ConfigMap", "name": "keeper"}
    keeper["uid"] = get(cp, "configmap", "keeper", ns)["metadata"]["uid"]  # type: ignore[index]
    cp.kubectl(
        "patch", "pvc", "clean-checkpoint", "-n", ns, "--type=json",
        "-p", json.dumps([{"op": "add", "path": "/metadata/ownerReferences/-", "value": keeper}]),
        check=True,
    )  # fmt: skip

    # Delete: the finalizer keeps the checkpoint claim (retention Retain), the GC removes the rest.
    # (kopf's 60 s daemon polling once made this take a minute: see handlers.configure)
    cp.kubectl("delete", "eop", "clean", "-n", ns, "--wait=true", "--timeout=30s", check=True)
    for kind, name in CHILDREN:
        if kind == "persistentvolumeclaim":
            continue
        wait_for(
            lambda kind=kind, name=name: get(cp, kind, name, ns) is None, f"GC of {kind}/{name}"
        )
    claim = get(cp, "persistentvolumeclaim", "clean-checkpoint", ns)
    assert claim is not None and claim["metadata"].get("ownerReferences") == [keeper]
    assert claim["metadata"].get("deletionTimestamp") is None


def _degraded(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    """The pipeline's Degraded condition, once it is True."""
    return wait_for(
        lambda: next(
            (
                c
                for c in ((get(cp, "eop", name, ns) or {}).get("status") or {}).get(
                    "conditions", []
                )
                if c["type"] == "Degraded" and c["status"] == "True"
            ),
            None,
        ),
        f"{name} Degraded",
    )


def test_a_pipeline_author_gets_no_other_account_and_no_other_teams_objects(
    control_plane: ControlPlane, operator: Path, kube_namespace: str
) -> None:
    """Creating a pipeline grants no more than a restricted pod as its own ServiceAccount:
    the operator's account is refused before any driver exists, and another team's ConfigMap
    and Secret named as children are reported, never written, adopted or deleted with the
    pipeline."""
    cp, ns = control_plane, kube_namespace
    # The account the operator runs as, were the pipeline in the operator's namespace.
    _apply(cp, ns, _pipeline("runas", serviceAccountName="eop"))
    victim = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "victim-config"}}
    victim["data"] = {"team": "b"}
    _apply(cp, ns, victim)
    before = get(cp, "configmap", "victim-config", ns)
    _apply(cp, ns, _pipeline("victim"))
    # A Secret of the RPC key's name: the driver would mount it as its key.
    cp.kubectl("create", "secret", "generic", "keyed-spark-rpc", "-n", ns, check=True)
    secret = get(cp, "secret", "keyed-spark-rpc", ns)
    _apply(cp, ns, _pipeline("keyed", spark={"master": "k8s://https://kubernetes.default.svc"}))

    refused = _degraded(cp, ns, "runas")
    assert "spec.serviceAccountName: " in refused["message"] and "'eop'" in refused["message"]
    assert get(cp, "statefulset", "runas-driver", ns) is None
    taken = _degraded(cp, ns, "victim")
    assert taken["reason"] == "ChildNotOwned"
    assert "ConfigMap victim-config exists and is not this pipeline's" in taken["message"]
    keyed = _degraded(cp, ns, "keyed")
    assert "Secret keyed-spark-rpc exists and is not this pipeline's" in keyed["message"]
    assert get(cp, "statefulset", "keyed-driver", ns) is None
    assert get(cp, "statefulset", "victim-driver", ns) is None  # it would read their ConfigMap
    assert get(cp, "configmap", "victim-config", ns) == before
    cp.kubectl("delete", "eop", "victim", "runas", "keyed", "-n", ns, "--timeout=30s", check=True)
    # Unchanged, so with no ownerReference: nothing the garbage collector removes with them.
    assert get(cp, "configmap", "victim-config", ns) == before
    assert get(cp, "secret", "keyed-spark-rpc", ns) == secret


def _raw(cp: ControlPlane, verb: str, path: str, account: str) -> tuple[int, str]:
    """A raw API request as the ServiceAccount ``namespace:name``."""
    result = cp.kubectl(verb, "--raw", path, f"--as=system:serviceaccount:{account}")
    return result.returncode, result.stdout + result.stderr


def _executor_pod(pipeline: str, **spec: Any) -> dict[str, Any]:
    labels = {"exactlyonce.io/pipeline": pipeline, "app.kubernetes.io/component": "executor"}
    container = {"name": "executor", "image": "localhost/eop-spark:test"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": f"{pipeline}-exec-", "labels": labels},
        "spec": {"automountServiceAccountToken": False, "containers": [container], **spec},
    }


def test_driver_code_reaches_only_its_own_pipelines_executors(
    control_plane: ControlPlane, operator: Path, kube_namespace: str
) -> None:
    """What user code in a k8s:// driver may do with its account (the chart's driver role and
    policy, bound as the operator binds it): its own executors, nothing of another pipeline."""
    cp, ns = control_plane, kube_namespace
    for account in ("a-driver", "eop"):  # eop: as if the operator's, were it this namespace
        cp.kubectl("create", "serviceaccount", account, "-n", ns, check=True)
    cp.kubectl(
        "create", "rolebinding", "a-driver", "-n", ns, "--clusterrole=eop-driver",
        f"--serviceaccount={ns}:a-driver",
        check=True,
    )  # fmt: skip
    theirs = _executor_pod("b")
    theirs["metadata"] = {"name": "b-exec-1", "labels": theirs["metadata"]["labels"]}
    _apply(cp, ns, theirs)
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "b-ckpt"}}
    claim["spec"] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
    }
    _apply(cp, ns, claim)
    cp.kubectl("create", "configmap", "b-config", "-n", ns, check=True)

    def as_driver(*args: str, manifest: dict[str, Any] | None = None) -> tuple[int, str]:
        result = cp.kubectl(
            *args, "-n", ns, f"--as=system:serviceaccount:{ns}:a-driver", "--dry-run=server",
            input=None if manifest is None else yaml.safe_dump(manifest),
        )  # fmt: skip
        return result.returncode, result.stdout + result.stderr

    created = wait_for(
        lambda: as_driver("create", "-f", "-", manifest=_executor_pod("a"))[0] == 0 or None,
        "own executor",
    )
    assert created
    refusals = {
        "foreign pod": (
            as_driver("create", "-f", "-", manifest=_executor_pod("b")),
            "creates only its own executor pods",
        ),
        "token": (
            as_driver(
                "create", "-f", "-", manifest=_executor_pod("a", automountServiceAccountToken=True)
            ),
            "without an API token",
        ),
        "other account": (
            as_driver("create", "-f", "-", manifest=_executor_pod("a", serviceAccountName="eop")),
            "as no other ServiceAccount",
        ),
        "delete their pod": (
            as_driver("delete", "pod", "b-exec-1"),
            "deletes only its own executor pods",
        ),
        "delete every pod": (
            as_driver("delete", "pods", "--all"),
            "deletes only its own executor pods",
        ),
        "delete them all at once": (
            # One deletecollection request, as Spark sends for its executors: judged per pod.
            _raw(cp, "delete", f"/api/v1/namespaces/{ns}/pods?dryRun=All", f"{ns}:a-driver"),
            "deletes only its own executor pods",
        ),
        "delete their config": (as_driver("delete", "configmap", "b-config"), "config maps and"),
        "delete their claim": (as_driver("delete", "pvc", "b-ckpt"), "forbidden"),
    }
    for case, ((code, output), expected) in refusals.items():
        assert code != 0 and expected in output, f"{case}: {output}"


def test_retention_delete_lets_the_gc_remove_the_checkpoint(
    control_plane: ControlPlane, operator: Path, kube_namespace: str
) -> None:
    cp, ns = control_plane, kube_namespace
    _apply(cp, ns, _pipeline("scratch", checkpoint={"retention": "Delete"}))
    wait_for(lambda: get(cp, "persistentvolumeclaim", "scratch-checkpoint", ns), "the claim")
    cp.kubectl("delete", "eop", "scratch", "-n", ns, "--wait=true", "--timeout=60s", check=True)
    wait_for(
        lambda: get(cp, "persistentvolumeclaim", "scratch-checkpoint", ns) is None,
        "GC of the claim",
    )


S3_CHECKPOINT = {
    "uri": "s3a://eop-checkpoints/team-a",
    "secretRef": {"name": "s3-credentials"},
    "options": {"fs.s3a.endpoint": "http://127.0.0.1:8333", "fs.s3a.path.style.access": "true"},
}


def test_retention_delete_of_object_storage_runs_a_job_with_the_secret_before_the_pipeline_goes(
    control_plane: ControlPlane, operator: Path, kube_namespace: str
) -> None:
    """The operator never uses the store's keys: a Job with the pipeline's Secret deletes the
    prefix, and the pipeline goes once it succeeds. No kubelet runs here: the Job's pod (made
    by the real Job controller) is marked Succeeded by hand, as the kubelet would report it."""
    cp, ns = control_plane, kube_namespace
    secret_value = "s3cr3t-never-copied"
    cp.kubectl(
        "create", "secret", "generic", "s3-credentials", "-n", ns,
        "--from-literal=AWS_ACCESS_KEY_ID=EOPTESTKEY",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={secret_value}",
        check=True,
    )  # fmt: skip
    _apply(cp, ns, _pipeline("s3", checkpoint=S3_CHECKPOINT | {"retention": "Delete"}))
    sts = wait_for(lambda: get(cp, "statefulset", "s3-driver", ns), "the driver StatefulSet")
    assert get(cp, "persistentvolumeclaim", "s3-checkpoint", ns) is None
    driver = sts["spec"]["template"]["spec"]["containers"][0]
    secret_env = [e for e in driver["env"] if e["name"].startswith("AWS_")]
    assert {e["name"] for e in secret_env} == {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    }
    assert all(e["valueFrom"]["secretKeyRef"]["name"] == "s3-credentials" for e in secret_env)

    cp.kubectl("delete", "eop", "s3", "-n", ns, "--wait=false", check=True)
    job = wait_for(lambda: get(cp, "job", "s3-checkpoint-delete", ns), "the deletion Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    root = f"s3a://eop-checkpoints/team-a/{ns}/s3"
    assert container["args"][:3] == ["checkpoint", "delete", root]
    assert [e for e in container["env"] if e["name"].startswith("AWS_")] == secret_env
    # The keys are nowhere but in the Secret: not in the Job, the ConfigMap, status or events.
    seen = json.dumps([job, get(cp, "configmap", "s3-config", ns), get(cp, "eop", "s3", ns)])
    assert secret_value not in seen and secret_value not in json.dumps(_events(cp, ns, "s3"))
    assert any(e["reason"] == "CheckpointDeleting" for e in _events(cp, ns, "s3"))
    assert get(cp, "eop", "s3", ns) is not None  # held by the finalizer until the Job succeeds

    pod = wait_for(
        lambda: (
            json.loads(
                cp.kubectl(
                    "get", "pods", "-n", ns, "-l", "job-name=s3-checkpoint-delete", "-o", "json",
                    check=True,
                ).stdout
            )["items"]
            or [None]
        )[0],
        "the Job's pod",
    )  # fmt: skip
    succeeded = {
        "status": {
            "phase": "Succeeded",
            "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted"}],
            "containerStatuses": [
                {
                    "name": "delete",
                    "image": container["image"],
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                }
            ],
        }
    }
    cp.kubectl(
        "patch", "pod", pod["metadata"]["name"], "-n", ns, "--subresource=status",
        "--type=merge", "-p", json.dumps(succeeded),
        check=True,
    )  # fmt: skip
    wait_for(lambda: get(cp, "eop", "s3", ns) is None, "the pipeline to go", timeout=90)


def test_retention_retain_of_object_storage_leaves_the_objects_alone(
    control_plane: ControlPlane, operator: Path, kube_namespace: str
) -> None:
    cp, ns = control_plane, kube_namespace
    _apply(cp, ns, _pipeline("kept", checkpoint=S3_CHECKPOINT))
    wait_for(lambda: get(cp, "statefulset", "kept-driver", ns), "the driver StatefulSet")
    cp.kubectl("delete", "eop", "kept", "-n", ns, "--wait=true", "--timeout=60s", check=True)
    assert get(cp, "job", "kept-checkpoint-delete", ns) is None
    retained = [e for e in _events(cp, ns, "kept") if e["reason"] == "CheckpointRetained"]
    assert retained and f"s3a://eop-checkpoints/team-a/{ns}/kept kept" in retained[0]["message"]


@pytest.mark.parametrize(
    ("pattern", "named"),
    [
        ("raw(", "topicPattern 'raw(' is not a valid regex"),  # Python cannot compile it
        ("raw|clean", "sink.kafka.topic 'clean' matches source.kafka.topicPattern 'raw|clean'"),
    ],
    ids=["uncompilable", "reads-the-sink"],
)
def test_spec_the_api_server_accepts_but_eop_cannot_run_is_reported(
    control_plane: ControlPlane, operator: Path, kube_namespace: str, pattern: str, named: str
) -> None:
    # Both pass CEL, which compiles no user regex.
    cp, ns = control_plane, kube_namespace
    bad = _pipeline("broken")
    del bad["spec"]["source"]["kafka"]["topics"]
    bad["spec"]["source"]["kafka"]["topicPattern"] = pattern
    _apply(cp, ns, bad)
    status = wait_for(
        lambda: (
            (get(cp, "eop", "broken", ns) or {}).get("status", {}).get("phase") == "Invalid"
            and get(cp, "eop", "broken", ns)["status"]
        ),  # type: ignore[index]
        "phase Invalid",
    )
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True"
    assert named in degraded["message"]
    warnings = [e for e in _events(cp, ns, "broken") if e["type"] == "Warning"]
    assert any(named in e["message"] for e in warnings)
    assert get(cp, "statefulset", "broken-driver", ns) is None


def _scale(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    path = f"/apis/exactlyonce.io/v1alpha1/namespaces/{namespace}/exactlyoncepipelines/{name}/scale"
    scale: dict[str, Any] = json.loads(cp.kubectl("get", "--raw", path, check=True).stdout)
    return scale


def test_executors_on_kubernetes_get_an_rpc_key_and_scale_with_kubectl(
    control_plane: ControlPlane, operator: Path, kube_namespace: str
) -> None:
    """The operator makes the RPC key Secret once; `kubectl scale` changes the executor count."""
    cp, ns = control_plane, kube_namespace
    master = {"master": "k8s://https://kubernetes.default.svc", "executor": {"instances": 2}}
    _apply(cp, ns, _pipeline("wide", spark=master))
    owner = wait_for(
        lambda: (get(cp, "eop", "wide", ns) or {}).get("metadata", {}).get("uid"), "uid"
    )
    secret = wait_for(lambda: get(cp, "secret", "wide-spark-rpc", ns), "the RPC key Secret")
    assert secret["type"] == "Opaque" and secret["immutable"] is True
    assert [o["uid"] for o in secret["metadata"]["ownerReferences"]] == [owner]
    assert len(base64.b64decode(secret["data"]["key"])) == 32
    sts = wait_for(lambda: get(cp, "statefulset", "wide-driver", ns), "the driver StatefulSet")
    volumes = sts["spec"]["template"]["spec"]["volumes"]
    assert {"secretName": "wide-spark-rpc", "defaultMode": 0o400} in [
        v.get("secret") for v in volumes
    ]
    # The key appears nowhere but in its Secret.
    config = json.dumps(get(cp, "configmap", "wide-config", ns))
    assert (
        secret["data"]["key"] not in config
        and base64.b64decode(secret["data"]["key"]).hex() not in config
    )

    # /scale: the executor count, and what the operator reports (no kubelet: no driver runs).
    selector = wait_for(
        lambda: (get(cp, "eop", "wide", ns) or {}).get("status", {}).get("executorSelector"),
        "status.executorSelector",
    )
    scale = _scale(cp, ns, "wide")
    assert scale["spec"]["replicas"] == 2
    assert scale["status"] == {"replicas": 0, "selector": selector}
    assert "app.kubernetes.io/component=executor" in selector

    # kubectl scale: a new count, so a new spec hash: the upgrade rules roll the driver.
    old_hash = sts["spec"]["template"]["metadata"]["annotations"]["exactlyonce.io/spec-hash"]
    cp.kubectl("scale", "eop/wide", "-n", ns, "--replicas=3", check=True)
    assert get(cp, "eop", "wide", ns)["spec"]["spark"]["executor"]["instances"] == 3  # type: ignore[index]
    rolled = wait_for(
        lambda: (
            (s := get(cp, "statefulset", "wide-driver", ns))
            and s["spec"]["template"]["metadata"]["annotations"]["exactlyonce.io/executors"] == "3"
            and s
        ),
        "the driver rolled with 3 executors",
    )
    assert (
        rolled["spec"]["template"]["metadata"]["annotations"]["exactlyonce.io/spec-hash"]
        != old_hash
    )
    run = json.loads(get(cp, "configmap", "wide-config", ns)["data"]["run.json"])  # type: ignore[index]
    assert run["spark"]["conf"]["spark.executor.instances"] == "3"
    # The key stays the one the driver and its executors share.
    again = get(cp, "secret", "wide-spark-rpc", ns)
    assert again is not None and again["metadata"]["uid"] == secret["metadata"]["uid"]
    assert again["data"] == secret["data"]

    # A pipeline in local mode has no executors to scale: the API server says why.
    _apply(cp, ns, _pipeline("narrow"))
    refused = cp.kubectl("scale", "eop/narrow", "-n", ns, "--replicas=2")
    assert refused.returncode != 0
    assert "spark.executor.instances applies to a k8s:// master only" in refused.stderr
    assert _scale(cp, ns, "narrow")["spec"]["replicas"] == 1
    assert get(cp, "secret", "narrow-spark-rpc", ns) is None

    # The garbage collector takes the key with its pipeline.
    cp.kubectl("delete", "eop", "wide", "-n", ns, "--wait=true", "--timeout=30s", check=True)
    wait_for(lambda: get(cp, "secret", "wide-spark-rpc", ns) is None, "GC of the RPC key")


def test_a_pipeline_applied_as_v1beta1_runs_and_a_newer_operators_condition_survives(
    control_plane: ControlPlane, operator: Path, kube_namespace: str
) -> None:
    """The operator reads the storage version whatever version a user applied; a condition
    of a type it does not write (a newer operator's, after a rollback) stays in the status."""
    cp, ns = control_plane, kube_namespace
    pipeline = _pipeline("beta")
    pipeline["apiVersion"] = "exactlyonce.io/v1beta1"
    _apply(cp, ns, pipeline)
    wait_for(lambda: get(cp, "statefulset", "beta-driver", ns), "the driver's StatefulSet")
    conditions = wait_for(
        lambda: (get(cp, "eop", "beta", ns) or {}).get("status", {}).get("conditions"),
        "the operator's conditions",
    )
    # A newer operator wrote a condition of a type this one does not know.
    foreign = {"type": "Autoscaled", "status": "True", "reason": "Scaled", "message": "by v2"}
    cp.kubectl(
        "patch",
        "eop",
        "beta",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"conditions": [*conditions, foreign]}}),
        check=True,
    )
    pipeline["spec"]["suspend"] = True  # this operator writes its conditions again
    _apply(cp, ns, pipeline)
    status = wait_for(
        lambda: (
            (s := (get(cp, "eop", "beta", ns) or {}).get("status", {})).get("phase") == "Suspended"
            and s
        ),
        "phase Suspended",
    )
    kinds = {c["type"]: c for c in status["conditions"]}
    assert kinds["Ready"]["reason"] == "Suspended", kinds["Ready"]
    assert kinds.get("Autoscaled", {}).get("message") == "by v2", "the foreign condition is gone"
    assert not [e for e in _events(cp, ns, "beta") if e["reason"] == "InvalidSpec"]


@contextlib.contextmanager
def _newer_crd(cp: ControlPlane) -> Iterator[None]:
    """The CRD as a newer chart leaves it after ``helm rollback`` (Helm never rolls back what
    it installs from ``crds/``): a spec field and a status field this operator does not know.
    The CRD as installed is put back afterwards."""
    name = "crd/exactlyoncepipelines.exactlyonce.io"
    installed = json.loads(cp.kubectl("get", name, "-o", "json", check=True).stdout)
    newer = json.loads(json.dumps(installed))
    for version in newer["spec"]["versions"]:
        properties = version["schema"]["openAPIV3Schema"]["properties"]
        properties["spec"]["properties"]["autoscaling"] = {
            "type": "object",
            "properties": {"maxExecutors": {"type": "integer"}},
        }
        properties["status"]["properties"]["autoscaledAt"] = {"type": "string"}
    cp.kubectl("replace", "-f", "-", input=json.dumps(newer), check=True)
    try:
        yield
    finally:
        current = json.loads(cp.kubectl("get", name, "-o", "json", check=True).stdout)
        current["spec"] = installed["spec"]
        cp.kubectl("replace", "-f", "-", input=json.dumps(current), check=True)


def test_after_a_rollback_the_operator_runs_what_a_newer_one_accepted_and_keeps_its_fields(
    control_plane: ControlPlane, operator: Path, kube_namespace: str
) -> None:
    """An operator rolled back under a newer CRD runs a pipeline written with a field only the
    newer version knows: it ignores the field and says so (``UnknownFields``), never refuses
    the pipeline, and never drops what the newer operator wrote in the status."""
    cp, ns = control_plane, kube_namespace
    pipeline = _pipeline("newer", autoscaling={"maxExecutors": 4})
    with _newer_crd(cp):
        # Strict field validation refuses the field until the newer schema is served.
        path = f"/apis/exactlyonce.io/v1alpha1/namespaces/{ns}/exactlyoncepipelines"
        wait_for(lambda: cp.dry_run_create(path, pipeline)[0] == 201, "the newer schema served")
        _apply(cp, ns, pipeline)
        wait_for(lambda: get(cp, "statefulset", "newer-driver", ns), "the driver's StatefulSet")
        ignored = wait_for(
            lambda: [e for e in _events(cp, ns, "newer") if e["reason"] == "UnknownFields"],
            "the UnknownFields event",
        )
        assert "spec.autoscaling" in ignored[0]["message"], ignored
        assert not [e for e in _events(cp, ns, "newer") if e["reason"] == "InvalidSpec"]
        # What the newer operator recorded stays through this one's status writes.
        cp.kubectl(
            "patch", "eop", "newer", "-n", ns, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"autoscaledAt": "2026-01-01T00:00:00Z"}}),
            check=True,
        )  # fmt: skip
        _apply(cp, ns, {**pipeline, "spec": {**pipeline["spec"], "suspend": True}})
        status = wait_for(
            lambda: (
                (s := (get(cp, "eop", "newer", ns) or {}).get("status", {})).get("phase")
                == "Suspended"
                and s
            ),
            "phase Suspended",
        )
        assert status.get("autoscaledAt") == "2026-01-01T00:00:00Z", status
        stored = get(cp, "eop", "newer", ns) or {}
        assert stored["spec"].get("autoscaling") == {"maxExecutors": 4}
        cp.kubectl("delete", "eop", "newer", "-n", ns, "--wait=true", "--timeout=30s", check=True)
