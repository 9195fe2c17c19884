"""The ExactlyOncePipeline API (every served version has this one schema): the CRD's source.

The data-plane parts (source, transform, sink, trigger, spark) come from
``eop_spark.contract.spec``; this module adds what only the operator needs.  The CRD in
``crds/`` is generated from these models (``eop crd``) and never edited.

Longer than the operator's other modules on purpose: every field carries its API
documentation (the CRD's descriptions and docs/api.md are generated from it), and
spec and status stay together so the schema reads top-down as ``kubectl explain``
shows it.  Typed writes of the status are in ``api.status_patch``.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

from eop_operator import API_VERSION, KIND
from eop_spark.contract.spec import (
    CEL_RULES_KEY,
    DEFAULT_TRIGGER_INTERVAL,
    CommitMode,
    Duration,
    OutputMode,
    Rule,
    SinkSpec,
    SourceSpec,
    SparkSpec,
    SpecModel,
    TransformSpec,
    TriggerSpec,
    at_least,
    matches,
    refuse_credentials,
    refuse_keys,
)

#: A DNS-1035 label: the pipeline's name becomes the name of its Service (no dots, lowercase).
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
#: A DNS-1123 subdomain, as Kubernetes object names such as ServiceAccounts must be.
SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: Kubernetes resource quantities such as 10Gi, 500Mi.
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"
#: Children get suffixes such as ``-driver-0`` and a controller-revision-hash label, so
#: the pipeline name must leave room within the 63-character label-value limit.
MAX_NAME_LENGTH = 42

#: Free-form Kubernetes objects (tolerations, env, volumes) kept as the API server sees them.
KubeObject = dict[str, Any]


class PullPolicy(StrEnum):
    """Container image pull policy."""

    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class AccessMode(StrEnum):
    """PersistentVolumeClaim access modes."""

    READ_WRITE_ONCE = "ReadWriteOnce"
    READ_WRITE_ONCE_POD = "ReadWriteOncePod"
    READ_WRITE_MANY = "ReadWriteMany"


class Retention(StrEnum):
    """What happens to the checkpoint when the pipeline is deleted."""

    RETAIN = "Retain"
    DELETE = "Delete"


#: A quantity of nothing: 0, 0.0, 0Gi...
_ZERO_QUANTITY = r"^0+(\.0+)?([KMGTP]i|[kMGTP])?$"
_VOLUME_SIZE = Rule(
    f"!self.matches(r'{_ZERO_QUANTITY}')",
    lambda v: re.search(_ZERO_QUANTITY, v) is None,
    "checkpoint.volume.size must be more than 0: the checkpoint needs room",
)
_ONCE_POD = AccessMode.READ_WRITE_ONCE_POD.value
_CLAIM_ACCESS_MODES = Rule(
    f"!('{_ONCE_POD}' in self) || size(self) == 1",
    lambda v: _ONCE_POD not in v or len(v) == 1,
    f"checkpoint.volume.accessModes: {_ONCE_POD} cannot be combined with other access modes "
    "(the API server refuses such a claim)",
)


class CheckpointVolume(SpecModel):
    """A PersistentVolumeClaim created for the checkpoint."""

    size: Annotated[str, _VOLUME_SIZE] = Field(
        default="1Gi",
        max_length=64,
        pattern=QUANTITY_PATTERN,
        description="Requested storage, more than 0.",
    )
    storage_class_name: str | None = Field(
        default=None, description="StorageClass; the cluster default when unset."
    )
    access_modes: Annotated[list[AccessMode], _CLAIM_ACCESS_MODES] = Field(
        default_factory=lambda: [AccessMode.READ_WRITE_ONCE],
        min_length=1,
        max_length=3,
        description="Access modes of the claim; ReadWriteOncePod only alone.",
    )


#: The checkpoint URIs the Spark image serves: Hadoop's S3A connector, ``s3a://bucket[/prefix]``.
CHECKPOINT_URI = matches(
    r"^s3a://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$",
    "checkpoint.uri must be s3a://<bucket>/<prefix>: the image reaches object storage through "
    "Hadoop's S3A connector (AWS S3 and S3-compatible stores; GCS through its XML API with "
    "HMAC keys and checkpoint.options fs.s3a.endpoint: https://storage.googleapis.com); "
    "s3://, s3n:// and gs:// are not served",
)
#: S3A properties that are secrets (also per bucket, ``fs.s3a.bucket.<bucket>.<name>``).
_S3A_CREDENTIAL = (
    r"^fs\.s3a\.(bucket\.[^.]+\.)?"
    r"(access\.key|secret\.key|session\.token|encryption\.key|server-side-encryption\.key"
    r"|proxy\.password)$"
)
CHECKPOINT_OPTIONS_ARE_S3A = Rule(
    "self.all(k, k.startsWith('fs.s3a.'))",
    lambda v: all(k.startswith("fs.s3a.") for k in v),
    "checkpoint.options holds Hadoop S3A settings only (names fs.s3a.*); Spark settings "
    "belong in spark.conf",
)
#: What the Secret of ``checkpoint.secretRef`` holds: the AWS SDK's environment variables.
CHECKPOINT_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
#: A key the Secret may hold too (temporary credentials).
CHECKPOINT_SECRET_OPTIONAL_KEYS = ("AWS_SESSION_TOKEN",)


class CheckpointSecretRef(SpecModel):
    """A Secret in the pipeline's namespace with the object store's access key.

    Keys ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY`` (and ``AWS_SESSION_TOKEN`` for
    temporary credentials), set as environment variables of the driver and its executors,
    where S3A's default credential chain reads them. The operator looks at its keys, never
    its values, before a driver starts (``health.checkpoint_secret``).
    """

    name: str = Field(min_length=1, max_length=253, description="Name of the Secret.")


class CheckpointSpec(SpecModel):
    """Where the Spark checkpoint lives: a volume (default) or object storage."""

    at_most_one_of = (("volume", "uri"),)
    rules = (
        Rule(
            "has(self.uri) || (!has(self.secretRef) && (!has(self.options) || "
            "size(self.options) == 0))",
            lambda c: c.uri is not None or (c.secret_ref is None and not c.options),
            "checkpoint.secretRef and checkpoint.options are for a checkpoint in object "
            "storage: set checkpoint.uri",
        ),
    )

    volume: CheckpointVolume | None = Field(
        default=None, description="A PersistentVolumeClaim (the default when uri is unset)."
    )
    uri: Annotated[str, CHECKPOINT_URI] | None = Field(
        default=None,
        max_length=1000,
        description="Object storage: s3a://<bucket>/<prefix> (Hadoop's S3A connector). Each "
        "pipeline's checkpoint generations live under <uri>/<namespace>/<name>.",
    )
    secret_ref: CheckpointSecretRef | None = Field(
        default=None,
        description="Secret with the object store's credentials: keys AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY (and, if present, AWS_SESSION_TOKEN), set as environment "
        "variables of the driver, its executors and the checkpoint's deletion Job. Unset, "
        "S3A's credential chain applies (the node's instance "
        "profile, or a provider named in options, such as web identity on EKS).",
    )
    options: Annotated[
        dict[str, str],
        Field(max_length=50),
        CHECKPOINT_OPTIONS_ARE_S3A,
        refuse_credentials(
            f"k.lowerAscii().matches(r'{_S3A_CREDENTIAL}')",
            lambda k: re.search(_S3A_CREDENTIAL, k) is not None,
            "checkpoint.options",
            "checkpoint.secretRef",
        ),
    ] = Field(
        default_factory=dict,
        description="Hadoop S3A settings (fs.s3a.*) such as fs.s3a.endpoint, "
        "fs.s3a.endpoint.region, fs.s3a.path.style.access, for the driver, its executors and "
        "the checkpoint's deletion. Credentials (fs.s3a.access.key, fs.s3a.secret.key, "
        "fs.s3a.session.token, encryption keys, fs.s3a.proxy.password) are refused: they "
        "belong in the Secret of secretRef.",
    )
    retention: Retention = Field(
        default=Retention.RETAIN,
        description="On delete: Retain keeps the checkpoint, Delete removes it (the volume "
        "claim; for a uri, a Job with the Spark image deletes <uri>/<namespace>/<name> before "
        "the pipeline goes).",
    )

    @property
    def claim(self) -> CheckpointVolume | None:
        """The volume to claim, or None when the checkpoint lives at a URI."""
        if self.uri is not None:
            return None
        return self.volume or CheckpointVolume()


class Transactions(SpecModel):
    """Kafka transactional identity of the pipeline's sink producers."""

    id_prefix: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="Transactional id prefix; defaults to eop.<namespace>.<name>. Immutable: "
        "changing it would break the fencing of older producers.",
    )


