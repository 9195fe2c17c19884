"""The API server itself rejects bad manifests, naming the field, before the operator sees them."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.kube import ControlPlane
from eop_operator.api.models import LABEL_VALUE_PATTERN

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "exactlyoncepipelines.exactlyonce.io.yaml"

pytestmark = pytest.mark.kube

VALID: dict[str, Any] = {
    "apiVersion": "exactlyonce.io/v1alpha1",
    "kind": "ExactlyOncePipeline",
    "metadata": {"name": "p"},
    "spec": {
        "source": {"kafka": {"bootstrapServers": "127.0.0.1:9092", "topics": ["raw"]}},
        "transform": {"sql": "SELECT value FROM source"},
        "sink": {"kafka": {"bootstrapServers": "127.0.0.1:9092", "topic": "clean"}},
    },
}


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(obj: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node = obj
        for key in parents:
            node = node.setdefault(key, {})
        if value is _DELETE:
            del node[leaf]
        else:
            node[leaf] = value

    return mutate


_DELETE = object()

#: (case id, mutation, text the rejection must contain: the field and the reason)
MALFORMED = [
    ("no-sink", _set("spec.sink", _DELETE), "spec.sink: Required value"),
    (
        "sql-and-python",
        _set("spec.transform.python", {"module": "m", "function": "f"}),
        "exactly one of sql or python must be set",
    ),
    (
        "no-topics",
        _set("spec.source.kafka.topics", _DELETE),
        "exactly one of topics or topicPattern must be set",
    ),
    (
        "commit-mode",
        _set("spec.sink.kafka.commitMode", "fast"),
        'spec.sink.kafka.commitMode: Unsupported value: "fast"',
    ),
    (
        "timeout-format",
        _set("spec.sink.kafka.transactionTimeout", "1 minute"),
        "spec.sink.kafka.transactionTimeout: Invalid value",
    ),
    (
        "max-offsets",
        _set("spec.source.kafka.maxOffsetsPerTrigger", 0),
        "spec.source.kafka.maxOffsetsPerTrigger: Invalid value",
    ),
    (
        "starting-offsets",
        _set("spec.source.kafka.startingOffsets", "yesterday"),
        "startingOffsets must be earliest, latest or a JSON object",
    ),
    (
        "trigger-both",
        _set("spec.trigger", {"processingTime": "5s", "availableNow": True}),
        "spec.trigger: Invalid value",
    ),
    (
        "volume-and-uri",
        _set("spec.checkpoint", {"uri": "s3a://b/p", "volume": {"size": "1Gi"}}),
        "set at most one of volume or uri",
    ),
    (
        "uri-of-another-connector",
        _set("spec.checkpoint", {"uri": "gs://bucket/p"}),
        "checkpoint.uri must be s3a://<bucket>/<prefix>",
    ),
    (
        "store-options-without-uri",
        _set("spec.checkpoint", {"options": {"fs.s3a.endpoint": "http://s3:8333"}}),
        "checkpoint.secretRef and checkpoint.options are for a checkpoint in object storage",
    ),
    ("master", _set("spec.spark.master", "yarn"), "spec.spark.master: Invalid value"),
    (
        "driver-cores",
        _set("spec.spark.driver", {"cores": 0}),
        "spec.spark.driver.cores: Invalid value",
    ),
    (
        "pull-policy",
        _set("spec.imagePullPolicy", "Sometimes"),
        'spec.imagePullPolicy: Unsupported value: "Sometimes"',
    ),
    (
        "volume-size",
        _set("spec.checkpoint", {"volume": {"size": "lots"}}),
        "spec.checkpoint.volume.size: Invalid value",
    ),
    ("unknown-field", _set("spec.surprise", 1), 'unknown field "spec.surprise"'),
    ("long-name", _set("metadata.name", "n" * 43), "metadata.name must be at most 42 characters"),
    (
        "retention",
        _set("spec.checkpoint", {"retention": "Forever"}),
        'spec.checkpoint.retention: Unsupported value: "Forever"',
    ),
]


_LIMIT = "spec.driver.resources.limits.cpu: Invalid value"
_STALL = "spec.health.stallTimeout: Invalid value"
_PATTERN = "spec.source.kafka.topicPattern: Invalid value"
_K8S = "k8s://https://kubernetes.default.svc"

#: Mistakes a user makes that the API server refuses since the models carry the rules that
#: used to fail only in the driver (issue 28 item 3, issue 27 item 6): (case id, mutation,
#: fragments the rejection must contain: the field and the reason).
REFUSED_AT_THE_DOOR: list[tuple[str, Callable[[dict[str, Any]], None], tuple[str, ...]]] = [
    (
        "starting-offset-not-a-number",
        _set("spec.source.kafka.startingOffsets", '{"raw": {"0": "abc"}}'),
        ("spec.source.kafka.startingOffsets: Invalid value", "offsets are numbers"),
    ),
    (
        "name-with-a-dot",
        _set("metadata.name", "orders.v2"),
        ("metadata.name must be a DNS-1035 label",),
    ),
    (
        "bootstrap-without-port",
        _set("spec.source.kafka.bootstrapServers", "kafka"),
        ("spec.source.kafka.bootstrapServers: Invalid value", "host:port"),
    ),
    (
        "bootstrap-port-out-of-range",
        _set("spec.sink.kafka.bootstrapServers", "k0:9092,k1:70000"),
        ("spec.sink.kafka.bootstrapServers: Invalid value", "ports 1-65535"),
    ),
    (
        "cpu-limit-below-request",
        _set("spec.driver.resources", {"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}),
        (_LIMIT, "at least the driver's CPU request"),
    ),
    (
        "cpu-limit-below-driver-cores",
        lambda obj: (
            _set("spec.spark.driver", {"cores": 2})(obj),
            _set("spec.driver.resources", {"limits": {"cpu": "1"}})(obj),
        ),
        (_LIMIT, "spark.driver.cores"),
    ),
    (
        "executor-cpu-limit-below-cores",
        lambda obj: (
            _set("spec.spark", {"master": _K8S, "executor": {"cores": 2}})(obj),
            _set("spec.executor", {"resources": {"limits": {"cpu": "1"}}})(obj),
        ),
        ("spec.executor.resources.limits.cpu: Invalid value", "spark.executor.cores"),
    ),
    (
        "executors-in-local-mode",
        _set("spec.spark", {"master": "local[2]", "executor": {"instances": 3}}),
        ("spec.spark.executor.instances: Invalid value", "applies to a k8s:// master only"),
    ),
    (
        "rpc-authentication-off",
        _set("spec.spark", {"master": _K8S, "conf": {"spark.authenticate": "false"}}),
        ("spec.spark.conf: Invalid value", "spark.authenticate is set by eop"),
    ),
    (
        "rpc-encryption-off",
        _set("spec.spark", {"master": _K8S, "conf": {"spark.network.crypto.enabled": "false"}}),
        ("spec.spark.conf: Invalid value", "spark.network.crypto.enabled is set by eop"),
    ),
    (
        "rpc-key-in-the-spec",
        _set("spec.spark", {"master": _K8S, "conf": {"spark.authenticate.secret": "s3cret"}}),
        ("spec.spark.conf: Invalid value", "spark.authenticate.secret is set by eop"),
    ),
    (
        "check-interval-zero",
        _set("spec.health", {"checkInterval": "0s"}),
        ("spec.health.checkInterval: Invalid value", "health.checkInterval must be at least 1s"),
    ),
    (
        "stall-timeout-within-check-interval",
        _set("spec.health", {"checkInterval": "1m", "stallTimeout": "30s"}),
        (_STALL, "longer than health.checkInterval"),
    ),
    (
        "stall-timeout-within-trigger-interval",
        lambda obj: (
            _set("spec.trigger", {"processingTime": "10m"})(obj),
            _set("spec.health", {"stallTimeout": "5m"})(obj),
        ),
        (_STALL, "longer than trigger.processingTime"),
    ),
    (
        "duration-out-of-range",
        _set("spec.upgrade", {"readinessTimeout": "99999999h"}),
        ("spec.upgrade.readinessTimeout: Too long",),
    ),
    (
        "topic-pattern-lookbehind",
        lambda obj: (
            _set("spec.source.kafka.topics", _DELETE)(obj),
            _set("spec.source.kafka.topicPattern", "(?<!test-)events.*")(obj),
        ),
        (_PATTERN, "Java and Python read differently"),
    ),
    (
        "topic-pattern-java-named-group",
        lambda obj: (
            _set("spec.source.kafka.topics", _DELETE)(obj),
            _set("spec.source.kafka.topicPattern", r"(?<region>eu|us)-\p{Alpha}+")(obj),
        ),
        (_PATTERN, "named or atomic groups"),
    ),
    (
        "credential-in-source-options",
        _set("spec.source.kafka.options", {"sasl.jaas.config": "PlainLoginModule required"}),
        ("spec.source.kafka.options", "options.sasl.jaas.config is a credential", "secretRef"),
    ),
    (
        "credential-in-sink-options-any-case",
        _set("spec.sink.kafka.options", {"SSL.Key.Password": "hunter2"}),
        ("spec.sink.kafka.options", "options.SSL.Key.Password is a credential", "secretRef"),
    ),
    (
        "credential-in-checkpoint-options",
        _set(
            "spec.checkpoint",
            {"uri": "s3a://bucket/eop", "options": {"fs.s3a.bucket.bucket.Secret.Key": "x"}},
        ),
        (
            "spec.checkpoint.options",
            "checkpoint.options.fs.s3a.bucket.bucket.Secret.Key is a credential",
            "checkpoint.secretRef",
        ),
    ),
    (
        "spark-setting-in-checkpoint-options",
        _set("spec.checkpoint", {"uri": "s3a://bucket/eop", "options": {"spark.jars": "x"}}),
        ("spec.checkpoint.options", "fs.s3a.*", "spark.conf"),
    ),
    (
        "checkpoint-uri-s3-scheme",
        _set("spec.checkpoint", {"uri": "s3://bucket/eop"}),
        ("spec.checkpoint.uri: Invalid value", "s3a://<bucket>/<prefix>", "not served"),
    ),
    (
        "sink-topic-is-a-source-topic",
        _set("spec.sink.kafka.topic", "raw"),
        ("spec.sink.kafka.topic: Invalid value", "read its own output"),
    ),
    (
        "topic-name-with-space",
        _set("spec.source.kafka.topics", ["raw events"]),
        ("spec.source.kafka.topics[0]: Invalid value",),
    ),
    (
        "empty-topic-list",
        _set("spec.source.kafka.topics", []),
        ("spec.source.kafka.topics: Invalid value",),
    ),
    (
        "transaction-timeout-zero",
        _set("spec.sink.kafka.transactionTimeout", "0s"),
        ("spec.sink.kafka.transactionTimeout: Invalid value", "at least 1s"),
    ),
    (
        "backoff-above-max-backoff",
        _set("spec.failover", {"backoff": "10m", "maxBackoff": "5m"}),
        ("spec.failover.backoff: Invalid value", "must not exceed failover.maxBackoff"),
    ),
    (
        "id-prefix-characters",
        _set("spec.transactions", {"idPrefix": "team a/clean"}),
        ("spec.transactions.idPrefix: Invalid value",),
    ),
    (
        "service-account-name",
        _set("spec.serviceAccountName", "Driver_SA"),
        ("spec.serviceAccountName: Invalid value",),
    ),
    ("zero-local-threads", _set("spec.spark.master", "local[0]"), ("spec.spark.master",)),
    # A driver mounts what its namespace holds, never a storage server or a cloud disk directly.
    *(
        (
            f"driver-volume-{kind}",
            _set(
                "spec.driver.volumes",
                [{"name": "v", kind: source}, {"name": "tmp", "emptyDir": {}}],
            ),
            ("spec.driver.volumes[0]: Invalid value", "storage servers and cloud disks"),
        )
        for kind, source in (
            ("nfs", {"server": "10.0.0.1", "path": "/"}),
            ("iscsi", {"targetPortal": "10.0.0.1:3260", "iqn": "iqn.x", "lun": 0}),
            ("rbd", {"monitors": ["10.0.0.1"], "image": "i"}),
            ("cephfs", {"monitors": ["10.0.0.1"]}),
            ("awsElasticBlockStore", {"volumeID": "vol-1"}),
        )
    ),
    (
        "driver-volume-token",
        _set(
            "spec.driver.volumes",
            [
                {
                    "name": "token",
                    "projected": {
                        "sources": [
                            {"configMap": {"name": "ca"}},
                            {"serviceAccountToken": {"path": "token"}},
                        ]
                    },
                }
            ],
        ),
        ("spec.driver.volumes[0]: Invalid value", "may not hold a serviceAccountToken"),
    ),
]


def _conf(key: str, master: str = "local[2]") -> Callable[[dict[str, Any]], None]:
    return _set("spec.spark", {"master": master, "conf": {key: "x"}})


def _options(side: str, key: str, value: str = "x") -> Callable[[dict[str, Any]], None]:
    return _set(f"spec.{side}.kafka.options", {"linger.ms": "5", key: value})


def _driver(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return _set(f"spec.driver.{field}", value)


def _pattern(regex: str) -> Callable[[dict[str, Any]], None]:
    def mutate(obj: dict[str, Any]) -> None:
        _set("spec.source.kafka.topics", _DELETE)(obj)
        _set("spec.source.kafka.topicPattern", regex)(obj)

    return mutate


_OWNED = " is set by eop and cannot be overridden"

#: Settings eop owns, and mistakes whose pod, claim or query would be refused later: (case id,
#: mutation, the field the refusal names, the reason both the API server and eop run give).
OWNED_AND_REFUSED_LATER: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    ("conf-master", _conf("spark.master"), "spec.spark.conf", f"spark.master{_OWNED}"),
    ("conf-driver-memory", _conf("spark.driver.memory"), "spec.spark.conf", "spark.driver.memory"),
    (
        "conf-executor-instances",
        _conf("spark.executor.instances", _K8S),
        "spec.spark.conf",
        f"spark.executor.instances{_OWNED}",
    ),
    (
        "conf-host-path-volume",
        _conf("spark.kubernetes.executor.volumes.hostPath.root.mount.path", _K8S),
        "spec.spark.conf",
        f"spark.kubernetes.executor.volumes.hostPath.root.mount.path{_OWNED}",
    ),
    (
        "conf-pod-template",
        _conf("spark.kubernetes.executor.podTemplateFile", _K8S),
        "spec.spark.conf",
        f"spark.kubernetes.executor.podTemplateFile{_OWNED}",
    ),
    (
        "conf-credential",
        _conf("spark.hadoop.fs.s3a.secret.key"),
        "spec.spark.conf",
        "spark.hadoop.fs.s3a.secret.key is a credential (Spark redacts it)",
    ),
    (
        "conf-driver-api-token",
        _conf("spark.kubernetes.authenticate.oauthTokenFile", _K8S),
        "spec.spark.conf",
        f"spark.kubernetes.authenticate.oauthTokenFile{_OWNED}",
    ),
    (
        "conf-container-image",
        _conf("spark.kubernetes.container.image", _K8S),
        "spec.spark.conf",
        f"spark.kubernetes.container.image{_OWNED}",
    ),
    (
        "conf-shuffle-encryption-off",
        _conf("spark.io.encryption.enabled", _K8S),
        "spec.spark.conf",
        f"spark.io.encryption.enabled{_OWNED}",
    ),
    ("conf-tls", _conf("spark.ssl.enabled"), "spec.spark.conf", f"spark.ssl.enabled{_OWNED}"),
    (
        "conf-ui-kill",
        _conf("spark.ui.killEnabled"),
        "spec.spark.conf",
        f"spark.ui.killEnabled{_OWNED}",
    ),
    (
        "conf-driver-bind-address",
        _conf("spark.driver.bindAddress"),
        "spec.spark.conf",
        f"spark.driver.bindAddress{_OWNED}",
    ),
    (
        "conf-checkpoint-location",
        _conf("spark.sql.streaming.checkpointLocation"),
        "spec.spark.conf",
        f"spark.sql.streaming.checkpointLocation{_OWNED}",
    ),
    (
        "sink-transactional-id",
        _options("sink", "transactional.id"),
        "spec.sink.kafka.options",
        f"options: transactional.id{_OWNED}",
    ),
    (
        "sink-prefixed-idempotence",
        _options("sink", "kafka.enable.idempotence", "false"),
        "spec.sink.kafka.options",
        f"options: kafka.enable.idempotence{_OWNED}",
    ),
    ("sink-acks", _options("sink", "acks", "1"), "spec.sink.kafka.options", f"acks{_OWNED}"),
    (
        "sink-transaction-timeout-ms",
        _options("sink", "transaction.timeout.ms", "900000"),
        "spec.sink.kafka.options",
        "set transactionTimeout for transaction.timeout.ms",
    ),
    (
        "sink-bootstrap-servers",
        _options("sink", "bootstrap.servers", "other:9092"),
        "spec.sink.kafka.options",
        f"options: bootstrap.servers{_OWNED}",
    ),
    (
        "source-read-uncommitted",
        _options("source", "isolation.level", "read_uncommitted"),
        "spec.source.kafka.options",
        f"options: isolation.level{_OWNED}",
    ),
    (
        "source-prefixed-group-id",
        _options("source", "kafka.group.id", "mine"),
        "spec.source.kafka.options",
        f"options: kafka.group.id{_OWNED}",
    ),
    (
        "source-auto-offset-reset",
        _options("source", "auto.offset.reset", "latest"),
        "spec.source.kafka.options",
        f"options: auto.offset.reset{_OWNED}",
    ),
    (
        "source-auto-commit-any-case",
        _options("source", "Enable.Auto.Commit", "true"),
        "spec.source.kafka.options",
        f"options: Enable.Auto.Commit{_OWNED}",
    ),
    (
        "volume-size-zero",
        _set("spec.checkpoint", {"volume": {"size": "0Gi"}}),
        "spec.checkpoint.volume.size",
        "checkpoint.volume.size must be more than 0",
    ),
    (
        "once-pod-with-other-access-modes",
        _set("spec.checkpoint", {"volume": {"accessModes": ["ReadWriteOncePod", "ReadWriteOnce"]}}),
        "spec.checkpoint.volume.accessModes",
        "ReadWriteOncePod cannot be combined with other access modes",
    ),
    (
        "topic-listed-twice",
        _set("spec.source.kafka.topics", ["raw", "raw.b", "raw"]),
        "spec.source.kafka.topics[2]",
        "Duplicate value",
    ),
    (
        "trigger-interval-zero",
        _set("spec.trigger", {"processingTime": "0ms"}),
        "spec.trigger.processingTime",
        "trigger.processingTime must be at least 1ms",
    ),
    (
        "readiness-timeout-zero-with-rollback",
        _set("spec.upgrade", {"readinessTimeout": "0s", "rollback": True}),
        "spec.upgrade.readinessTimeout",
        "readinessTimeout must be more than 0s with upgrade.rollback",
    ),
    (
        "topic-pattern-brace-without-lower-bound",
        _pattern("events-[0-9]{,2}"),
        "spec.source.kafka.topicPattern",
        "a brace that is no {n,m} quantifier",
    ),
    (
        "topic-pattern-stray-brace",
        _pattern("events{eu}"),
        "spec.source.kafka.topicPattern",
        "a brace that is no {n,m} quantifier",
    ),
    (
        "spark-memory-in-kubernetes-units",
        _set("spec.spark.driver", {"memory": "512Mi"}),
        "spec.spark.driver.memory",
        "^[0-9]+[kmgt]$",
    ),
    (
        "executor-memory-overhead-not-in-spark-notation",
        _set("spec.spark", {"master": _K8S, "conf": {"spark.executor.memoryOverhead": "512 mb"}}),
        "spec.spark.conf",
        "spark.executor.memoryOverhead sizes the executor pods",
    ),
    (
        "spark-memory-below-sparks-minimum",
        _set("spec.spark", {"master": _K8S, "executor": {"memory": "256m"}}),
        "spec.spark.executor.memory",
        "Spark memory must be at least 512m",
    ),
    (
        "complete-output-with-partitioned-commits",
        lambda obj: (
            _set("spec.transform.outputMode", "complete")(obj),
            _set("spec.sink.kafka.commitMode", "partitioned")(obj),
        ),
        "spec.sink.kafka.commitMode",
        "partitioned cannot write a complete-mode query",
    ),
    (
        "label-value-with-space",
        _driver("labels", {"team": "ads core"}),
        "spec.driver.labels.team",
        f"'{LABEL_VALUE_PATTERN}'",
    ),
    (
        "label-key-with-two-slashes",
        _driver("labels", {"example.com/team/x": "ads"}),
        "spec.driver.labels",
        "driver.labels: example.com/team/x is not a valid label key",
    ),
    (
        "annotation-key-with-space",
        _driver("annotations", {"owner note": "ads"}),
        "spec.driver.annotations",
        "driver.annotations: owner note is not a valid annotation key",
    ),
    (
        "node-selector-key-with-space",
        _driver("nodeSelector", {"disk type": "ssd"}),
        "spec.driver.nodeSelector",
        "driver.nodeSelector: disk type is not a valid label key",
    ),
    (
        "toleration-exists-with-value",
        _driver("tolerations", [{"key": "gpu", "operator": "Exists", "value": "yes"}]),
        "spec.driver.tolerations[0]",
        "a toleration has operator Exists or Equal",
    ),
    (
        "toleration-seconds-without-no-execute",
        _driver(
            "tolerations",
            [{"key": "gpu", "value": "a", "effect": "NoSchedule", "tolerationSeconds": 60}],
        ),
        "spec.driver.tolerations[0]",
        "tolerationSeconds only with NoExecute",
    ),
    (
        "env-name-with-equals",
        _driver("env", [{"name": "JAVA_OPTS=-Xss4m", "value": "1"}]),
        "spec.driver.env[0]",
        "an env var needs a name of printable ASCII characters other than '='",
    ),
    (
        "env-value-and-value-from",
        _driver(
            "env",
            [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        ),
        "spec.driver.env[0]",
        "either value or valueFrom",
    ),
    (
        "image-repository-in-capitals",
        _set("spec.image", "ghcr.io/Acme/EOP-spark:1.0"),
        "spec.image",
        "image must be an image reference",
    ),
    (
        "image-with-space",
        _set("spec.image", "ghcr.io/acme/eop-spark: 1.0"),
        "spec.image",
        "image must be an image reference",
    ),
]


def near_misses() -> dict[str, Any]:
    """A pipeline close to the rules on owned settings and on what pods and claims take,
    valid all the same."""
    tuned = copy.deepcopy(VALID)
    tuned["metadata"]["name"] = "tuned"
    spec = tuned["spec"]
    spec["image"] = "registry.local:5000/team-a/eop-spark:1.0_rc.2@sha256:" + "0a" * 32
    del spec["source"]["kafka"]["topics"]
    spec["source"]["kafka"]["topicPattern"] = r"(events|clicks)-[a-z]{2}-v[0-9]{1,3}\.x{2,}"
    # The pattern is found in the sink topic but matches no whole name: not read back.
    spec["sink"]["kafka"]["topic"] = "events-eu-v1.xx-out"
    spec["source"]["kafka"]["options"] = {"fetch.min.bytes": "1", "kafka.client.id": "a"}
    spec["sink"]["kafka"]["options"] = {"linger.ms": "5", "compression.type": "lz4"}
    spec["trigger"] = {"processingTime": "500ms"}
    spec["upgrade"] = {"readinessTimeout": "0s"}
    spec["checkpoint"] = {"volume": {"size": "0.5Gi", "accessModes": ["ReadWriteOncePod"]}}
    spec["spark"] = {
        "conf": {
            "spark.sql.streaming.stateStore.providerClass": "x.Rocks",
            # The executors' ServiceAccount stays the spec's (web identity in object storage).
            "spark.kubernetes.authenticate.executor.serviceAccountName": "s3-reader",
        }
    }
    spec["driver"] = {
        "labels": {"app.kubernetes.io/part-of": "ads", "tier": ""},
        "annotations": {"example.com/owner": "team a, on call"},
        "nodeSelector": {"kubernetes.io/arch": "amd64"},
        "tolerations": [
            {"operator": "Exists"},
            {
                "key": "node.kubernetes.io/unreachable",
                "effect": "NoExecute",
                "tolerationSeconds": 30,
            },
        ],
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "spark.local.dir", "value": "/tmp"},
        ],
        # Every volume type of a restricted pod.
        "volumes": [
            {"name": "a", "configMap": {"name": "ca"}},
            {"name": "b", "secret": {"secretName": "tls"}},
            {"name": "c", "emptyDir": {}},
            {"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
            {
                "name": "e",
                "projected": {"sources": [{"configMap": {"name": "ca"}}, {"downwardAPI": {}}]},
            },
            {"name": "f", "downwardAPI": {"items": []}},
            {"name": "g", "csi": {"driver": "secrets-store.csi.k8s.io"}},
            {"name": "h", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
        ],
    }
    return tuned


@pytest.fixture(scope="module")
def crd_installed(control_plane: ControlPlane) -> ControlPlane:
    control_plane.install_crd(CRD)
    return control_plane


def _apply(cp: ControlPlane, namespace: str, obj: dict[str, Any]) -> tuple[int, str]:
    result = cp.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))
    return result.returncode, result.stdout + result.stderr


@pytest.fixture(scope="module")
def refusals_namespace(crd_installed: ControlPlane) -> Iterator[str]:
    """One namespace for the tables of refused manifests: none of them is stored."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    crd_installed.kubectl("create", "namespace", name, check=True)
    yield name
    crd_installed.kubectl("delete", "namespace", name, "--wait=false")


