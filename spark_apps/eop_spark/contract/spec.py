"""The data-plane part of the pipeline spec: source, transform, sink, trigger, Spark.

These models are the single definition of what a pipeline runs.  The operator's
``ExactlyOncePipeline`` API composes them (so the CRD schema is generated from
here too) and adds what only the operator needs (image, volumes, upgrades).
``spark_apps`` never imports the operator; the dependency runs the other way.

Rules the API server can enforce are declared once, with :func:`exactly_one_of`
and ``json_schema_extra``: each becomes both a pydantic validator (for
``eop run`` on a laptop) and a CEL ``x-kubernetes-validations`` rule in the CRD.

Longer than most modules: every field of the data plane's part of the API is
declared here once, with its description and its rules, because the CRD and
docs/api.md are generated from these declarations.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import core_schema as cs

from eop_spark.contract.owned_settings import SINK_OPTIONS, SOURCE_OPTIONS, SPARK_CONF, OwnedKeys

#: Kubernetes-style durations accepted everywhere in the spec: ``500ms``, ``30s``, ``5m``, ``1h``.
#: At most six digits, so every duration also parses as CEL's (Go's) duration in the API server.
DURATION_PATTERN = r"^[0-9]{1,6}(ms|s|m|h)$"
_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}

#: The key of a JSON-schema extra holding CEL rules, as the CRD wants them.
CEL_RULES_KEY = "x-kubernetes-validations"

#: The validation-context key that ratchets :class:`Rule` s and choice groups: a list under
#: it collects their violations (messages) instead of raising them.  The operator passes one
#: for a spec an earlier operator accepted unchanged, as the API server ratchets CEL rules.
RATCHET_KEY = "ratchet"


def _violated(message: str, info: ValidationInfo | None) -> None:
    """Raise a rule's ValueError, or record it when the validation ratchets."""
    context = info.context if info is not None else None
    if isinstance(context, dict) and isinstance(context.get(RATCHET_KEY), list):
        context[RATCHET_KEY].append(message)
        return
    raise ValueError(message)