class UpgradeMode(StrEnum):
    """How a restart-worthy change is rolled out (see docs/api.md)."""

    LAST_STATE = "last-state"
    COMMITTED_OFFSETS = "committed-offsets"
    STATELESS = "stateless"


class UpgradeSpec(SpecModel):
    """How spec changes that need a driver restart are applied (see docs/lifecycle.md)."""

    rules = (
        Rule(
            "!has(self.rollback) || !self.rollback || !has(self.readinessTimeout) || "
            "duration(self.readinessTimeout) > duration('0s')",
            lambda u: not u.rollback or u.readiness_timeout.ms > 0,
            "upgrade.readinessTimeout must be more than 0s with upgrade.rollback: every upgrade "
            "would be rolled back before its driver could become Ready",
            field_path=".readinessTimeout",
        ),
    )

    mode: UpgradeMode = Field(
        default=UpgradeMode.LAST_STATE,
        description="last-state resumes the checkpoint; committed-offsets starts a new checkpoint "
        "generation from the progress group; stateless reprocesses from startingOffsets.",
    )
    readiness_timeout: Duration = Field(
        default=Duration("5m"),
        description="How long a restarted driver may take to become Ready before the upgrade "
        "counts as failed; also how long the old driver pod may take to go before the pipeline "
        "is Degraded (DriverNotStopped).",
    )
    rollback: bool = Field(
        default=False,
        description="Roll back to the last spec that ran healthily when an upgraded driver is "
        "not Ready within readinessTimeout.",
    )
    allow_fallback: bool = Field(
        default=True,
        description="When a last-state restart finds the checkpoint incompatible with the new "
        "query, start a new generation from the progress group (committed-offsets) instead.",
    )


