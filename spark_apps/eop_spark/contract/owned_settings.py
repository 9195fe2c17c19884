"""Settings eop owns: a spec may not set them, and eop's values win should one slip through.

A spec carries free-form settings in three places: ``spark.conf``, ``source.kafka.options``
and ``sink.kafka.options``. Some of their names are eop's: a typed field says the same
(``spark.master``, ``spark.driver.memory``, ``bootstrap.servers``), or exactly-once and the
trust model depend on eop's value (transactions, ``read_committed``, RPC authentication and
encryption, the pod template, the checkpoint). Each place has one list here, used by

* the API server and ``eop run``, which refuse such a key naming it (the rules built in
  :mod:`eop_spark.contract.spec`);
* the operator, which leaves them out of the Spark settings it renders (``api.resolve``);
* the runner, which refuses them in Kafka options and puts its own Spark values over
  ``spark.conf`` (``kafka.client_config``, ``runtime.session``).

Each list is one regular expression that RE2 (CEL's ``matches``) and Python read alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class OwnedKeys:
    """The names eop owns in one map of settings of a spec."""

    #: Where the map is in the spec, as a refusal names it (``spark.conf``).
    field: str
    #: An anchored regex of the owned names (on the lower-cased name when ``any_case``).
    regex: str
    #: Why, as the refusal says it after the key.
    reason: str
    #: The owned names as the API reference lists them.
    summary: str
    #: Whether the names are matched in any case (Kafka's clients: refuse ``ACKS`` too).
    any_case: bool = False

    def owns(self, key: str) -> bool:
        """Whether ``key`` is one of eop's."""
        return re.search(self.regex, key.lower() if self.any_case else key) is not None

    def cel_owns(self, var: str = "k") -> str:
        """The CEL test of :meth:`owns` on the string ``var``."""
        subject = f"{var}.lowerAscii()" if self.any_case else var
        return f"{subject}.matches(r'{self.regex}')"

    def refusal(self, key: str, where: str | None = None) -> str:
        """What the API server and ``eop run`` say of ``key`` (found in ``where``, else the
        spec's :attr:`field`)."""
        return f"{where or self.field}: {key}{self.reason}"


#: How every refusal of an owned setting goes on after its key.
_OWNED = " is set by eop and cannot be overridden: "


def _one_of(names: tuple[str, ...], prefix: str = "") -> str:
    return f"^{prefix}({'|'.join(names)})$"


#: What eop sets in the Spark session of every driver (``runtime.session``, ``render.driver``,
#: ``render.executors``), and settings that would undo its RPC security or its checkpoint.
_SPARK_CONF_OWNED = (
    # Typed fields say these: spark.master, spark.driver, spark.executor, image, executor.
    r"spark\.master",
    r"spark\.submit\.deployMode",
    r"spark\.(driver|executor)\.(memory|cores)",
    r"spark\.executor\.instances",
    r"spark\.kubernetes\.(driver|executor)\.(request|limit)\.cores",
    r"spark\.kubernetes\.((driver|executor)\.)?container\.image(\.pullPolicy)?",
    # The pods eop renders: their namespace, names, template, volumes and accounts.
    r"spark\.kubernetes\.namespace",
    r"spark\.kubernetes\.driver\.pod\.name",
    r"spark\.kubernetes\.(driver|executor)\.podTemplate(File|ContainerName)",
    r"spark\.kubernetes\.(driver|executor)\.volumes\..+",
    # How the driver reaches the API server. Executors' ServiceAccount stays the spec's
    # (executor.serviceAccountName, e.g. for web identity in object storage): the same power
    # as spec.serviceAccountName, and their pods get no API token.
    r"spark\.kubernetes\.authenticate\.((driver|submission)\..+|[^.]+)",
    # The driver's addresses and ports (loopback in local mode; the Service's ports).
    r"spark\.driver\.(host|bindAddress|port|blockManager\.port)",
    r"spark\.blockManager\.port",
    r"spark\.ui\.(port|killEnabled)",
    # RPC authentication and encryption, TLS, encrypted shuffle and spill files.
    r"spark\.authenticate(\..+)?",
    r"spark\.network\.crypto\..+",
    r"spark\.io\.encryption\.enabled",
    r"spark\.ssl\..+",
    # Each checkpoint generation's location is the runner's.
    r"(spark\.sql\.streaming\.)?checkpointLocation",
)

