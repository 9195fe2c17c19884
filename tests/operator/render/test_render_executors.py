"""Executors as pods: the template the driver makes them from, and the RPC they talk over."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest
import yaml

from eop_operator.api.load import InvalidPipeline, load_pipeline
from eop_operator.render import render_pipeline, rpc_secret
from eop_operator.render.executors import EXECUTOR_TEMPLATE_KEY, RPC_KEY_BYTES
from eop_operator.render.naming import executor_selector
from eop_spark.contract.owned_settings import SPARK_CONF

MASTER = "k8s://https://kubernetes.default.svc"
#: A key as the operator would draw it (random); recognisable in any text it leaked into.
KEY = bytes(range(0x41, 0x41 + RPC_KEY_BYTES))


def _objects(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    rendered = render_pipeline(load_pipeline(manifest), default_image="eop-spark:1", generation=0)
    return {obj["kind"]: obj for obj in rendered.objects}


def _on_kubernetes(manifest: dict[str, Any], **spark: Any) -> dict[str, Any]:
    manifest["spec"]["spark"] = {"master": MASTER, **spark}
    return manifest


def _template(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    template: dict[str, Any] = yaml.safe_load(objects["ConfigMap"]["data"][EXECUTOR_TEMPLATE_KEY])
    return template


def _conf(objects: dict[str, dict[str, Any]]) -> dict[str, str]:
    conf: dict[str, str] = json.loads(objects["ConfigMap"]["data"]["run.json"])["spark"]["conf"]
    return conf


def _driver(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = objects["StatefulSet"]["spec"]["template"]["spec"]
    return pod


def test_executors_are_hardened_like_the_driver(manifest: dict[str, Any]) -> None:
    objects = _objects(_on_kubernetes(manifest))
    template, driver = _template(objects)["spec"], _driver(objects)
    assert template["securityContext"] == driver["securityContext"]
    assert template["securityContext"]["runAsNonRoot"] is True
    assert template["securityContext"]["runAsUser"] == 1000
    assert template["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = template["containers"]
    assert container["securityContext"] == driver["containers"][0]["securityContext"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # A writable /tmp on the read-only root (Spark fetches the jars into the working dir).
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {}} in template["volumes"]
    assert container["workingDir"] == "/tmp"
    # Executors never talk to the API server: no token (the driver needs one, they do not).
    assert template["automountServiceAccountToken"] is False
    assert driver["automountServiceAccountToken"] is True
    assert container["image"] == "eop-spark:1"
    # The driver finds the template where the ConfigMap is mounted.
    conf = _conf(objects)
    assert conf["spark.kubernetes.executor.podTemplateFile"] == f"/etc/eop/{EXECUTOR_TEMPLATE_KEY}"
    assert conf["spark.kubernetes.executor.podTemplateContainerName"] == container["name"]


def test_executor_resources_follow_the_spec(manifest: dict[str, Any]) -> None:
    _on_kubernetes(manifest, executor={"instances": 3, "cores": 2, "memory": "2g"})
    manifest["spec"]["executor"] = {
        "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "3"}}
    }
    objects = _objects(manifest)
    (container,) = _template(objects)["spec"]["containers"]
    # The heap plus Spark's overhead (a tenth, at least 384 MiB), as request and limit.
    assert container["resources"] == {
        "requests": {"cpu": "500m", "memory": f"{2048 + 384}Mi"},
        "limits": {"cpu": "3", "memory": f"{2048 + 384}Mi"},
    }
    conf = _conf(objects)
    # Spark sets the same on the pods it makes.
    assert conf["spark.executor.memory"] == "2g"
    assert conf["spark.executor.memoryOverhead"] == "384m"
    assert conf["spark.kubernetes.executor.request.cores"] == "500m"
    assert conf["spark.kubernetes.executor.limit.cores"] == "3"
    assert conf["spark.executor.instances"] == "3"
    assert conf["spark.executor.cores"] == "2"


def test_a_given_memory_overhead_is_what_executors_get(manifest: dict[str, Any]) -> None:
    """Whatever notation Spark takes the overhead in sizes the pod; one it does not is refused
    by the spec, naming the field, before anything is rendered."""
    _on_kubernetes(
        manifest,
        executor={"memory": "8g"},
        conf={"spark.executor.memoryOverhead": "2g"},
    )
    objects = _objects(manifest)
    (container,) = _template(objects)["spec"]["containers"]
    assert container["resources"]["limits"]["memory"] == f"{8192 + 2048}Mi"
    assert _conf(objects)["spark.executor.memoryOverhead"] == "2g"
    # In any of Spark's notations (Spark reads "1536mb" as "1536m").
    for overhead in ("1536mb", "1536M", "1536"):
        manifest["spec"]["spark"]["conf"]["spark.executor.memoryOverhead"] = overhead
        (container,) = _template(_objects(manifest))["spec"]["containers"]
        assert container["resources"]["limits"]["memory"] == f"{8192 + 1536}Mi", overhead
    # Without it, a tenth of a large heap.
    del manifest["spec"]["spark"]["conf"]
    (container,) = _template(_objects(manifest))["spec"]["containers"]
    assert container["resources"]["limits"]["memory"] == f"{8192 + 819}Mi"


def test_executor_cpu_limit_below_its_request_is_refused(manifest: dict[str, Any]) -> None:
    _on_kubernetes(manifest, executor={"cores": 2})
    manifest["spec"]["executor"] = {"resources": {"limits": {"cpu": "1"}}}
    with pytest.raises(InvalidPipeline, match=r"executor\.resources\.limits\.cpu must be at least"):
        load_pipeline(manifest)


def test_rpc_is_authenticated_and_encrypted_with_a_mounted_key(manifest: dict[str, Any]) -> None:
    objects = _objects(_on_kubernetes(manifest))
    conf = _conf(objects)
    assert conf["spark.authenticate"] == "true"
    assert conf["spark.network.crypto.enabled"] == "true"
    assert conf["spark.network.crypto.cipher"] == "AES/GCM/NoPadding"  # tampering detected
    assert conf["spark.network.crypto.authEngineVersion"] == "2"
    assert conf["spark.network.crypto.saslFallback"] == "false"
    key_file = conf["spark.authenticate.secret.file"]
    mount_path, _, key = key_file.rpartition("/")
    # Driver and every executor mount the pipeline's key Secret, read-only, at that one path.
    for pod in (_driver(objects), _template(objects)["spec"]):
        (volume,) = [
            v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == "clean-spark-rpc"
        ]
        assert volume["secret"]["defaultMode"] == 0o400
        (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
        assert (mount["mountPath"], mount["readOnly"]) == (mount_path, True)
    secret = rpc_secret(load_pipeline(manifest), KEY)
    assert base64.b64decode(secret["data"][key]) == KEY
    assert secret["type"] == "Opaque" and secret["immutable"] is True
    assert secret["metadata"]["name"] == "clean-spark-rpc"
    (owner,) = secret["metadata"]["ownerReferences"]  # it goes with the pipeline
    assert (owner["kind"], owner["name"], owner["uid"]) == ("ExactlyOncePipeline", "clean", "uid-1")


def test_no_secret_value_is_rendered_into_config_or_pods(manifest: dict[str, Any]) -> None:
    manifest["spec"]["source"]["kafka"]["secretRef"] = {"name": "kafka-user"}
    manifest["spec"]["sink"]["kafka"]["secretRef"] = {"name": "kafka-user"}
    objects = _objects(_on_kubernetes(manifest))
    text = json.dumps(objects)
    for form in (KEY.decode(), base64.b64encode(KEY).decode()):
        assert form not in text
    assert 'spark.authenticate.secret"' not in text  # only the key's file is named
    # Executors get the Kafka Secrets as the driver has them (a trust store named by path
    # must exist where the source and the sink's tasks run), by reference only.
    template = _template(objects)["spec"]
    mounts = {m["mountPath"]: m for m in template["containers"][0]["volumeMounts"]}
    driver_mounts = {m["mountPath"]: m for m in _driver(objects)["containers"][0]["volumeMounts"]}
    for side in ("source", "sink"):
        path = f"/etc/eop/secrets/{side}"
        assert mounts[path] == driver_mounts[path]
        assert mounts[path]["readOnly"] is True
    assert {v["secret"]["secretName"] for v in template["volumes"] if "secret" in v} == {
        "kafka-user",
        "clean-spark-rpc",
    }


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("spark.authenticate", "false"),
        ("spark.network.crypto.enabled", "false"),
        ("spark.network.crypto.saslFallback", "true"),
        ("spark.io.encryption.enabled", "false"),
        ("spark.authenticate.secret", "s3cret"),
    ],
)
@pytest.mark.parametrize("master", ["k8s://https://kubernetes.default.svc", "local[2]"])
def test_the_spec_cannot_turn_rpc_security_off_or_hold_the_key(
    manifest: dict[str, Any], key: str, value: str, master: str
) -> None:
    spec = _on_kubernetes(manifest, conf={key: value})
    spec["spec"]["spark"]["master"] = master
    with pytest.raises(InvalidPipeline, match=rf"spark\.conf: {re.escape(key)} is set by eop"):
        load_pipeline(spec)


def test_executors_spread_over_nodes_and_away_from_the_driver(manifest: dict[str, Any]) -> None:
    objects = _objects(_on_kubernetes(manifest))
    template = _template(objects)
    terms = template["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    by_selector = {
        json.dumps(t["podAffinityTerm"]["labelSelector"]["matchLabels"], sort_keys=True): t
        for t in terms
    }
    own = json.dumps(template["metadata"]["labels"], sort_keys=True)
    driver = json.dumps(objects["StatefulSet"]["spec"]["selector"]["matchLabels"], sort_keys=True)
    assert set(by_selector) == {own, driver}
    assert all(t["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname" for t in terms)
    assert by_selector[own]["weight"] > by_selector[driver]["weight"]


def test_executors_are_never_taken_for_the_driver(manifest: dict[str, Any]) -> None:
    objects = _objects(_on_kubernetes(manifest))
    labels = _template(objects)["metadata"]["labels"]
    # Neither the StatefulSet nor the Service (nor the operator, which lists pods by the
    # same labels) selects an executor.
    for selector in (
        objects["StatefulSet"]["spec"]["selector"]["matchLabels"],
        objects["Service"]["spec"]["selector"],
    ):
        assert not selector.items() <= labels.items()
    assert labels["exactlyonce.io/pipeline"] == "clean"
    assert labels["app.kubernetes.io/component"] == "executor"
    assert executor_selector(load_pipeline(manifest)) == ",".join(
        f"{k}={v}" for k, v in labels.items()
    )


def test_executors_share_the_node_network_only_with_a_host_network_driver(
    manifest: dict[str, Any],
) -> None:
    template = _template(_objects(_on_kubernetes(manifest)))["spec"]
    assert "hostNetwork" not in template
    manifest["spec"]["driver"] = {"hostNetwork": True}
    objects = _objects(manifest)
    template = _template(objects)["spec"]
    assert template["hostNetwork"] is True
    assert template["dnsPolicy"] == "ClusterFirstWithHostNet"
    # Every port on the node's network is a host port: Spark picks free ones (two executors
    # on one node, each with a fixed block manager port, could not both be scheduled).
    conf = _conf(objects)
    assert conf["spark.blockManager.port"] == conf["spark.driver.port"] == "0"


def test_executors_reach_the_driver_at_its_pod_ip(manifest: dict[str, Any]) -> None:
    objects = _objects(_on_kubernetes(manifest))
    # Spark binds to SPARK_LOCAL_IP and tells its peers SPARK_LOCAL_HOSTNAME: the pod's IP,
    # no cluster DNS needed (a reverse lookup of the IP would give a name only DNS resolves).
    for pod in (_driver(objects), _template(objects)["spec"]):
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        for name in ("SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME"):
            assert env[name]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    conf = _conf(objects)
    assert "spark.driver.host" not in conf
    # Spark makes the driver pod the executors' owner: they go with it.
    assert conf["spark.kubernetes.driver.pod.name"] == "clean-driver-0"


def test_local_pipelines_get_none_of_it(manifest: dict[str, Any]) -> None:
    rendered = render_pipeline(load_pipeline(manifest), default_image="eop-spark:1", generation=0)
    assert not rendered.needs_rpc_secret
    text = json.dumps(rendered.objects)
    assert EXECUTOR_TEMPLATE_KEY not in text and "spark-rpc" not in text
    assert "spark.authenticate" not in text and "SPARK_LOCAL_IP" not in text
    _on_kubernetes(manifest)
    assert render_pipeline(
        load_pipeline(manifest), default_image="i:1", generation=0
    ).needs_rpc_secret


def test_changing_the_executor_count_restarts_the_driver(manifest: dict[str, Any]) -> None:
    """A new count is a new spec hash: the upgrade rules apply (docs/lifecycle.md)."""

    def spec_hash(instances: int) -> str:
        _on_kubernetes(manifest, executor={"instances": instances})
        pipeline = load_pipeline(manifest)
        return render_pipeline(pipeline, default_image="i:1", generation=0).spec_hash

    assert spec_hash(2) != spec_hash(3)
    template = _objects(manifest)["StatefulSet"]["spec"]["template"]
    assert template["metadata"]["annotations"]["exactlyonce.io/executors"] == "3"


def test_executor_count_needs_a_kubernetes_master(manifest: dict[str, Any]) -> None:
    manifest["spec"]["spark"] = {"master": "local[2]", "executor": {"instances": 3}}
    with pytest.raises(InvalidPipeline, match=r"spec\.spark.*instances applies to a k8s://"):
        load_pipeline(manifest)


def test_every_spark_setting_eop_renders_is_one_the_spec_cannot_override(
    manifest: dict[str, Any],
) -> None:
    # A rendered setting outside the owned list would lose to the spec's spark.conf.
    manifest["spec"]["driver"] = {"hostNetwork": True}
    manifest["spec"]["executor"] = {"resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}}}
    rendered = _conf(_objects(_on_kubernetes(manifest)))
    derived_from_the_spec = {"spark.executor.memoryOverhead"}  # the spec's own, or Spark's default
    assert {key for key in rendered if not SPARK_CONF.owns(key)} == derived_from_the_spec


def test_a_memory_overhead_spark_cannot_read_is_refused_naming_the_field(
    manifest: dict[str, Any],
) -> None:
    _on_kubernetes(manifest, conf={"spark.executor.memoryOverhead": "512 mb"})
    with pytest.raises(InvalidPipeline) as refused:
        load_pipeline(manifest)
    assert "spark.executor.memoryOverhead sizes the executor pods" in str(refused.value)
    assert "spec.spark.conf" in str(refused.value)