class FailoverSpec(SpecModel):
    """When a crashing driver counts as Degraded, and how restarts are spaced."""

    rules = (
        Rule(
            "duration(self.backoff) <= duration(self.maxBackoff)",
            lambda f: f.backoff.ms <= f.max_backoff.ms,
            "failover.backoff must not exceed failover.maxBackoff",
            field_path=".backoff",
        ),
    )

    max_restarts: int = Field(
        default=5, ge=1, le=1000, description="Restarts within window before Degraded."
    )
    window: Duration = Field(
        default=Duration("10m"), description="The window restarts are counted in."
    )
    backoff: Duration = Field(
        default=Duration("10s"),
        description="Delay before the operator restarts a failed driver; doubles. At most "
        "maxBackoff.",
    )
    max_backoff: Duration = Field(default=Duration("5m"), description="Upper bound of the backoff.")


class RestartPolicy(StrEnum):
    """Whether a driver that exits is started again.

    Only ``Always`` for now: the driver runs in a StatefulSet, which restarts it,
    and ``spec.failover`` governs backoff and Degraded.  ``Never`` (stop for good
    after an exit) is not offered until the operator honours it; the API server
    rejects it rather than accept a setting that would do nothing.
    """

    ALWAYS = "Always"


class HealthSpec(SpecModel):
    """Health from progress: how often the operator checks the progress group, when it restarts."""

    rules = (
        Rule(
            "duration(self.stallTimeout) > duration(self.checkInterval)",
            lambda h: h.stall_timeout.ms > h.check_interval.ms,
            "health.stallTimeout must be longer than health.checkInterval",
            field_path=".stallTimeout",
        ),
    )

    check_interval: Annotated[Duration, at_least("health.checkInterval", "1s")] = Field(
        default=Duration("30s"),
        description="How often the operator compares the progress group with the source's end "
        "offsets; at least 1s.",
    )
    stall_timeout: Duration = Field(
        default=Duration("5m"),
        description="Restart a Ready driver (event RestartStalled) when input waits and the "
        "progress group has not advanced for this long. Longer than checkInterval and than the "
        "trigger's processingTime (10s when unset).",
    )


#: Kubernetes CPU quantities: whole or decimal cores (1, 0.5) or millicores (500m).
CPU_QUANTITY_PATTERN = r"^([0-9]+(\.[0-9]+)?|[0-9]+m)$"


class CpuQuantity(SpecModel):
    """A CPU amount of the driver container."""

    cpu: str | None = Field(
        default=None,
        max_length=16,
        pattern=CPU_QUANTITY_PATTERN,
        description="CPU, e.g. 500m, 0.5, 2.",
    )


def millicores(cpu: str) -> int:
    """A CPU quantity of :data:`CPU_QUANTITY_PATTERN` in millicores."""
    if cpu.endswith("m"):
        return int(cpu[:-1])
    return round(float(cpu) * 1000)


class DriverResources(SpecModel):
    """CPU of the driver container; its memory follows spec.spark.driver.memory."""

    requests: CpuQuantity = Field(
        default_factory=CpuQuantity,
        description="CPU request; spec.spark.driver.cores when unset. May be a fraction of a "
        "core (Spark's cores are whole numbers; the pod's request need not be).",
    )
    limits: CpuQuantity = Field(
        default_factory=CpuQuantity,
        description="CPU limit; none when unset. At least the request (requests.cpu, else "
        "spec.spark.driver.cores): a pod whose limit is below its request is never created.",
    )


