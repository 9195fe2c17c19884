"""Rendering: the objects a pipeline becomes, as `eop render` shows and the operator applies."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
import yaml

from eop_operator.api.load import InvalidPipeline, load_pipeline
from eop_operator.render import MissingImage, render_pipeline
from eop_operator.render.executors import EXECUTOR_TEMPLATE_KEY
from eop_operator.render.naming import SPEC_HASH_ANNOTATION
from eop_operator.render.pod_policy import PodPolicy, PodPolicyRefused, check_pod_policy
from eop_operator.render.ports import (
    HostPortRange,
    HostPortsExhausted,
    assign_metrics_host_port,
    choose_host_port,
    metrics_host_port_of,
    preferred_host_port,
)
from eop_operator.render.rbac import DRIVER_RULES, DriverRole
from eop_operator.render.storage import render_checkpoint_deletion_job


def _objects(manifest: dict[str, Any], **kwargs: Any) -> dict[str, dict[str, Any]]:
    rendered = render_pipeline(
        load_pipeline(manifest), default_image=kwargs.pop("image", "eop-spark:1"), generation=0
    )
    return {obj["kind"]: obj for obj in rendered.objects}


def _hash(manifest: dict[str, Any]) -> str:
    return render_pipeline(
        load_pipeline(manifest), default_image="eop-spark:1", generation=0
    ).spec_hash


def test_the_partitions_g_held_reach_the_runner_without_restarting_the_driver(
    manifest: dict[str, Any],
) -> None:
    before = _hash(manifest)
    manifest["status"] = {"progress": {"heldPartitions": {"in": [0, 2]}}}
    run = json.loads(_objects(manifest)["ConfigMap"]["data"]["run.json"])
    assert run["committedPartitions"] == {"in": [0, 2]}  # a new generation's guard reads it
    assert "generationReason" not in run  # no upgrade in flight
    # An upgrade in flight to this generation: its reason reaches the runner, the hash stays.
    manifest["status"]["upgrade"] = {
        "toHash": before,
        "mode": "committed-offsets",
        "step": "Stopping",
        "generation": 0,
        "reason": "FellBack",
    }
    run = json.loads(_objects(manifest)["ConfigMap"]["data"]["run.json"])
    assert run["generationReason"] == "FellBack"
    assert _hash(manifest) == before  # the status grew: the running driver is not rolled


def test_children_are_owned_and_labelled(manifest: dict[str, Any]) -> None:
    objects = _objects(manifest)
    assert set(objects) == {"ConfigMap", "PersistentVolumeClaim", "Service", "StatefulSet"}
    for obj in objects.values():
        owner = obj["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "ExactlyOncePipeline" and owner["uid"] == "uid-1"
        assert obj["metadata"]["labels"]["exactlyonce.io/pipeline"] == "clean"
        assert obj["metadata"]["namespace"] == "ads"


def test_driver_runs_one_non_root_pod_with_config_and_checkpoint(manifest: dict[str, Any]) -> None:
    sts = _objects(manifest)["StatefulSet"]
    assert sts["spec"]["replicas"] == 1
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"][:3] == ["run", "--config", "/etc/eop/run.json"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # Spark writes relative scratch dirs: the working directory is a writable emptyDir.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == mounts["/tmp"])
    assert container["workingDir"] == "/tmp"
    # What a killed driver left there is removed by the next one: a directory of its own.
    assert _env(container, "EOP_SCRATCH_DIR")["value"].startswith("/tmp/")
    assert pod["automountServiceAccountToken"] is False
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == ["clean-checkpoint"]
    # one 10 s trigger + 60 s transaction timeout + slack
    assert pod["terminationGracePeriodSeconds"] == 100


def test_config_map_holds_the_resolved_run_config(manifest: dict[str, Any]) -> None:
    run = json.loads(_objects(manifest)["ConfigMap"]["data"]["run.json"])
    assert run["pipeline"] == "ads.clean"
    assert run["transactionalIdPrefix"] == "eop.ads.clean"
    assert run["progressGroup"] == "eop.ads.clean"
    assert run["checkpointRoot"] == "/var/lib/eop/checkpoint"


def test_secrets_are_mounted_by_reference_never_copied(manifest: dict[str, Any]) -> None:
    manifest["spec"]["sink"]["kafka"]["secretRef"] = {"name": "sink-sasl"}
    objects = _objects(manifest)
    pod = objects["StatefulSet"]["spec"]["template"]["spec"]
    secrets = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
    assert secrets == ["sink-sasl"]
    run = json.loads(objects["ConfigMap"]["data"]["run.json"])
    assert run["sinkSecretDir"] == "/etc/eop/secrets/sink"
    assert "sourceSecretDir" not in run


def test_suspend_scales_the_driver_to_zero(manifest: dict[str, Any]) -> None:
    manifest["spec"]["suspend"] = True
    assert _objects(manifest)["StatefulSet"]["spec"]["replicas"] == 0


def test_query_change_and_restart_nonce_change_the_pod_template(manifest: dict[str, Any]) -> None:
    before = _hash(manifest)
    manifest["spec"]["transform"]["sql"] = "SELECT value FROM source"
    after_query = _hash(manifest)
    manifest["spec"]["restartNonce"] = "1"
    after_nonce = _hash(manifest)
    assert len({before, after_query, after_nonce}) == 3
    sts = _objects(manifest)["StatefulSet"]
    assert sts["spec"]["template"]["metadata"]["annotations"][SPEC_HASH_ANNOTATION] == after_nonce


def test_a_new_driver_pod_is_always_made_from_the_newest_template(
    manifest: dict[str, Any],
) -> None:
    """The upgrade scales to zero, then applies the new template: the next pod must be new.

    With no ``rollingUpdate`` the API server leaves it unset and the StatefulSet
    controller makes pods below ``status.currentReplicas`` from the *old*
    revision; that count lags a scale to zero, and a Pending pod of the old
    spec then blocks the rollout (seen in CI).  A partition of 0 means every
    pod is made from the update revision.
    """
    strategy = _objects(manifest)["StatefulSet"]["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}


def test_suspend_does_not_change_the_pod_template(manifest: dict[str, Any]) -> None:
    before = _hash(manifest)
    manifest["spec"]["suspend"] = True
    assert _hash(manifest) == before


def test_kubernetes_executors_get_their_own_least_privilege_rbac(manifest: dict[str, Any]) -> None:
    manifest["spec"]["spark"] = {"master": "k8s://https://kubernetes.default.svc"}
    objects = _objects(manifest)
    # The driver's account is bound to the pre-made drivers' role; the operator makes no Role.
    assert {"ServiceAccount", "RoleBinding"} <= set(objects) and "Role" not in objects
    binding = objects["RoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "eop-driver",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "clean-driver", "namespace": "ads"}
    ]
    assert all("secrets" not in r["resources"] and "*" not in r["verbs"] for r in DRIVER_RULES)
    pod = objects["StatefulSet"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "clean-driver"
    assert pod["automountServiceAccountToken"] is True
    run = json.loads(objects["ConfigMap"]["data"]["run.json"])
    assert run["spark"]["conf"]["spark.kubernetes.namespace"] == "ads"


def test_drivers_are_bound_to_the_operators_driver_role(manifest: dict[str, Any]) -> None:
    manifest["spec"]["spark"] = {"master": "k8s://https://kubernetes.default.svc"}
    pipeline = load_pipeline(manifest)
    role = DriverRole.parse("ClusterRole/team-eop-driver")
    objects = render_pipeline(pipeline, default_image="i:1", generation=0, driver_role=role).objects
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding"]
    assert binding["metadata"]["namespace"] == "ads"  # granted in the pipeline's namespace only
    assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) == (role.kind, role.name)
    # A binding's roleRef is immutable: another role gets another binding, never a failed apply.
    (default,) = [o for o in render_pipeline(pipeline, default_image="i:1", generation=0).objects
                  if o["kind"] == "RoleBinding"]  # fmt: skip
    assert default["metadata"]["name"] != binding["metadata"]["name"]


def test_a_pipeline_with_its_own_service_account_gets_no_binding(manifest: dict[str, Any]) -> None:
    manifest["spec"]["spark"] = {"master": "k8s://https://kubernetes.default.svc"}
    manifest["spec"]["serviceAccountName"] = "spark-runner"
    objects = _objects(manifest)
    assert not {"ServiceAccount", "RoleBinding", "Role"} & set(objects)
    assert (
        objects["StatefulSet"]["spec"]["template"]["spec"]["serviceAccountName"] == "spark-runner"
    )


@pytest.mark.parametrize("text", ["eop-driver", "Role/", "ClusterRoleBinding/x", "role/x"])
def test_driver_role_option_names_kind_and_name(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="Role/NAME or ClusterRole/NAME"):
        DriverRole.parse(text)


OBJECT_STORE = {
    "uri": "s3a://bucket/eop",
    "secretRef": {"name": "s3-credentials"},
    "options": {"fs.s3a.endpoint": "http://seaweedfs:8333", "fs.s3a.path.style.access": "true"},
}


def test_a_checkpoint_in_object_storage_gets_its_credentials_only_from_the_secret(
    manifest: dict[str, Any],
) -> None:
    manifest["spec"]["checkpoint"] = OBJECT_STORE
    objects = _objects(manifest)
    assert "PersistentVolumeClaim" not in objects
    pod, container = _driver(objects)
    assert not any("persistentVolumeClaim" in v for v in pod["volumes"])
    run_json = objects["ConfigMap"]["data"]["run.json"]
    run = json.loads(run_json)
    assert run["checkpointRoot"] == "s3a://bucket/eop/ads/clean"
    # The store's settings reach Hadoop; its credentials never enter the ConfigMap.
    assert run["spark"]["conf"]["spark.hadoop.fs.s3a.endpoint"] == "http://seaweedfs:8333"
    assert not [k for k in run["spark"]["conf"] if "key" in k or "token" in k]
    assert "AWS_" not in run_json and "s3-credentials" not in run_json
    # The kubelet sets them from the Secret: references, no values.
    for key, extra in [
        ("AWS_ACCESS_KEY_ID", {}),
        ("AWS_SECRET_ACCESS_KEY", {}),
        ("AWS_SESSION_TOKEN", {"optional": True}),
    ]:
        ref = _env(container, key)["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "s3-credentials", "key": key, **extra}
    assert all("value" not in e for e in container["env"] if e["name"].startswith("AWS_"))


def test_executors_get_the_object_store_credentials_by_reference(manifest: dict[str, Any]) -> None:
    manifest["spec"]["checkpoint"] = OBJECT_STORE
    manifest["spec"]["spark"] = {"master": "k8s://https://kubernetes.default.svc"}
    data = _objects(manifest)["ConfigMap"]["data"]
    template = yaml.safe_load(data[EXECUTOR_TEMPLATE_KEY])
    (container,) = template["spec"]["containers"]
    for key, extra in [
        ("AWS_ACCESS_KEY_ID", {}),
        ("AWS_SECRET_ACCESS_KEY", {}),
        ("AWS_SESSION_TOKEN", {"optional": True}),
    ]:
        ref = _env(container, key)["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "s3-credentials", "key": key, **extra}
    assert "AWS_" not in data["run.json"]


def test_the_checkpoint_deletion_job_runs_like_the_driver_with_the_same_secret(
    manifest: dict[str, Any],
) -> None:
    manifest["spec"]["checkpoint"] = {**OBJECT_STORE, "retention": "Delete"}
    manifest["spec"]["driver"] = {"hostNetwork": True, "nodeSelector": {"disk": "ssd"}}
    manifest["metadata"]["uid"] = "u-1"
    pipeline = load_pipeline(manifest)
    job = render_checkpoint_deletion_job(pipeline, "eop-spark:1", "s3a://bucket/eop/ads/clean")
    assert job["metadata"]["name"] == "clean-checkpoint-delete"
    assert job["metadata"]["ownerReferences"][0]["uid"] == "u-1"  # it goes with the pipeline
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == [
        "checkpoint",
        "delete",
        "s3a://bucket/eop/ads/clean",
        "--option=fs.s3a.endpoint=http://seaweedfs:8333",
        "--option=fs.s3a.path.style.access=true",
    ]
    driver_pod, driver = _driver(_objects(manifest))
    secret_env = [e for e in driver["env"] if e["name"].startswith("AWS_")]
    assert [e for e in container["env"] if e["name"].startswith("AWS_")] == secret_env
    assert container["securityContext"] == driver["securityContext"]
    assert pod["securityContext"] == driver_pod["securityContext"]
    assert (pod["hostNetwork"], pod["nodeSelector"]) == (True, {"disk": "ssd"})
    assert pod["automountServiceAccountToken"] is False
    assert pod["restartPolicy"] == "Never"


def test_missing_image_is_a_clear_error(manifest: dict[str, Any]) -> None:
    with pytest.raises(MissingImage, match=r"spec\.image"):
        _objects(manifest, image=None)


# ----------------------------------------------------------------------------- ports


def _driver(objects: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = objects["StatefulSet"]["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def _env(container: dict[str, Any], name: str) -> dict[str, Any]:
    return next(e for e in container["env"] if e["name"] == name)


def test_pod_network_drivers_keep_the_conventional_ports(manifest: dict[str, Any]) -> None:
    manifest["spec"]["spark"] = {"master": "k8s://https://kubernetes.default.svc"}
    objects = _objects(manifest)
    _, container = _driver(objects)
    declared = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert declared == {"metrics": 9090, "driver-rpc": 7078, "blockmanager": 7079}  # no Spark UI
    assert not any("hostPort" in p for p in container["ports"])
    assert {p["name"]: p["port"] for p in objects["Service"]["spec"]["ports"]} == declared
    run = json.loads(objects["ConfigMap"]["data"]["run.json"])
    assert run["metricsPort"] == 9090
    assert run["spark"]["conf"]["spark.driver.port"] == "7078"
    assert "spark.ui.port" not in run["spark"]["conf"]
    # Scrapable from outside the pod.
    assert _env(container, "EOP_METRICS_HOST")["value"] == "0.0.0.0"


def test_host_network_driver_declares_only_its_own_metrics_host_port(
    manifest: dict[str, Any],
) -> None:
    manifest["spec"]["driver"] = {"hostNetwork": True}
    manifest["spec"]["spark"] = {"master": "k8s://https://kubernetes.default.svc"}
    objects = _objects(manifest)
    pod, container = _driver(objects)
    run = json.loads(objects["ConfigMap"]["data"]["run.json"])
    port = run["metricsPort"]
    assert port in HostPortRange()
    # The only declared (and so reserved) port on the node is the metrics one.
    assert container["ports"] == [{"name": "metrics", "containerPort": port, "hostPort": port}]
    assert objects["Service"]["spec"]["ports"] == [
        {"name": "metrics", "port": port, "targetPort": "metrics"}
    ]
    # Spark binds free ports for everything else; executors learn the actual ones.
    conf = run["spark"]["conf"]
    assert (conf["spark.ui.port"], conf["spark.driver.port"]) == ("0", "0")
    assert conf["spark.driver.blockManager.port"] == "0"
    # Metrics listen on the node's address, not on every interface of the node.
    assert _env(container, "EOP_METRICS_HOST")["valueFrom"]["fieldRef"]["fieldPath"] == (
        "status.podIP"
    )
    assert metrics_host_port_of(pod) == port


def test_two_host_network_pipelines_get_different_metrics_ports(manifest: dict[str, Any]) -> None:
    manifest["spec"]["driver"] = {"hostNetwork": True}
    other = json.loads(json.dumps(manifest))
    other["metadata"]["name"] = "count"

    def port_of(m: dict[str, Any], **kwargs: Any) -> int:
        rendered = render_pipeline(
            load_pipeline(m), default_image="eop-spark:1", generation=0, **kwargs
        )
        return int(rendered.run_config.metrics_port or 0)

    first = port_of(manifest)
    assert port_of(manifest) == first  # deterministic
    # Even when both names would hash to the same port, the operator's choice differs.
    ports = HostPortRange(19000, 19001)
    held = {"ads.clean": [assign_metrics_host_port("ads.clean", ports, {})]}
    count_port = assign_metrics_host_port("ads.count", ports, held)
    assert count_port != held["ads.clean"][0]
    assert port_of(other, metrics_host_port=count_port) == count_port


def test_a_driver_keeps_its_host_port_unless_another_pipeline_holds_it() -> None:
    ports = HostPortRange(19000, 19009)
    preferred = preferred_host_port("ns.a", ports)
    assert choose_host_port("ns.a", ports) == preferred
    assert choose_host_port("ns.a", ports, current=19005) == 19005
    # Taken by another pipeline: the next free one, wrapping around the range.
    assert choose_host_port("ns.a", ports, taken={preferred}) == (
        ports.first + (preferred - ports.first + 1) % len(ports)
    )
    assert choose_host_port("ns.a", ports, taken={19005}, current=19005) != 19005
    # Out of range after the operator's range changed: re-chosen inside it.
    assert choose_host_port("ns.a", ports, current=20000) in ports
    held = {"ns.a": [19003], "ns.b": [19004]}
    assert assign_metrics_host_port("ns.a", ports, held) == 19003
    with pytest.raises(HostPortsExhausted, match="--host-ports"):
        choose_host_port("ns.c", HostPortRange(19000, 19001), taken={19000, 19001})


def test_host_port_range_parses_first_dash_last() -> None:
    assert HostPortRange.parse("20000-20099") == HostPortRange(20000, 20099)
    assert len(HostPortRange.parse("20000-20099")) == 100
    for bad in ("20000", "b-c", "20099-20000", "0-10"):
        with pytest.raises(ValueError, match="range"):
            HostPortRange.parse(bad)


# ----------------------------------------------------------------------------- resources


def test_driver_cpu_request_defaults_to_spark_cores(manifest: dict[str, Any]) -> None:
    manifest["spec"]["spark"] = {"driver": {"cores": 2, "memory": "1g"}}
    _, container = _driver(_objects(manifest))
    assert container["resources"]["requests"] == {"cpu": "2", "memory": "1408Mi"}
    assert container["resources"]["limits"] == {"memory": "1408Mi"}


def test_driver_cpu_request_may_be_a_fraction_of_a_core(manifest: dict[str, Any]) -> None:
    manifest["spec"]["driver"] = {
        "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "2"}}
    }
    _, container = _driver(_objects(manifest))
    assert container["resources"]["requests"]["cpu"] == "500m"
    assert container["resources"]["limits"]["cpu"] == "2"
    run = json.loads(_objects(manifest)["ConfigMap"]["data"]["run.json"])
    assert run["spark"]["driver"]["cores"] == 1  # Spark's own setting is untouched


@pytest.mark.parametrize("cpu", ["half", "0.5m", "-1", ""])
def test_invalid_driver_cpu_names_the_field(manifest: dict[str, Any], cpu: str) -> None:
    manifest["spec"]["driver"] = {"resources": {"requests": {"cpu": cpu}}}
    with pytest.raises(InvalidPipeline, match=r"driver\.resources\.requests\.cpu"):
        load_pipeline(manifest)


# --- the operator's pod policy -------------------------------------------------------------------


HOST_PATH = {"name": "logs", "hostPath": {"path": "/var/log"}}


def test_node_access_is_refused_by_default_naming_each_field(manifest: dict[str, Any]) -> None:
    manifest["spec"]["driver"] = {
        "hostNetwork": True,
        "volumes": [{"name": "scratch", "emptyDir": {}}, HOST_PATH],
    }
    with pytest.raises(PodPolicyRefused) as refused:
        check_pod_policy(load_pipeline(manifest), PodPolicy())
    message = str(refused.value)
    assert message.count("\n") == 0
    assert "spec.driver.hostNetwork:" in message and "--allow-host-network" in message
    assert "spec.driver.volumes[1].hostPath:" in message and "volumes[0]" not in message
    # The spec handler and the lifecycle treat it as an invalid spec: Degraded, no driver.
    assert isinstance(refused.value, InvalidPipeline)


def test_node_access_is_run_when_allowed(manifest: dict[str, Any]) -> None:
    manifest["spec"]["driver"] = {"hostNetwork": True, "volumes": [HOST_PATH]}
    pipeline = load_pipeline(manifest)
    check_pod_policy(pipeline, PodPolicy(allow_host_network=True, allow_host_path_volumes=True))
    with pytest.raises(PodPolicyRefused, match=r"^spec\.driver\.volumes\[0\]\.hostPath"):
        check_pod_policy(pipeline, PodPolicy(allow_host_network=True))
    with pytest.raises(PodPolicyRefused, match=r"^spec\.driver\.hostNetwork"):
        check_pod_policy(pipeline, PodPolicy(allow_host_path_volumes=True))


def test_another_service_account_is_refused_unless_allowed(manifest: dict[str, Any]) -> None:
    """The operator's own account (or any other) is not a pipeline's to run as by default."""
    manifest["spec"]["spark"] = {
        "master": "k8s://https://kubernetes.default.svc",
        "conf": {"spark.kubernetes.authenticate.executor.serviceAccountName": "eop"},
    }
    manifest["spec"]["serviceAccountName"] = "eop"
    pipeline = load_pipeline(manifest)
    with pytest.raises(PodPolicyRefused) as refused:
        check_pod_policy(pipeline, PodPolicy())
    message = str(refused.value)
    assert message.startswith("spec.serviceAccountName: ") and "'eop'" in message
    assert "spec.spark.conf[spark.kubernetes.authenticate.executor.serviceAccountName]" in message
    assert "--allow-service-account eop" in message
    check_pod_policy(pipeline, PodPolicy(service_accounts=frozenset({"eop"})))
    with pytest.raises(PodPolicyRefused, match=r"^spec\.serviceAccountName: .*'eop'"):
        check_pod_policy(pipeline, PodPolicy(service_accounts=frozenset({"s3-reader"})))


def test_ordinary_pipelines_pass_the_pod_policy(manifest: dict[str, Any]) -> None:
    manifest["spec"]["driver"] = {"volumes": [{"name": "scratch", "emptyDir": {}}]}
    check_pod_policy(load_pipeline(manifest), PodPolicy())
