"""The data-plane part of the pipeline spec: source, transform, sink, trigger, Spark.

These models are the single definition of what a pipeline runs.  The operator's
``ExactlyOncePipeline`` API composes them (so the CRD schema is generated from
here too) and adds what only the operator needs (image, volumes, upgrades).
``spark_apps`` never imports the operator; the dependency runs the other way.

Rules the API server can enforce are declared once, with :func:`exactly_one_of`
and ``json_schema_extra``: each becomes both a pydantic validator (for
``eop run`` on a laptop) and a CEL ``x-kubernetes-validations`` rule in the CRD.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

#: Kubernetes-style durations accepted everywhere in the spec: ``500ms``, ``30s``, ``5m``, ``1h``.
DURATION_PATTERN = r"^[0-9]+(ms|s|m|h)$"
_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}

#: The key of a JSON-schema extra holding CEL rules, as the CRD wants them.
CEL_RULES_KEY = "x-kubernetes-validations"


def duration_ms(duration: str) -> int:
    """Convert a spec duration such as ``"30s"`` to milliseconds."""
    match = re.fullmatch(DURATION_PATTERN, duration)
    if match is None:
        raise ValueError(f"invalid duration {duration!r}: expected e.g. 500ms, 30s, 5m, 1h")
    unit = match.group(1)
    return int(duration[: -len(unit)]) * _DURATION_UNITS_MS[unit]


Duration = Annotated[str, Field(pattern=DURATION_PATTERN, examples=["30s"])]


class SpecModel(BaseModel):
    """Base of every spec model: camelCase on the wire, unknown fields rejected.

    Subclasses may declare choice groups of field names: ``one_of`` (exactly
    one must be set) and ``at_most_one_of``.  A boolean field counts as set
    when true.  Each group is checked in Python (for ``eop run`` on a laptop)
    and emitted as a CEL rule in the generated CRD (for ``kubectl apply``).
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )
    one_of: ClassVar[tuple[tuple[str, ...], ...]] = ()
    at_most_one_of: ClassVar[tuple[tuple[str, ...], ...]] = ()

    @classmethod
    def _choice_groups(cls) -> list[tuple[tuple[str, ...], bool, str]]:
        """Each group with whether exactly one is required, and its error message."""
        groups = []
        for group, exactly in [(g, True) for g in cls.one_of] + [
            (g, False) for g in cls.at_most_one_of
        ]:
            names = [to_camel(name) for name in group]
            if exactly:
                message = f"exactly one of {' or '.join(names)} must be set"
            else:
                message = f"set at most one of {' or '.join(names)}"
            groups.append((group, exactly, message))
        return groups

    @model_validator(mode="after")
    def _check_choices(self) -> SpecModel:
        for group, exactly, message in self._choice_groups():
            chosen = [name for name in group if getattr(self, name) not in (None, False)]
            if len(chosen) > 1 or (exactly and not chosen):
                raise ValueError(message)
        return self

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> dict[str, Any]:
        schema: dict[str, Any] = handler(core_schema)
        schema = handler.resolve_ref_schema(schema)
        rules = list(schema.get(CEL_RULES_KEY, []))
        for group, exactly, message in cls._choice_groups():
            terms = []
            for name in group:
                camel = to_camel(name)
                is_bool = cls.model_fields[name].annotation in (bool, "bool")
                set_test = f"has(self.{camel}) && self.{camel}" if is_bool else f"has(self.{camel})"
                terms.append(f"({set_test} ? 1 : 0)")
            bound = "== 1" if exactly else "<= 1"
            rules.append({"rule": f"{' + '.join(terms)} {bound}", "message": message})
        if rules:
            schema[CEL_RULES_KEY] = rules
        return schema


#: What a Secret of client properties holds (the secretRef fields' descriptions).
SECRET_KEYS = (
    "one key per property. librdkafka's sasl.username and sasl.password (with sasl.mechanism "
    "PLAIN or SCRAM-SHA-256/512) serve the Java clients too, as their sasl.jaas.config."
)


class SecretRef(SpecModel):
    """A Secret in the pipeline's namespace whose keys are Kafka client properties.

    Each key (e.g. ``security.protocol``, ``sasl.username``,
    ``ssl.truststore.location``) is set on the Kafka clients that know it; the
    values never leave the Secret (the driver pod mounts it read-only).
    """

    name: str = Field(min_length=1, max_length=253, description="Name of the Secret.")


class StartingOffsets(StrEnum):
    """Named starting positions; per-partition JSON is accepted as well."""

    EARLIEST = "earliest"
    LATEST = "latest"


class KafkaSource(SpecModel):
    """Where the pipeline reads: Kafka topics, read with ``read_committed`` isolation."""

    one_of = (("topics", "topic_pattern"),)

    bootstrap_servers: str = Field(
        min_length=1, description="Comma-separated host:port list of the source cluster."
    )
    topics: list[Annotated[str, Field(min_length=1, max_length=249)]] | None = Field(
        default=None, min_length=1, description="Topics to read."
    )
    topic_pattern: str | None = Field(
        default=None, min_length=1, description="Java regex of topics to read (instead of topics)."
    )
    starting_offsets: str = Field(
        default=StartingOffsets.EARLIEST.value,
        description=(
            "Where partitions never seen by the pipeline start: earliest, latest, or Spark's "
            'per-partition JSON such as {"events":{"0":42,"1":-2}} (-2 earliest, -1 latest).'
        ),
        json_schema_extra={
            CEL_RULES_KEY: [
                {
                    "rule": "self == 'earliest' || self == 'latest' || self.startsWith('{')",
                    "message": "startingOffsets must be earliest, latest or a JSON object",
                }
            ]
        },
    )
    max_offsets_per_trigger: int | None = Field(
        default=None, ge=1, description="Upper bound of records read per micro-batch."
    )
    options: dict[str, str] = Field(
        default_factory=dict,
        description="Extra Kafka consumer properties (without the kafka. prefix).",
    )
    secret_ref: SecretRef | None = Field(
        default=None,
        description="Secret with SASL/TLS client properties for the source: " + SECRET_KEYS,
    )
    allow_missing_progress: bool | None = Field(
        default=None,
        description="Opt-in: a new checkpoint generation starts partitions the pipeline "
        "committed before but whose progress is gone from the progress group (expired or "
        "deleted) at startingOffsets, instead of stopping; their output may repeat or skip.",
    )

    @field_validator("starting_offsets")
    @classmethod
    def _valid_starting_offsets(cls, value: str) -> str:
        if value in {s.value for s in StartingOffsets}:
            return value
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"startingOffsets is not earliest, latest or JSON: {exc}") from exc
        if not isinstance(parsed, dict):
            raise ValueError("startingOffsets JSON must map topic -> partition -> offset")
        return value