class ExecutorResources(SpecModel):
    """CPU of each executor container; its memory follows spec.spark.executor.memory."""

    requests: CpuQuantity = Field(
        default_factory=CpuQuantity,
        description="CPU request of each executor pod; spec.spark.executor.cores when unset. "
        "May be a fraction of a core: the executor still runs spark.executor.cores tasks.",
    )
    limits: CpuQuantity = Field(
        default_factory=CpuQuantity,
        description="CPU limit of each executor pod; none when unset. At least the request "
        "(requests.cpu, else spec.spark.executor.cores).",
    )


#: A Kubernetes qualified name (label and annotation keys): an optional DNS subdomain prefix
#: and '/', then up to 63 letters, digits, '-', '_', '.', starting and ending alphanumeric.
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
#: A label value: empty, or up to 63 of the name's characters.
LABEL_VALUE_PATTERN = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"
#: Entries of a pod's label, annotation or node selector map the spec takes.
MAX_POD_METADATA = 64


def _qualified_keys(field: str, what: str) -> Rule:
    """Every key of the map ``field`` is a qualified name (the StatefulSet would be refused
    otherwise); the refusal names the first key that is not."""
    return refuse_keys(
        f"!k.matches(r'{QUALIFIED_NAME_PATTERN}')",
        lambda key: re.search(QUALIFIED_NAME_PATTERN, key) is None,
        f"{field} keys must be qualified names",
        before=f"{field}: ",
        after=f" is not a valid {what} key: an optional DNS prefix and /, then up to 63 "
        "letters, digits, -, _ or . (alphanumeric at both ends)",
    )


#: A label value the API server takes.
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
PodLabels = Annotated[
    dict[str, LabelValue],
    Field(max_length=MAX_POD_METADATA),
    _qualified_keys("driver.labels", "label"),
]
NodeSelector = Annotated[
    dict[str, LabelValue],
    Field(max_length=MAX_POD_METADATA),
    _qualified_keys("driver.nodeSelector", "label"),
]
PodAnnotations = Annotated[
    dict[str, str],
    Field(max_length=MAX_POD_METADATA),
    _qualified_keys("driver.annotations", "annotation"),
]


def _declared(**properties: dict[str, Any]) -> WithJsonSchema:
    """The CRD schema of a free-form Kubernetes object with the fields its rules read: CEL
    sees only declared fields, and the API server keeps every other one as it is."""
    return WithJsonSchema(
        {"type": "object", "properties": properties, "x-kubernetes-preserve-unknown-fields": True}
    )


_STRING: dict[str, Any] = {"type": "string"}
_FREE_FORM: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_TOLERATION_OPERATORS = ("Exists", "Equal")
_TAINT_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")


def _toleration_holds(t: KubeObject) -> bool:
    operator, effect = t.get("operator", "Equal"), t.get("effect", "")
    return (
        operator in _TOLERATION_OPERATORS
        and effect in _TAINT_EFFECTS
        and (operator == "Exists" or bool(t.get("key")))
        and (operator != "Exists" or not t.get("value"))
        and ("tolerationSeconds" not in t or effect == "NoExecute")
    )


#: What the API server checks of a pod's toleration.
TOLERATION = Rule(
    f"(!has(self.operator) || self.operator in {list(_TOLERATION_OPERATORS)}) && "
    f"(!has(self.effect) || self.effect in {list(_TAINT_EFFECTS)}) && "
    "((has(self.operator) && self.operator == 'Exists') || (has(self.key) && self.key != '')) && "
    "(!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == '') && "
    "(!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute'))",
    _toleration_holds,
    "a toleration has operator Exists or Equal (Equal needs a key, Exists no value), effect "
    "NoSchedule, PreferNoSchedule or NoExecute, and tolerationSeconds only with NoExecute",
)
Toleration = Annotated[
    KubeObject,
    _declared(
        key={**_STRING, "maxLength": 317},
        operator={**_STRING, "maxLength": 16},
        value={**_STRING, "maxLength": 63},
        effect={**_STRING, "maxLength": 16},
        tolerationSeconds={"type": "integer"},
    ),
    TOLERATION,
]

#: An environment variable's name as the API server takes it: printable ASCII but '='.
ENV_NAME_PATTERN = r"^[ -<>-~]+$"
ENV_VAR = Rule(
    f"has(self.name) && self.name.matches(r'{ENV_NAME_PATTERN}') && "
    "!(has(self.value) && self.value != '' && has(self.valueFrom))",
    lambda e: (
        re.search(ENV_NAME_PATTERN, str(e.get("name", ""))) is not None
        and not (e.get("value") and "valueFrom" in e)
    ),
    "an env var needs a name of printable ASCII characters other than '=', and either value "
    "or valueFrom",
)
EnvVar = Annotated[
    KubeObject,
    _declared(name={**_STRING, "maxLength": 253}, value=_STRING, valueFrom=_FREE_FORM),
    ENV_VAR,
]