def _refused(cp: ControlPlane, namespace: str, obj: dict[str, Any]) -> str:
    """What the API server says when ``obj`` is applied (as ``kubectl apply`` sends it, but
    in a dry run and without a kubectl process per manifest); fails if it was accepted."""
    group, version = obj["apiVersion"].split("/")
    path = f"/apis/{group}/{version}/namespaces/{namespace}/exactlyoncepipelines"
    code, message = cp.dry_run_create(path, {**obj, "metadata": {**obj["metadata"]}})
    assert code >= 400, f"accepted ({code})"
    return message


def test_kubectl_apply_shows_the_refusal_naming_the_field(
    crd_installed: ControlPlane, refusals_namespace: str
) -> None:
    """What a user sees: kubectl apply fails, and says what the API server said."""
    obj = copy.deepcopy(VALID)
    _set("spec.serviceAccountName", "Driver_SA")(obj)
    code, output = _apply(crd_installed, refusals_namespace, obj)
    assert code != 0
    assert "spec.serviceAccountName: Invalid value" in output
    # kubectl words the object's name its own way, then prints the API server's causes.
    causes = _refused(crd_installed, refusals_namespace, obj).split(" is invalid: ", 1)[1]
    assert causes in output


def test_valid_manifest_is_accepted_with_defaults(
    crd_installed: ControlPlane, kube_namespace: str
) -> None:
    code, output = _apply(crd_installed, kube_namespace, VALID)
    assert code == 0, output
    stored = yaml.safe_load(
        crd_installed.kubectl(
            "get", "eop", "p", "-n", kube_namespace, "-o", "yaml", check=True
        ).stdout
    )
    assert stored["spec"]["sink"]["kafka"]["commitMode"] == "auto"
    assert stored["spec"]["source"]["kafka"]["startingOffsets"] == "earliest"