class Duration(str):
    """A spec duration: the text as written (``"30s"``) and its length, worked out once.

    It is the string on the wire (run.json, the CRD, ``model_dump``), so schemas
    and messages show what the user wrote; code reads :attr:`ms`, :attr:`seconds`
    or :attr:`delta` and parses nothing.  It pickles as its text and milliseconds.
    """

    ms: int

    def __new__(cls, text: str, ms: int | None = None) -> Duration:
        """``text`` as a duration (ValueError unless it is one); ``ms`` when already known."""
        duration = super().__new__(cls, text)
        if ms is None:
            match = re.fullmatch(DURATION_PATTERN, text)
            if match is None:
                raise ValueError(f"invalid duration {text!r}: expected e.g. 500ms, 30s, 5m, 1h")
            unit = match.group(1)
            ms = int(text[: -len(unit)]) * _DURATION_UNITS_MS[unit]
        duration.ms = ms
        return duration

    def __getnewargs__(self) -> tuple[str, int]:  # type: ignore[override]
        return str(self), self.ms

    @property
    def seconds(self) -> float:
        """The length in seconds."""
        return self.ms / 1000

    @property
    def delta(self) -> datetime.timedelta:
        """The length as a :class:`~datetime.timedelta`."""
        return datetime.timedelta(milliseconds=self.ms)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> cs.CoreSchema:
        text = cs.str_schema(pattern=DURATION_PATTERN, max_length=8)
        return cs.no_info_after_validator_function(
            cls, text, serialization=cs.plain_serializer_function_ser_schema(str)
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict[str, Any]:
        out: dict[str, Any] = handler(schema)
        out["examples"] = ["30s"]
        return out


@dataclass(frozen=True)
class Rule:
    """A rule declared once and enforced twice: CEL in the CRD, Python in pydantic.

    On a model (its ``rules``) ``holds`` receives the model; in a field's
    ``Annotated`` metadata it receives the field's value.  A rule whose message
    names the offending value adds ``message_expression`` (CEL) and ``explain``
    (Python).  The API server runs the CEL on ``kubectl apply``; pydantic runs
    ``holds`` for ``eop run``, ``eop render`` and the operator.
    """

    cel: str
    holds: Callable[[Any], bool]
    message: str
    field_path: str | None = None
    message_expression: str | None = None
    explain: Callable[[Any], str] | None = None

    def cel_rule(self) -> dict[str, str]:
        """The ``x-kubernetes-validations`` entry."""
        rule = {"rule": self.cel, "message": self.message}
        if self.field_path is not None:
            rule["fieldPath"] = self.field_path
        if self.message_expression is not None:
            rule["messageExpression"] = self.message_expression
        return rule

    def check(self, value: Any, info: ValidationInfo | None = None) -> Any:
        """Return ``value`` when the rule holds, else raise ValueError with the message.

        Under a ratcheting validation (:data:`RATCHET_KEY`) the message is recorded instead.
        """
        if not self.holds(value):
            _violated(self.explain(value) if self.explain is not None else self.message, info)
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> cs.CoreSchema:
        return cs.with_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict[str, Any]:
        out: dict[str, Any] = handler(schema)
        out.setdefault(CEL_RULES_KEY, []).append(self.cel_rule())
        return out


def matches(regex: str, message: str) -> Rule:
    """A field rule: the value contains a match of ``regex`` (anchor it), in RE2 and Python.

    ``regex`` must mean the same to both engines and hold no single quote (it is
    a CEL raw string).
    """
    return Rule(f"self.matches(r'{regex}')", lambda v: re.search(regex, v) is not None, message)


def at_least(name: str, minimum: str) -> Rule:
    """A duration field rule: ``name`` is at least ``minimum`` (both spec durations)."""
    floor = Duration(minimum)
    return Rule(
        f"!self.matches(r'{DURATION_PATTERN}') || duration(self) >= duration('{minimum}')",
        lambda v: v.ms >= floor.ms,
        f"{name} must be at least {minimum}",
    )


class SpecModel(BaseModel):
    """Base of every spec model: camelCase on the wire, unknown fields rejected.

    Subclasses may declare choice groups of field names: ``one_of`` (exactly
    one must be set) and ``at_most_one_of``.  A boolean field counts as set
    when true.  Each group is checked in Python (for ``eop run`` on a laptop)
    and emitted as a CEL rule in the generated CRD (for ``kubectl apply``).
    ``rules`` (:class:`Rule`) relate fields of the model the same two ways.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )
    one_of: ClassVar[tuple[tuple[str, ...], ...]] = ()
    at_most_one_of: ClassVar[tuple[tuple[str, ...], ...]] = ()
    rules: ClassVar[tuple[Rule, ...]] = ()

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
    def _check_choices(self, info: ValidationInfo) -> SpecModel:
        for group, exactly, message in self._choice_groups():
            chosen = [name for name in group if getattr(self, name) not in (None, False)]
            if len(chosen) > 1 or (exactly and not chosen):
                _violated(message, info)
        for rule in self.rules:
            rule.check(self, info)
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
        rules += [rule.cel_rule() for rule in cls.rules]
        if rules:
            schema[CEL_RULES_KEY] = rules
        return schema


#: What a Secret of client properties holds (the secretRef fields' descriptions).
SECRET_KEYS = (
    "one key per property. librdkafka's sasl.username and sasl.password (with sasl.mechanism "
    "PLAIN or SCRAM-SHA-256/512) serve the Java clients too, as their sasl.jaas.config. "
    "A Strimzi-style TLS Secret (ca.crt, user.crt, user.key) serves every client: PEM for "
    "librdkafka, PEM stores for the Java clients (set security.protocol SSL in options)."
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


_PORT = r"([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
_HOST_PORT = rf"([A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):{_PORT}"
#: A comma-separated ``host:port`` list (port 1-65535); a host name, IPv4 or [IPv6] address.
BOOTSTRAP_SERVERS = matches(
    rf"^\s*{_HOST_PORT}\s*(,\s*{_HOST_PORT}\s*)*$",
    "must be a comma-separated host:port list with ports 1-65535, e.g. kafka-0:9092,kafka-1:9092",
)

#: Kafka's legal topic names (the broker refuses others).
TOPIC_PATTERN = r"^[A-Za-z0-9._-]+$"
Topic = Annotated[str, Field(min_length=1, max_length=249, pattern=TOPIC_PATTERN)]

_OFFSET_ENTRY = r'"[0-9]{1,9}"\s*:\s*(-1|-2|[0-9]{1,18})'
_TOPIC_ENTRY = rf'"[A-Za-z0-9._-]+"\s*:\s*\{{\s*{_OFFSET_ENTRY}(\s*,\s*{_OFFSET_ENTRY})*\s*\}}'
_STARTING_JSON = rf"^\s*\{{\s*{_TOPIC_ENTRY}(\s*,\s*{_TOPIC_ENTRY})*\s*\}}\s*$"
_NAMED_STARTS = tuple(s.value for s in StartingOffsets)
STARTING_OFFSETS = Rule(
    f"self in {list(_NAMED_STARTS)} || self.matches(r'{_STARTING_JSON}')",
    lambda v: v in _NAMED_STARTS or re.search(_STARTING_JSON, v) is not None,
    "startingOffsets must be earliest, latest or a JSON object mapping topic -> partition -> "
    'offset, e.g. {"events":{"0":42,"1":-2}} (offsets are numbers: -2 earliest, -1 latest)',
)

#: Regex syntax that Java's and Python's engines read differently or only one of them knows:
#: lookbehind, named groups ((?<n>...) in Java, (?P<n>...) in Python), atomic groups,
#: possessive quantifiers, Unicode classes, \Q...\E quoting and other Java-only escapes,
#: class intersection, and a brace that opens no {n}, {n,} or {n,m} quantifier (Python reads
#: {,2} as {0,2} and a stray brace as itself; Java compiles neither, and topic names hold no
#: braces).
_UNPORTABLE_REGEX = (
    r"\(\?(<|P|>)|[*+?}]\+|\\[pPQEhHRXGKz]|&&"
    r"|\{([^0-9]|$)|\{[0-9]+([^0-9,}]|$)|\{[0-9]+,[0-9]*([^0-9}]|$)"
)
TOPIC_REGEX = Rule(
    f"!self.matches(r'{_UNPORTABLE_REGEX}')",
    lambda v: re.search(_UNPORTABLE_REGEX, v) is None,
    "topicPattern uses regex syntax that Java and Python read differently (lookbehind, named or "
    "atomic groups, possessive quantifiers, \\p{..}, \\Q..\\E, &&, a brace that is no {n,m} "
    "quantifier such as {,2}): use plain groups, classes, alternation and quantifiers",
)

#: Kafka client properties that hold secrets: they belong in the Secret of secretRef.
CREDENTIAL_PROPERTIES = (
    "sasl.password",
    "sasl.jaas.config",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.config",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl.keystore.password",
    "ssl.keystore.key",
    "ssl.truststore.password",
    "basic.auth.user.info",
)
_CREDENTIALS = [*CREDENTIAL_PROPERTIES, *(f"kafka.{name}" for name in CREDENTIAL_PROPERTIES)]


def cel_string(text: str) -> str:
    """``text`` as a CEL string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def refuse_keys(
    cel_refused: str, refused: Callable[[str], bool], message: str, *, before: str, after: str
) -> Rule:
    """A rule on a map of settings: no key that ``refused`` holds for (CEL: ``cel_refused``, a
    test of ``k``); the refusal names the first such key between ``before`` and ``after``.

    ``message`` is the refusal without the key (an API server too old for message
    expressions shows it).
    """

    def found(settings: dict[str, str]) -> list[str]:
        return [key for key in settings if refused(key)]

    return Rule(
        f"self.all(k, !({cel_refused}))",
        lambda v: not found(v),
        message,
        message_expression=f"{cel_string(before)} + self.filter(k, {cel_refused})[0] + "
        f"{cel_string(after)}",
        explain=lambda v: f"{before}{found(v)[0]}{after}",
    )


def refuse_credentials(
    cel_is_credential: str, is_credential: Callable[[str], bool], field: str, secret_field: str
) -> Rule:
    """A rule on a map of properties: no key that ``is_credential`` (CEL: the same test of
    ``k``, on the lower-cased name) holds; the message names the first such key, ``field``
    (the map's name) and ``secret_field`` (where credentials go)."""
    return refuse_keys(
        cel_is_credential,
        lambda key: is_credential(key.lower()),
        f"{field} must not hold credentials: put them in a Secret named by {secret_field}",
        before=f"{field}.",
        after=f" is a credential: put it in a Secret and name the Secret in {secret_field}",
    )


def refuse_owned(owned: OwnedKeys) -> Rule:
    """A rule on a map of settings: none of the keys eop owns there (see
    :mod:`eop_spark.contract.owned_settings`), the refusal naming the first one."""
    return refuse_keys(
        owned.cel_owns(),
        owned.owns,
        f"{owned.field} must not hold settings eop owns",
        before=f"{owned.field}: ",
        after=owned.reason,
    )


NO_CREDENTIALS = refuse_credentials(
    f"k.lowerAscii() in {_CREDENTIALS}", lambda k: k in _CREDENTIALS, "options", "secretRef"
)
_NO_CREDENTIALS_DOC = (
    " Credentials (" + ", ".join(CREDENTIAL_PROPERTIES) + ") are refused: they belong in the "
    "Secret of secretRef."
)
#: Client properties: bounded, so the API server's CEL cost estimate stays within budget.
ClientOptions = Annotated[dict[str, str], Field(max_length=100), NO_CREDENTIALS]
#: The source's and the sink's client properties: none of eop's own either.
SourceOptions = Annotated[ClientOptions, refuse_owned(SOURCE_OPTIONS)]
SinkOptions = Annotated[ClientOptions, refuse_owned(SINK_OPTIONS)]


def _owned_doc(owned: OwnedKeys) -> str:
    return f" Settings eop owns are refused: {owned.summary}."


def python_regex_error(pattern: str) -> str | None:
    """Why Python cannot compile ``pattern`` (the runner and the operator match with it)."""
    try:
        re.compile(pattern)
    except re.error as exc:
        return str(exc)
    return None


def _distinct_topics(topics: list[str]) -> list[str]:
    seen: set[str] = set()
    for index, topic in enumerate(topics):
        if topic in seen:
            raise ValueError(f"topics[{index}]: Duplicate value: {topic!r}")
        seen.add(topic)
    return topics


class KafkaSource(SpecModel):
    """Where the pipeline reads: Kafka topics, read with ``read_committed`` isolation."""

    one_of = (("topics", "topic_pattern"),)

    bootstrap_servers: Annotated[str, BOOTSTRAP_SERVERS] = Field(
        min_length=1,
        max_length=2000,
        description="Comma-separated host:port list of the source cluster (ports 1-65535).",
    )
    topics: Annotated[list[Topic], AfterValidator(_distinct_topics)] | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        # The API server refuses a list with a name twice (naming the entry).
        json_schema_extra={"x-kubernetes-list-type": "set"},
        description="Topics to read (Kafka topic names: letters, digits, '.', '_', '-'), each "
        "once.",
    )
    topic_pattern: Annotated[str, TOPIC_REGEX] | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description="Regex of topics to read instead of topics, matched against whole names. "
        "Internal topics (names starting with __) never match. Syntax that Java and Python "
        "read differently is refused (lookbehind, named or atomic groups, possessive "
        "quantifiers, \\p{..}, \\Q..\\E, &&).",
    )
    starting_offsets: Annotated[str, STARTING_OFFSETS] = Field(
        default=StartingOffsets.EARLIEST.value,
        max_length=10000,
        description=(
            "Where partitions never seen by the pipeline start: earliest, latest, or Spark's "
            'per-partition JSON such as {"events":{"0":42,"1":-2}} (-2 earliest, -1 latest; '
            "offsets are numbers, not strings; only topics the pipeline reads)."
        ),
    )
    max_offsets_per_trigger: int | None = Field(
        default=None, ge=1, description="Upper bound of records read per micro-batch."
    )
    options: SourceOptions = Field(
        default_factory=dict,
        description="Extra Kafka consumer properties (without the kafka. prefix)."
        + _NO_CREDENTIALS_DOC
        + _owned_doc(SOURCE_OPTIONS),
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

    @model_validator(mode="after")
    def _checks_cel_cannot_make(self) -> KafkaSource:
        # The API server can neither compile a regex nor parse JSON: these are refused by the
        # operator before a driver runs (and by eop run).
        if self.topic_pattern is not None:
            error = python_regex_error(self.topic_pattern)
            if error is not None:
                raise ValueError(
                    f"topicPattern {self.topic_pattern!r} is not a valid regex: {error}"
                )
        if self.starting_offsets not in _NAMED_STARTS:
            for topic in json.loads(self.starting_offsets):
                if not self.reads(topic):
                    raise ValueError(
                        f"startingOffsets names topic {topic!r}, which the pipeline does not "
                        "read (topics / topicPattern): its offsets would be ignored"
                    )
        return self

    def reads(self, topic: str) -> bool:
        """Whether ``topic`` is one the pipeline reads (listed, or matched by the pattern)."""
        if self.topics is not None:
            return topic in self.topics
        return re.fullmatch(self.subscribed_pattern or "(?!)", topic) is not None

    @property
    def subscribed_pattern(self) -> str | None:
        """``topicPattern`` as the clients match it: whole names, internal topics (``__``) never.

        Anchored: Spark's source (4.x, admin-based) keeps a topic when the regex is *found*
        in its name, where Kafka's consumer and the operator match whole names.
        """
        if self.topic_pattern is None:
            return None
        return f"^(?!__)(?:{self.topic_pattern})$"


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


class Durability(StrEnum):
    """What the runner does with a sink or progress topic replicated below the safe floor."""

    REFUSE = "refuse"
    WARN = "warn"


class KafkaSink(SpecModel):
    """Where the pipeline writes, transactionally."""

    bootstrap_servers: Annotated[str, BOOTSTRAP_SERVERS] = Field(
        min_length=1,
        max_length=2000,
        description="Comma-separated host:port list of the sink cluster (ports 1-65535).",
    )
    topic: Topic = Field(
        description="Output topic (a Kafka topic name: letters, digits, '.', '_', '-'); not one "
        "the source reads (source.kafka.topics or topicPattern) on the same Kafka cluster, "
        "however its brokers are written."
    )
    commit_mode: CommitMode = Field(
        default=CommitMode.AUTO,
        description="partitioned (record-wise queries), coordinated (any query), or auto.",
    )
    transaction_timeout: Annotated[Duration, at_least("transactionTimeout", "1s")] = Field(
        default=Duration("60s"),
        description="Kafka transaction.timeout.ms of the sink producers; at least 1s, at most "
        "the sink brokers' transaction.max.timeout.ms (15m unless the brokers set it).",
    )
    durability: Durability = Field(
        default=Durability.REFUSE,
        description="refuse (the runner does not start) or warn (it logs and starts) when, on a "
        "sink cluster of 2 or more brokers, the sink topic or a progress topic has a "
        "replication factor below min(3, brokers) or min.insync.replicas below 2.",
    )
    options: SinkOptions = Field(
        default_factory=dict,
        description=(
            "Extra Kafka producer properties, librdkafka's names. Partitioned mode's tasks use "
            "the Java producer with the names both clients share; a SASL/SSL property only "
            "librdkafka knows (other than the SASL user name and password) keeps them on "
            "librdkafka."
        )
        + _NO_CREDENTIALS_DOC
        + _owned_doc(SINK_OPTIONS),
    )
    secret_ref: SecretRef | None = Field(
        default=None,
        description="Secret with SASL/TLS client properties for the sink: " + SECRET_KEYS,
    )


class SinkSpec(SpecModel):
    """The pipeline's output."""

    kafka: KafkaSink


#: The micro-batch interval when trigger.processingTime is unset.
DEFAULT_TRIGGER_INTERVAL = Duration("10s")


class TriggerSpec(SpecModel):
    """When micro-batches run: every processingTime, or once over what is available."""

    at_most_one_of = (("processing_time", "available_now"),)

    processing_time: Annotated[Duration, at_least("trigger.processingTime", "1ms")] | None = Field(
        default=None,
        description="Micro-batch interval, e.g. 10s (default when nothing is set); more than 0.",
    )
    available_now: bool = Field(default=False, description="Process what is available, then stop.")

    @property
    def interval(self) -> Duration:
        """The micro-batch interval (10 s unless set)."""
        return self.processing_time or DEFAULT_TRIGGER_INTERVAL


#: Spark's memory notation as the spec takes it: a number and a unit, k, m, g or t.
SPARK_MEMORY_PATTERN = r"^[0-9]+[kmgt]$"
_SPARK_MEMORY_KIB = {"k": 1, "m": 1024, "g": 1024**2, "t": 1024**3}
#: The smallest heap the spec takes: Spark refuses a JVM with less than 450 MiB, and what a
#: JVM reports of its -Xmx is a little less than -Xmx.
MIN_SPARK_MEMORY = "512m"


def spark_memory_kib(memory: str) -> int:
    """A memory setting of :data:`SPARK_MEMORY_PATTERN` in KiB."""
    return int(memory[:-1]) * _SPARK_MEMORY_KIB[memory[-1]]


_CEL_SPARK_MEMORY_KIB = "{" + ", ".join(f"'{u}': {k}" for u, k in _SPARK_MEMORY_KIB.items()) + "}"
SPARK_MEMORY = Rule(
    f"!self.matches(r'{SPARK_MEMORY_PATTERN}') || int(self.substring(0, size(self) - 1)) * "
    f"{_CEL_SPARK_MEMORY_KIB}[self.substring(size(self) - 1)] >= "
    f"{spark_memory_kib(MIN_SPARK_MEMORY)}",
    lambda v: (
        re.fullmatch(SPARK_MEMORY_PATTERN, v) is None
        or spark_memory_kib(v) >= spark_memory_kib(MIN_SPARK_MEMORY)
    ),
    f"Spark memory must be at least {MIN_SPARK_MEMORY}: Spark refuses a smaller heap",
)


class ResourceSpec(SpecModel):
    """CPU and memory of a Spark process, as Kubernetes quantities."""

    cores: int = Field(default=1, ge=1, le=64, description="CPU cores.")
    memory: Annotated[str, SPARK_MEMORY] = Field(
        default="1g",
        # At most 9 digits: the API server's arithmetic on it stays within 64 bits.
        max_length=10,
        pattern=SPARK_MEMORY_PATTERN,
        description="JVM heap in Spark notation (k, m, g, t: 512m, not 512Mi), at least "
        f"{MIN_SPARK_MEMORY}, e.g. 1g.",
    )


class ExecutorSpec(ResourceSpec):
    """Kubernetes executors (used when master is k8s)."""

    instances: int = Field(default=1, ge=1, le=1000, description="Number of executors.")


def _on_kubernetes(master: str) -> bool:
    return master.startswith("k8s://")


#: Entries of spark.conf: bounded, so the API server's CEL cost estimate stays within budget.
MAX_SPARK_CONF = 200
#: The spark.conf entry the operator sizes executor pods by.
EXECUTOR_MEMORY_OVERHEAD = "spark.executor.memoryOverhead"
#: Spark's notation for a memory overhead: MiB, or a number and a unit (k, m, g, t, with or
#: without b, in either case: 384, 512m, 1gb).
SPARK_OVERHEAD_PATTERN = r"^[0-9]{1,9}([kKmMgGtT][bB]?)?$"
SPARK_OVERHEAD = Rule(
    f"!('{EXECUTOR_MEMORY_OVERHEAD}' in self) || "
    f"self['{EXECUTOR_MEMORY_OVERHEAD}'].matches(r'{SPARK_OVERHEAD_PATTERN}')",
    lambda conf: (
        EXECUTOR_MEMORY_OVERHEAD not in conf
        or re.fullmatch(SPARK_OVERHEAD_PATTERN, conf[EXECUTOR_MEMORY_OVERHEAD]) is not None
    ),
    f"{EXECUTOR_MEMORY_OVERHEAD} sizes the executor pods: MiB, or a number and k, m, g or t "
    "(e.g. 512m, 1g)",
)


#: What Spark itself takes for a secret in its settings (the default of spark.redaction.regex):
#: such a setting in spark.conf is a credential, and spark.conf is written to the pipeline's
#: ConfigMap.
SPARK_SECRET_REGEX = r"(?i)secret|password|token|access[.]key"
NO_SPARK_CREDENTIALS = refuse_keys(
    f"k.matches(r'{SPARK_SECRET_REGEX}')",
    lambda k: re.search(SPARK_SECRET_REGEX, k) is not None,
    "spark.conf must not hold credentials: it is written to the pipeline's ConfigMap",
    before="",
    after=" is a credential (Spark redacts it): spark.conf is written to the pipeline's "
    "ConfigMap; object storage keys belong in the Secret of checkpoint.secretRef",
)


class SparkSpec(SpecModel):
    """Spark settings of the driver (and executors when they run on Kubernetes)."""

    rules = (
        Rule(
            "!has(self.executor) || !has(self.executor.instances) || "
            "self.executor.instances == 1 || self.master.startsWith('k8s://')",
            lambda s: s.executor.instances == 1 or _on_kubernetes(s.master),
            "spark.executor.instances applies to a k8s:// master only: local[N] runs every task "
            "in the driver pod",
            field_path=".executor.instances",
        ),
    )

    master: str = Field(
        default="local[2]",
        pattern=r"^(local(\[([1-9][0-9]*|\*)\])?|k8s://.+)$",
        description="local[N] runs Spark inside the driver pod; k8s://... runs executors as pods.",
    )
    driver: ResourceSpec = Field(default_factory=ResourceSpec, description="Driver resources.")
    executor: ExecutorSpec = Field(
        default_factory=ExecutorSpec, description="Executor resources and count (k8s master)."
    )
    conf: Annotated[
        dict[str, str],
        Field(max_length=MAX_SPARK_CONF),
        refuse_owned(SPARK_CONF),
        NO_SPARK_CREDENTIALS,
        SPARK_OVERHEAD,
    ] = Field(
        default_factory=dict,
        description="Extra Spark configuration. Settings eop owns are refused (see "
        f"docs/security.md): {SPARK_CONF.summary}. So are credentials (names Spark redacts: "
        "secret, password, token, access.key): spark.conf is written to the pipeline's "
        "ConfigMap.",
    )

    @property
    def on_kubernetes(self) -> bool:
        """Whether executors run as Kubernetes pods."""
        return _on_kubernetes(self.master)