#: Volume types a driver may mount: those of a Pod Security ``restricted`` pod (what the
#: namespace already holds, scratch space, the pod's own metadata), and hostPath, which the
#: operator's pod policy refuses unless allowed (``render.pod_policy``).
VOLUME_TYPES = (
    "configMap",
    "secret",
    "emptyDir",
    "persistentVolumeClaim",
    "projected",
    "downwardAPI",
    "ephemeral",
    "csi",
    "hostPath",
)
#: The other volume types of core/v1 Pods: storage servers and cloud disks a pod would reach
#: past the namespace's claims (the API server refuses these by name; the operator refuses any
#: type not in VOLUME_TYPES).
REFUSED_VOLUME_TYPES = (
    "nfs",
    "iscsi",
    "rbd",
    "cephfs",
    "glusterfs",
    "fc",
    "flexVolume",
    "flocker",
    "cinder",
    "gitRepo",
    "image",
    "awsElasticBlockStore",
    "gcePersistentDisk",
    "azureDisk",
    "azureFile",
    "vsphereVolume",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "scaleIO",
    "storageos",
)
_ALLOWED_TYPES_TEXT = ", ".join(VOLUME_TYPES[:-1])
VOLUME_TYPE = Rule(
    " && ".join(f"!has(self.{kind})" for kind in REFUSED_VOLUME_TYPES),
    lambda v: set(v) - {"name"} <= set(VOLUME_TYPES),
    f"a driver volume is one of {_ALLOWED_TYPES_TEXT} (and hostPath where the operator allows "
    "it); storage servers and cloud disks (nfs, iscsi, rbd, cephfs, ...) are mounted through a "
    "persistentVolumeClaim",
    explain=lambda v: (
        f"volume {v.get('name')!r} is of type "
        f"{', '.join(sorted(set(v) - {'name'} - set(VOLUME_TYPES)))}, which a driver may not "
        "mount; "
        f"a driver volume is one of {_ALLOWED_TYPES_TEXT} (and hostPath where the operator allows "
        "it); storage servers and cloud disks are mounted through a persistentVolumeClaim"
    ),
)
#: At most this many sources in a projected volume (the CEL cost of the rule below).
MAX_PROJECTED_SOURCES = 32
NO_TOKEN_VOLUME = Rule(
    "!has(self.projected) || !has(self.projected.sources) || "
    "self.projected.sources.all(s, !has(s.serviceAccountToken))",
    lambda v: (
        not any(
            "serviceAccountToken" in source
            for source in ((v.get("projected") or {}).get("sources") or [])
            if isinstance(source, dict)
        )
    ),
    "a projected volume may not hold a serviceAccountToken: a driver gets the API token of "
    "its own ServiceAccount only when its executors run on Kubernetes",
)
Volume = Annotated[
    KubeObject,
    _declared(
        name={**_STRING, "maxLength": 63},
        projected={
            "type": "object",
            "properties": {
                "sources": {
                    "type": "array",
                    "maxItems": MAX_PROJECTED_SOURCES,
                    "items": {
                        "type": "object",
                        "properties": {"serviceAccountToken": _FREE_FORM},
                        "x-kubernetes-preserve-unknown-fields": True,
                    },
                }
            },
            "x-kubernetes-preserve-unknown-fields": True,
        },
        **{kind: _FREE_FORM for kind in REFUSED_VOLUME_TYPES},
    ),
    VOLUME_TYPE,
    NO_TOKEN_VOLUME,
]


class DriverSpec(SpecModel):
    """Overrides for the driver pod."""

    labels: PodLabels = Field(default_factory=dict, description="Extra pod labels.")
    annotations: PodAnnotations = Field(default_factory=dict, description="Extra pod annotations.")
    node_selector: NodeSelector = Field(default_factory=dict, description="Pod nodeSelector.")
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=64, description="Pod tolerations."
    )
    host_network: bool = Field(
        default=False,
        description="Run the driver on the host network. Spark then picks free ports and "
        "metrics get a host port of their own (see docs/install.md).",
    )
    resources: DriverResources = Field(
        default_factory=DriverResources, description="CPU request and limit of the driver."
    )
    env: list[EnvVar] = Field(
        default_factory=list, max_length=128, description="Extra container env (EnvVar objects)."
    )
    volumes: list[Volume] = Field(
        default_factory=list,
        max_length=64,
        description="Extra pod volumes: configMap, secret, emptyDir, persistentVolumeClaim, "
        "projected (no serviceAccountToken), downwardAPI, ephemeral, csi; hostPath where the "
        "operator allows it.",
    )
    volume_mounts: list[KubeObject] = Field(
        default_factory=list, description="Extra container volumeMounts."
    )


class ExecutorPodSpec(SpecModel):
    """Overrides for the executor pods (when spec.spark.master is k8s://...)."""

    resources: ExecutorResources = Field(
        default_factory=ExecutorResources, description="CPU request and limit of each executor."
    )