class SourceSpec(SpecModel):
    """The pipeline's input."""

    kafka: KafkaSource


class PythonTransform(SpecModel):
    """A callable ``DataFrame -> DataFrame`` importable in the application image."""

    module: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$",
        description="Dotted module path, e.g. eop_spark.examples.impressions.",
    )
    function: str = Field(
        min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Function name in module."
    )


class OutputMode(StrEnum):
    """Spark output modes; stateful queries need append-with-watermark, update or complete."""

    APPEND = "append"
    UPDATE = "update"
    COMPLETE = "complete"


class TransformSpec(SpecModel):
    """How input becomes output.

    The input is a view named ``source`` with columns key, value, topic,
    partition, offset, timestamp, headers (Spark's Kafka source schema).  The
    output follows Spark's Kafka sink contract: ``value`` required, ``key`` and
    ``headers`` optional.
    """

    one_of = (("sql", "python"),)

    sql: str | None = Field(default=None, min_length=1, description="A query over the view source.")
    python: PythonTransform | None = Field(default=None, description="A Python callable instead.")
    output_mode: OutputMode = Field(
        default=OutputMode.APPEND, description="Spark output mode for stateful queries."
    )
    allow_empty_state: bool | None = Field(
        default=None,
        description="Opt-in: a new checkpoint generation of a stateful query (aggregation, "
        "window, deduplication, join) restarts with empty state where the progress group "
        "resumes, instead of stopping; windows open at that point are published incomplete.",
    )


class CommitMode(StrEnum):
    """How the sink commits output and progress (see docs/exactly-once.md)."""

    AUTO = "auto"
    PARTITIONED = "partitioned"
    COORDINATED = "coordinated"


class KafkaSink(SpecModel):
    """Where the pipeline writes, transactionally."""

    bootstrap_servers: str = Field(
        min_length=1, description="Comma-separated host:port list of the sink cluster."
    )
    topic: str = Field(min_length=1, max_length=249, description="Output topic.")
    commit_mode: CommitMode = Field(
        default=CommitMode.AUTO,
        description="partitioned (record-wise queries), coordinated (any query), or auto.",
    )
    transaction_timeout: Duration = Field(
        default="60s", description="Kafka transaction.timeout.ms of the sink producers."
    )
    options: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Extra Kafka producer properties, librdkafka's names. Partitioned mode's tasks use "
            "the Java producer with the names both clients share; a SASL/SSL property only "
            "librdkafka knows (other than the SASL user name and password) keeps them on "
            "librdkafka."
        ),
    )
    secret_ref: SecretRef | None = Field(
        default=None,
        description="Secret with SASL/TLS client properties for the sink: " + SECRET_KEYS,
    )


class SinkSpec(SpecModel):
    """The pipeline's output."""

    kafka: KafkaSink


class TriggerSpec(SpecModel):
    """When micro-batches run: every processingTime, or once over what is available."""

    at_most_one_of = (("processing_time", "available_now"),)

    processing_time: Duration | None = Field(
        default=None, description="Micro-batch interval, e.g. 10s (default when nothing is set)."
    )
    available_now: bool = Field(default=False, description="Process what is available, then stop.")

    def interval_ms(self) -> int:
        """The micro-batch interval in milliseconds (10 s unless set)."""
        return duration_ms(self.processing_time or "10s")


class ResourceSpec(SpecModel):
    """CPU and memory of a Spark process, as Kubernetes quantities."""

    cores: int = Field(default=1, ge=1, le=64, description="CPU cores.")
    memory: str = Field(
        default="1g",
        pattern=r"^[0-9]+[kmgt]$",
        description="JVM heap in Spark notation, e.g. 1g, 512m.",
    )


class ExecutorSpec(ResourceSpec):
    """Kubernetes executors (used when master is k8s)."""

    instances: int = Field(default=1, ge=1, le=1000, description="Number of executors.")


class SparkSpec(SpecModel):
    """Spark settings of the driver (and executors when they run on Kubernetes)."""

    master: str = Field(
        default="local[2]",
        pattern=r"^(local(\[([0-9]+|\*)\])?|k8s://.+)$",
        description="local[N] runs Spark inside the driver pod; k8s://... runs executors as pods.",
    )
    driver: ResourceSpec = Field(default_factory=ResourceSpec, description="Driver resources.")
    executor: ExecutorSpec = Field(
        default_factory=ExecutorSpec, description="Executor resources and count (k8s master)."
    )
    conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark configuration.")

    @property
    def on_kubernetes(self) -> bool:
        """Whether executors run as Kubernetes pods."""
        return self.master.startswith("k8s://")