SPARK_CONF = OwnedKeys(
    field="spark.conf",
    regex=_one_of(_SPARK_CONF_OWNED),
    reason=_OWNED + "use the spec's fields (spark.master, "
    "spark.driver, spark.executor, image, driver, executor, checkpoint); RPC security, TLS, "
    "ports, pod templates, volumes and the checkpoint location stay eop's",
    summary="spark.master, spark.submit.deployMode, spark.{driver,executor}.{memory,cores}, "
    "spark.executor.instances, spark.kubernetes.{driver,executor}.{request,limit}.cores, "
    "spark.kubernetes.[{driver,executor}.]container.image[.pullPolicy], "
    "spark.kubernetes.namespace, spark.kubernetes.driver.pod.name, "
    "spark.kubernetes.{driver,executor}.podTemplate{File,ContainerName}, "
    "spark.kubernetes.{driver,executor}.volumes.*, spark.kubernetes.authenticate.* "
    "(but executor.serviceAccountName), "
    "spark.driver.{host,bindAddress,port,blockManager.port}, spark.blockManager.port, "
    "spark.ui.{port,killEnabled}, spark.authenticate[.*], spark.network.crypto.*, "
    "spark.io.encryption.enabled, spark.ssl.*, [spark.sql.streaming.]checkpointLocation",
)


def _kafka_options(names: tuple[str, ...], why: str) -> OwnedKeys:
    """Kafka client properties eop owns in a side's options: ``names`` (regexes), with or
    without the ``kafka.`` prefix Spark uses, in any case."""
    return OwnedKeys(
        field="options",
        regex=_one_of(names, r"(kafka\.)?"),
        reason=_OWNED + why,
        summary=", ".join(name.replace("\\", "") for name in names)
        + " (also kafka.<name>, any case)",
        any_case=True,
    )


#: What the runner sets on the source's consumers: its cluster, read_committed, no group of
#: their own (progress lives in the sink's transactions), where a new partition starts.
SOURCE_OPTIONS = _kafka_options(
    (
        r"bootstrap\.servers",
        r"isolation\.level",
        r"auto\.offset\.reset",
        r"group\.id",
        r"enable\.auto\.commit",
    ),
    "the source reads bootstrapServers with read_committed isolation, from startingOffsets or "
    "the progress group, never committing offsets of its own",
)

#: What the runner sets on the sink's transactional producers (and G's reader on that cluster).
SINK_OPTIONS = _kafka_options(
    (
        r"bootstrap\.servers",
        r"transactional\.id",
        r"enable\.idempotence",
        r"acks",
        r"transaction\.timeout\.ms",
        r"isolation\.level",
    ),
    "the sink writes to bootstrapServers with idempotent transactional producers (acks=all) "
    "whose ids fence older ones; set transactionTimeout for transaction.timeout.ms",
)

#: Spark settings that make the RPC between driver and executors authenticated and encrypted
#: (``render.executors`` adds the key's file; the runner keeps them with a k8s:// master).
RPC_SECURITY_CONF = {
    "spark.authenticate": "true",
    "spark.network.crypto.enabled": "true",
    # AES-GCM: authenticated encryption, so tampering on the wire fails the message (Spark's
    # default, AES-CTR, only hides it). Before Spark 4.2.0 GCM lost every message after a
    # channel's first (SPARK-56227); tests/spark_apps/runtime/test_rpc_security.py runs it.
    "spark.network.crypto.cipher": "AES/GCM/NoPadding",
    # Version 2 derives the session keys as the protocol's fix for version 1 does.
    "spark.network.crypto.authEngineVersion": "2",
    # No downgrade to SASL DIGEST-MD5 for a peer that does not speak AES.
    "spark.network.crypto.saslFallback": "false",
    # Shuffle and spill files on the executors' emptyDirs (the nodes' disks) are encrypted too,
    # with a key the driver hands its executors over the RPC above.
    "spark.io.encryption.enabled": "true",
}