def _cpu_fits(side: str) -> Rule:
    """The rule that ``spec.<side>.resources.limits.cpu`` is at least the side's CPU request.

    ``side`` is ``driver`` or ``executor``: the request is ``resources.requests.cpu``, else
    ``spec.spark.<side>.cores``.
    """
    res = f"self.{side}.resources"

    def holds(spec: PipelineSpec) -> bool:
        cpu = getattr(spec, side).resources
        if cpu.limits.cpu is None:
            return True
        request = cpu.requests.cpu or str(getattr(spec.spark, side).cores)
        return millicores(cpu.limits.cpu) >= millicores(request)

    return Rule(
        f"!has(self.{side}) || !has({res}) || !has({res}.limits) || !has({res}.limits.cpu) || "
        f"(has({res}.requests) && has({res}.requests.cpu) ? "
        f"quantity({res}.limits.cpu).compareTo(quantity({res}.requests.cpu)) >= 0 : "
        f"quantity({res}.limits.cpu).asApproximateFloat() >= "
        f"double(has(self.spark) && has(self.spark.{side}) ? self.spark.{side}.cores : 1))",
        holds,
        f"{side}.resources.limits.cpu must be at least the {side}'s CPU request "
        f"({side}.resources.requests.cpu, else spark.{side}.cores)",
        field_path=f".{side}.resources.limits.cpu",
    )