@pytest.mark.parametrize(("case", "mutate", "expected"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_manifest_is_rejected_naming_the_field(
    crd_installed: ControlPlane,
    refusals_namespace: str,
    case: str,
    mutate: Callable[[dict[str, Any]], None],
    expected: str,
) -> None:
    obj = copy.deepcopy(VALID)
    mutate(obj)
    output = _refused(crd_installed, refusals_namespace, obj)
    assert expected in output


@pytest.mark.parametrize(
    ("case", "mutate", "expected"), REFUSED_AT_THE_DOOR, ids=[m[0] for m in REFUSED_AT_THE_DOOR]
)
def test_what_the_driver_could_not_run_is_refused_by_kubectl_apply(
    crd_installed: ControlPlane,
    refusals_namespace: str,
    case: str,
    mutate: Callable[[dict[str, Any]], None],
    expected: tuple[str, ...],
) -> None:
    obj = copy.deepcopy(VALID)
    mutate(obj)
    output = _refused(crd_installed, refusals_namespace, obj)
    for fragment in expected:
        assert fragment in output


@pytest.mark.parametrize(
    ("case", "mutate", "field", "reason"),
    OWNED_AND_REFUSED_LATER,
    ids=[m[0] for m in OWNED_AND_REFUSED_LATER],
)
def test_settings_eop_owns_and_what_kubernetes_or_spark_would_refuse_later_are_refused(
    crd_installed: ControlPlane,
    refusals_namespace: str,
    case: str,
    mutate: Callable[[dict[str, Any]], None],
    field: str,
    reason: str,
) -> None:
    obj = copy.deepcopy(VALID)
    mutate(obj)
    output = _refused(crd_installed, refusals_namespace, obj)
    assert f"{field}: " in output, output
    assert reason in output, output


def test_what_users_write_in_examples_stays_accepted(
    crd_installed: ControlPlane, kube_namespace: str
) -> None:
    obj = copy.deepcopy(VALID)
    kafka = obj["spec"]["source"]["kafka"]
    kafka["bootstrapServers"] = " kafka-0.kafka:9092, 10.0.0.7:19092,[::1]:9093"
    kafka["startingOffsets"] = '{"raw": {"0": 42, "1": -2}, "raw.b": {"0": -1}}'
    kafka["options"] = {"fetch.min.bytes": "1", "sasl.mechanism": "PLAIN"}
    obj["spec"]["sink"]["kafka"]["topic"] = "raw"  # another cluster: same name is fine
    obj["spec"]["sink"]["kafka"]["bootstrapServers"] = "central:9092"
    obj["spec"]["driver"] = {"resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "0.5"}}}
    obj["spec"]["health"] = {"checkInterval": "1s", "stallTimeout": "11s"}
    obj["spec"]["checkpoint"] = {
        "uri": "s3a://eop-checkpoints/team-a",
        "secretRef": {"name": "s3-credentials"},
        "options": {
            "fs.s3a.endpoint": "https://storage.googleapis.com",
            "fs.s3a.bucket.eop-checkpoints.endpoint.region": "auto",
            "fs.s3a.path.style.access": "true",
        },
        "retention": "Delete",
    }
    code, output = _apply(crd_installed, kube_namespace, obj)
    assert code == 0, output
    # Executors on Kubernetes, their CPU, and RPC settings that keep it secure.
    obj["metadata"]["name"] = "wide"
    obj["spec"]["spark"] = {
        "master": _K8S,
        "driver": {"memory": "512m"},
        "executor": {"instances": 4, "cores": 2, "memory": "2g"},
        "conf": {
            "spark.executor.memoryOverhead": "1gb",  # Spark's notation, either unit form
            "spark.sql.shuffle.partitions": "16",
            "spark.kubernetes.authenticate.executor.serviceAccountName": "s3-reader",
        },
    }
    obj["spec"]["executor"] = {"resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "2"}}}
    code, output = _apply(crd_installed, kube_namespace, obj)
    assert code == 0, output
    code, output = _apply(crd_installed, kube_namespace, near_misses())
    assert code == 0, output


def test_transactional_id_prefix_is_immutable(
    crd_installed: ControlPlane, kube_namespace: str
) -> None:
    obj = copy.deepcopy(VALID)
    obj["spec"]["transactions"] = {"idPrefix": "team-a.clean"}
    assert _apply(crd_installed, kube_namespace, obj)[0] == 0
    obj["spec"]["transactions"] = {"idPrefix": "team-b.clean"}
    code, output = _apply(crd_installed, kube_namespace, obj)
    assert code != 0
    assert "spec.transactions.idPrefix: Invalid value" in output
    assert "transactions.idPrefix is immutable once set" in output
    del obj["spec"]["transactions"]
    code, output = _apply(crd_installed, kube_namespace, obj)
    assert code != 0 and "immutable" in output


def _read(cp: ControlPlane, namespace: str, version: str, name: str = "") -> dict[str, Any]:
    """A pipeline (or, without ``name``, the list) as ``version`` of the API serves it."""
    resource = f"exactlyoncepipelines.{version}.exactlyonce.io"
    args = ("get", resource, *([name] if name else []), "-n", namespace, "-o", "json")
    return dict(json.loads(cp.kubectl(*args, check=True).stdout))


def test_an_object_reads_the_same_in_every_served_version_and_migrates_in_place(
    crd_installed: ControlPlane, kube_namespace: str
) -> None:
    cp, ns = crd_installed, kube_namespace
    status = {"phase": "Pending", "observedGeneration": 1, "message": "written as v1beta1"}
    for created_as, read_as in (("v1alpha1", "v1beta1"), ("v1beta1", "v1alpha1")):
        obj = copy.deepcopy(VALID)
        obj["apiVersion"] = f"exactlyonce.io/{created_as}"
        obj["metadata"] = {"name": f"as-{created_as}"}
        cp.kubectl("create", "-n", ns, "-f", "-", input=yaml.safe_dump(obj), check=True)
        # The status written through the other version, as an operator of that version would.
        cp.kubectl(
            "patch",
            f"exactlyoncepipelines.{read_as}.exactlyonce.io",
            f"as-{created_as}",
            "-n",
            ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": status}),
            check=True,
        )
        written = _read(cp, ns, created_as, f"as-{created_as}")
        read = _read(cp, ns, read_as, f"as-{created_as}")
        assert read["apiVersion"] == f"exactlyonce.io/{read_as}"
        assert (
            read["spec"] == written["spec"]
            and read["spec"]["transform"]["sql"] == VALID["spec"]["transform"]["sql"]
        )
        assert (
            read["status"] == written["status"] and read["status"]["message"] == status["message"]
        )
    # kubectl's short name serves the preferred version.
    listed = json.loads(cp.kubectl("get", "eop", "-n", ns, "-o", "json", check=True).stdout)
    assert {i["apiVersion"] for i in listed["items"]} == {"exactlyonce.io/v1beta1"}
    assert len(listed["items"]) == 2
    # The storage migration of docs/api.md: every object written again, unchanged.
    before = _read(cp, ns, "v1alpha1")["items"]
    replaced = cp.kubectl("replace", "-f", "-", input=json.dumps(listed))
    assert replaced.returncode == 0, replaced.stderr
    after = _read(cp, ns, "v1alpha1")["items"]
    assert [i["spec"] for i in after] == [i["spec"] for i in before]
    assert [i["metadata"]["generation"] for i in after] == [1, 1], "the migration changed a spec"
    crd = json.loads(
        cp.kubectl("get", "crd", "exactlyoncepipelines.exactlyonce.io", "-o", "json").stdout
    )
    assert crd["status"]["storedVersions"] == ["v1alpha1"]
