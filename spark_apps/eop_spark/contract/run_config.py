"""The resolved run configuration: everything one runner process needs.

The operator renders it into the driver's ConfigMap; ``eop run PIPELINE.yaml``
resolves it from a manifest on a laptop.  Either way the runner reads only this.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError

from eop_spark.contract.errors import ConfigError
from eop_spark.contract.spec import (
    SinkSpec,
    SourceSpec,
    SparkSpec,
    SpecModel,
    TransformSpec,
    TriggerSpec,
)

#: Where the operator mounts the run configuration in the driver pod.
CONFIG_FILE_NAME = "run.json"
#: A directory only this driver uses, set by the operator in the driver pod.  It lives on
#: the pod's emptyDir, which outlives a killed container (see
#: :func:`eop_spark.runtime.session.prepare_scratch`).
SCRATCH_ENV = "EOP_SCRATCH_DIR"


def pipeline_id(namespace: str, name: str) -> str:
    """The pipeline identity ``P`` = ``<namespace>.<name>`` (see docs/exactly-once.md)."""
    return f"{namespace}.{name}"


def progress_group(pipeline: str) -> str:
    """The progress group ``G`` = ``eop.<P>``: committed only inside sink transactions."""
    return f"eop.{pipeline}"


def default_transactional_id_prefix(pipeline: str) -> str:
    """The default transactional id prefix ``eop.<P>``."""
    return f"eop.{pipeline}"


class ResolvedSpark(SparkSpec):
    """``spec.spark`` as a runner gets it: ``conf`` holds eop's own settings too.

    The operator adds them (ports, the executor pod template, RPC security) to the
    spec's, which may hold none (see :mod:`eop_spark.contract.owned_settings`).
    """

    conf: dict[str, str] = Field(
        default_factory=dict, description="Spark settings: the spec's, then eop's own."
    )


class RunConfig(SpecModel):
    """One pipeline run, fully resolved (no defaults left to guess)."""

    pipeline: str = Field(min_length=3, description="Pipeline identity <namespace>.<name>.")
    source: SourceSpec
    transform: TransformSpec
    sink: SinkSpec
    trigger: TriggerSpec = Field(default_factory=TriggerSpec)
    spark: ResolvedSpark = Field(default_factory=ResolvedSpark)
    transactional_id_prefix: str = Field(min_length=1)
    progress_group: str = Field(min_length=1)
    checkpoint_root: str = Field(min_length=1, description="Directory or URI of all generations.")
    generation: int = Field(default=0, ge=0, description="Checkpoint generation k.")
    source_secret_dir: str | None = Field(
        default=None, description="Directory of a mounted Secret: one Kafka property per file."
    )
    sink_secret_dir: str | None = None
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    committed_partitions: dict[str, list[int]] | None = Field(
        default=None,
        description="Per source topic, the partitions the operator saw the progress group hold: "
        "a new generation refuses to start one that the group lacks (see "
        "eop_spark.exactly_once.generation_guards).",
    )
    generation_reason: str | None = Field(
        default=None,
        description="What started this checkpoint generation (the operator's status.upgrade."
        "reason: SpecChanged, RestartNonce, RolledBack, FellBack, CheckpointRecovery, "
        "CheckpointLost); named when a new generation is refused.",
    )
    reset_progress: bool | None = Field(
        default=None,
        description="A stateless generation: before its first batch, set the progress group "
        "to startingOffsets (see eop_spark.exactly_once.stateless_reset).",
    )

    @property
    def checkpoint_location(self) -> str:
        """The Spark checkpoint of this generation: ``<root>/gen-<k>``."""
        return f"{self.checkpoint_root.rstrip('/')}/gen-{self.generation}"

    def on_brokers(self, bootstrap_servers: str) -> RunConfig:
        """This run with ``bootstrap_servers`` for both source and sink.

        ``eop run --bootstrap-servers``: a manifest written for a cluster, run
        against a broker on a laptop.
        """
        source = self.source.model_copy(
            update={
                "kafka": self.source.kafka.model_copy(
                    update={"bootstrap_servers": bootstrap_servers}
                )
            }
        )
        sink = self.sink.model_copy(
            update={
                "kafka": self.sink.kafka.model_copy(update={"bootstrap_servers": bootstrap_servers})
            }
        )
        return self.model_copy(update={"source": source, "sink": sink})

    def overridden(
        self, *, checkpoint_root: str | None = None, generation: int | None = None
    ) -> RunConfig:
        """This run with the command line's ``--checkpoint-root`` and ``--generation``.

        Checked as a run config read from a file is (pydantic's ValidationError
        otherwise): the one rule of ``eop run`` and ``python -m eop_spark run``.
        """
        overrides: dict[str, object] = {}
        if checkpoint_root is not None:
            overrides["checkpoint_root"] = checkpoint_root
        if generation is not None:
            overrides["generation"] = generation
        if not overrides:
            return self
        return RunConfig.model_validate(self.model_dump() | overrides)

    @classmethod
    def offline(cls, pipeline: str, checkpoint_root: str, sql: str) -> RunConfig:
        """A run config for tools that need only its Spark session: its Kafka is unreachable."""
        nowhere = "127.0.0.1:9"  # the discard port: nothing listens there
        return cls.model_validate(
            {
                "pipeline": pipeline,
                "source": {"kafka": {"bootstrapServers": nowhere, "topics": ["none"]}},
                "transform": {"sql": sql},
                "sink": {"kafka": {"bootstrapServers": nowhere, "topic": "none"}},
                "transactionalIdPrefix": pipeline,
                "progressGroup": pipeline,
                "checkpointRoot": checkpoint_root,
            }
        )

    @classmethod
    def from_file(cls, path: Path) -> RunConfig:
        """Read a run configuration written by the operator or by ``eop run``."""
        return cls.model_validate_json(path.read_text())


def invalid_run_config(origin: Path, error: ValidationError) -> ConfigError:
    """One line naming each setting of the run config from ``origin`` that ``error`` refuses."""
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: "
        f"{e['msg'].removeprefix('Value error, ')}"
        for e in error.errors()
    )
    return ConfigError(f"invalid run config {origin}: {problems}")


def load_run_config(
    path: Path, *, checkpoint_root: str | None = None, generation: int | None = None
) -> RunConfig:
    """Read the run config at ``path`` and apply the command line's overrides.

    Both entries to a run (``eop run --config`` in the image, ``python -m
    eop_spark run``) read it here.  Raises :class:`ConfigError` (one line).
    """
    try:
        config = RunConfig.from_file(path)
        return config.overridden(checkpoint_root=checkpoint_root, generation=generation)
    except OSError as exc:
        raise ConfigError(f"cannot read run config {path}: {exc.strerror or exc}") from exc
    except ValidationError as exc:
        raise invalid_run_config(path, exc) from exc