_PATH_COMPONENT = r"[a-z0-9]+([._-]+[a-z0-9]+)*"
#: An image reference the kubelet can pull: [registry[:port]/]repository[:tag][@digest].
IMAGE_PATTERN = (
    r"^([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]+)?/)?"
    rf"{_PATH_COMPONENT}(/{_PATH_COMPONENT})*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
IMAGE_REFERENCE = matches(
    IMAGE_PATTERN,
    "image must be an image reference such as registry.example.com/team/eop-spark:1.0 "
    "(lowercase repository, no spaces): the kubelet pulls no other (InvalidImageName)",
)


def _sink_is_not_a_source(spec: PipelineSpec) -> bool:
    """Whether the sink topic is not one the source reads from the same bootstrapServers.

    Listed or matched by ``topicPattern`` (Python's ``re``, whole names); CEL
    checks listed topics only: the API server's regex engine (RE2) cannot
    compile every pattern Java can.  The runner compares the clusters by id.
    """
    source, sink = spec.source.kafka, spec.sink.kafka
    return source.bootstrap_servers != sink.bootstrap_servers or not source.reads(sink.topic)


def _sink_read_by(spec: PipelineSpec) -> str:
    source, topic = spec.source.kafka, spec.sink.kafka.topic
    if source.topics is not None:
        return (
            f"sink.kafka.topic {topic!r} is one of source.kafka.topics on the same "
            "bootstrapServers: the pipeline would read its own output"
        )
    return (
        f"sink.kafka.topic {topic!r} matches source.kafka.topicPattern "
        f"{source.topic_pattern!r} on the same bootstrapServers: the pipeline would read its "
        "own output"
    )


_STALL_TIMEOUT_DEFAULT = HealthSpec.model_fields["stall_timeout"].default


class PipelineSpec(SpecModel):
    """The desired state of one exactly-once pipeline."""

    rules = (
        _cpu_fits("driver"),
        _cpu_fits("executor"),
        Rule(
            f"duration(has(self.health) ? self.health.stallTimeout : '{_STALL_TIMEOUT_DEFAULT}') "
            "> duration(has(self.trigger) && has(self.trigger.processingTime) ? "
            f"self.trigger.processingTime : '{DEFAULT_TRIGGER_INTERVAL}')",
            lambda spec: spec.health.stall_timeout.ms > spec.trigger.interval.ms,
            "health.stallTimeout must be longer than trigger.processingTime "
            f"({DEFAULT_TRIGGER_INTERVAL} when unset): a healthy pipeline would be restarted",
            field_path=".health.stallTimeout",
        ),
        Rule(
            "!has(self.source.kafka.topics) || "
            "self.source.kafka.bootstrapServers != self.sink.kafka.bootstrapServers || "
            "!(self.sink.kafka.topic in self.source.kafka.topics)",
            _sink_is_not_a_source,
            "sink.kafka.topic must not be one of source.kafka.topics on the same cluster: the "
            "pipeline would read its own output",
            field_path=".sink.kafka.topic",
            explain=_sink_read_by,
        ),
        Rule(
            f"!has(self.transform.outputMode) || self.transform.outputMode != "
            f"'{OutputMode.COMPLETE.value}' || !has(self.sink.kafka.commitMode) || "
            f"self.sink.kafka.commitMode != '{CommitMode.PARTITIONED.value}'",
            lambda spec: (
                not (
                    spec.transform.output_mode == OutputMode.COMPLETE
                    and spec.sink.kafka.commit_mode == CommitMode.PARTITIONED
                )
            ),
            "sink.kafka.commitMode partitioned cannot write a complete-mode query: complete "
            "output is an aggregation's, whose rows come from no single source record (use "
            "coordinated or auto)",
            field_path=".sink.kafka.commitMode",
        ),
    )

    image: Annotated[str, IMAGE_REFERENCE] | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description="Spark application image; the operator's default image when unset. An "
        "image reference such as registry.example.com/team/eop-spark:1.0 (lowercase "
        "repository, no spaces).",
    )
    image_pull_policy: PullPolicy = Field(default=PullPolicy.IF_NOT_PRESENT)
    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=SUBDOMAIN_PATTERN,
        description="ServiceAccount of the driver; one is created when executors run on "
        "Kubernetes and this is unset.",
    )
    source: SourceSpec
    transform: TransformSpec
    sink: SinkSpec
    trigger: TriggerSpec = Field(default_factory=TriggerSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    spark: SparkSpec = Field(default_factory=SparkSpec)
    transactions: Transactions = Field(default_factory=Transactions)
    upgrade: UpgradeSpec = Field(default_factory=UpgradeSpec)
    restart_policy: RestartPolicy = Field(
        default=RestartPolicy.ALWAYS,
        description="Always: the driver is restarted when it exits (see failover).",
    )
    failover: FailoverSpec = Field(default_factory=FailoverSpec)
    suspend: bool = Field(default=False, description="Stop the driver gracefully, keep state.")
    restart_nonce: str | None = Field(
        default=None, max_length=63, description="Change to force a driver restart."
    )
    driver: DriverSpec = Field(default_factory=DriverSpec)
    executor: ExecutorPodSpec = Field(
        default_factory=ExecutorPodSpec,
        description="Overrides for the executor pods (spec.spark.master k8s://...).",
    )
    health: HealthSpec = Field(default_factory=HealthSpec)

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> dict[str, Any]:
        schema = super().__get_pydantic_json_schema__(core_schema, handler)
        schema.setdefault(CEL_RULES_KEY, []).append(
            {
                # A transition rule: only evaluated on update, with oldSelf.
                "rule": "!has(oldSelf.transactions) || !has(oldSelf.transactions.idPrefix) || "
                "(has(self.transactions) && has(self.transactions.idPrefix) && "
                "self.transactions.idPrefix == oldSelf.transactions.idPrefix)",
                "message": "transactions.idPrefix is immutable once set",
                "fieldPath": ".transactions.idPrefix",
            }
        )
        return schema


class ConditionStatus(StrEnum):
    """Kubernetes condition status."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(BaseModel):
    """A kstatus-compatible condition (Ready, Progressing, Degraded)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    type: str
    status: ConditionStatus
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class Phase(StrEnum):
    """The pipeline's phase, as ``kubectl get eop`` shows it."""

    PENDING = "Pending"
    RUNNING = "Running"
    UPGRADING = "Upgrading"
    SUSPENDED = "Suspended"
    DEGRADED = "Degraded"
    INVALID = "Invalid"


class PartitionLag(BaseModel):
    """One source partition's position in the progress group."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    topic: str
    partition: int
    committed: int | None = Field(default=None, description="Offset committed to the group.")
    end: int = Field(description="End offset of the partition (committed input).")
    lag: int


class ProgressStatus(BaseModel):
    """The progress group against the source, as the operator last checked it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    lag: int | None = Field(default=None, description="Total records not yet in the sink.")
    worst_partitions: list[PartitionLag] = Field(
        default_factory=list, description="The partitions with the largest lag."
    )
    last_commit_time: str | None = Field(
        default=None, description="When the operator last saw the progress group advance."
    )
    input_rate: float | None = Field(default=None, description="Input records per second.")
    checked_at: str | None = Field(default=None, description="When the offsets were read.")
    message: str | None = Field(
        default=None,
        description="Why the offsets could not be read, or which partitions the progress group "
        "lost.",
    )
    held_partitions: dict[str, list[int]] = Field(
        default_factory=dict,
        description="Per source topic, the partitions the progress group has held an offset "
        "for, as the operator saw it: progress missing for one of them later was lost.",
    )


class CheckpointStatus(BaseModel):
    """The checkpoint generation in use."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    generation: int = 0
    path: str | None = None
    reset_progress: bool = Field(
        default=False,
        description="This generation reprocesses from startingOffsets (a stateless upgrade).",
    )


class UpgradeStep(StrEnum):
    """Where an upgrade in flight is: the write-ahead log's step."""

    #: The old driver is asked to stop (replicas 0); the next step waits until its pod is gone.
    STOPPING = "Stopping"
    #: The new configuration and pod template are applied with one replica.
    STARTING = "Starting"


class UpgradeStatus(BaseModel):
    """An upgrade in flight: written before each action, so a restarted operator finishes it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    from_hash: str | None = Field(default=None, description="Spec hash of the old driver.")
    to_hash: str = Field(description="Spec hash of the new driver.")
    mode: UpgradeMode
    step: UpgradeStep
    generation: int = Field(description="Checkpoint generation the new driver runs.")
    reset_progress: bool = False
    reason: str = Field(
        description="Why: SpecChanged, RestartNonce, OperatorUpgrade, RolledBack, FellBack, ..."
    )
    started_at: str | None = Field(default=None, description="When the current step began.")
    began_at: str | None = Field(default=None, description="When the upgrade began.")
    not_before: str | None = Field(
        default=None, description="The new driver starts no earlier (restart backoff)."
    )


class FailoverStatus(BaseModel):
    """Driver restarts the operator has seen."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    restarts: int = Field(default=0, description="Driver restarts seen in total.")
    recent: list[str] = Field(
        default_factory=list, description="Times of the restarts within the window."
    )
    last_reason: str | None = Field(default=None, description="Reason of the last termination.")
    last_message: str | None = Field(default=None, description="The last termination message.")
    last_time: str | None = Field(
        default=None, description="When the last termination happened (its finishedAt)."
    )
    seen: dict[str, int] = Field(
        default_factory=dict, description="Per driver pod uid: terminations already counted."
    )


class PipelineStatus(BaseModel):
    """The observed state, written only by the operator."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    phase: Phase | None = None
    ready: str | None = Field(default=None, description="Ready driver pods, e.g. 1/1.")
    executors: int | None = Field(
        default=None,
        description="Executors the running driver was started with (spec.spark.executor."
        "instances of its spec; 0 while no driver is Ready); unset without a k8s:// master. "
        "The /scale subresource's status.replicas.",
    )
    executor_selector: str | None = Field(
        default=None,
        description="Label selector of the pipeline's executor pods (the /scale subresource's "
        "status.selector, for a HorizontalPodAutoscaler on their CPU).",
    )
    lag: int | None = Field(default=None, description="Total records not yet in the sink.")
    progress: ProgressStatus | None = Field(
        default=None, description="Lag and progress from the progress group."
    )
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    checkpoint: CheckpointStatus | None = None
    transactional_id_prefix: str | None = None
    progress_group: str | None = None
    commit_mode: str | None = None
    spec_hash: str | None = Field(
        default=None,
        description="Spec hash of the applied driver: what the operator rendered for it.",
    )
    rendered_by: str | None = Field(
        default=None,
        description="Version of the operator that rendered the applied driver (unset: an "
        "operator older than this field).",
    )
    upgrade: UpgradeStatus | None = Field(default=None, description="The upgrade in flight.")
    last_stable_spec: dict[str, Any] | None = Field(
        default=None, description="The last spec whose driver ran healthily (for rollback)."
    )
    last_stable_fingerprint: str | None = None
    applied_fingerprint: str | None = Field(
        default=None,
        description="Fingerprint of the spec last applied. A new spec hash for the same "
        "fingerprint is the operator rendering the spec differently (reason OperatorUpgrade).",
    )
    rolled_back_fingerprint: str | None = Field(
        default=None,
        description="Fingerprint of a spec that failed and was rolled back; it is not retried "
        "until the spec changes.",
    )
    failover: FailoverStatus = Field(default_factory=FailoverStatus)
    message: str | None = Field(default=None, description="The last lifecycle decision.")


class ObjectMeta(BaseModel):
    """The parts of metadata the operator reads."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)
    namespace: str = "default"
    uid: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = Field(default=None, alias="creationTimestamp")
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class ExactlyOncePipeline(BaseModel):
    """One ``ExactlyOncePipeline`` object, as applied by users."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")
    crd_root_rules: ClassVar[list[dict[str, str]]] = [
        {
            "rule": f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
            "message": f"metadata.name must be at most {MAX_NAME_LENGTH} characters "
            "(children add suffixes)",
        },
        {
            "rule": f"self.metadata.name.matches(r'{NAME_PATTERN}')",
            "message": "metadata.name must be a DNS-1035 label (lowercase letters, digits and "
            "'-', starting with a letter, no dots): it names the pipeline's Service",
        },
    ]

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta
    spec: PipelineSpec
    status: PipelineStatus = Field(default_factory=PipelineStatus)

    @property
    def pipeline_id(self) -> str:
        """The identity ``<namespace>.<name>``."""
        return f"{self.metadata.namespace}.{self.metadata.name}"
