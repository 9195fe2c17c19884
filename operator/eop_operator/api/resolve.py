"""Resolve a pipeline into its identity and the run configuration its driver reads.

The identity (transactional id prefix, progress group) is fixed the first time
the operator sees a pipeline and recorded in status; later specs are checked
against it, because a changed prefix would stop fencing older producers.
"""

from __future__ import annotations

from dataclasses import dataclass

from eop_operator.api.models import ExactlyOncePipeline
from eop_spark.contract.owned_settings import SPARK_CONF
from eop_spark.contract.run_config import (
    ResolvedSpark,
    RunConfig,
    default_transactional_id_prefix,
    progress_group,
)


class IdentityChanged(ValueError):
    """The spec asks for a transactional id prefix other than the one in use."""


@dataclass(frozen=True)
class Identity:
    """The Kafka identity of a pipeline: never changes over its life."""

    transactional_id_prefix: str
    progress_group: str


def resolve_identity(pipeline: ExactlyOncePipeline) -> Identity:
    """The identity in use: the recorded one, else the spec's or the default.

    Raises :class:`IdentityChanged` when the spec's ``transactions.idPrefix``
    disagrees with the prefix recorded in status (the CRD's CEL rule blocks
    edits of a set prefix; this also catches setting one after the fact).
    """
    wanted = pipeline.spec.transactions.id_prefix or default_transactional_id_prefix(
        pipeline.pipeline_id
    )
    recorded = pipeline.status.transactional_id_prefix
    if recorded is not None and recorded != wanted:
        raise IdentityChanged(
            f"transactions.idPrefix {wanted!r} differs from the prefix in use {recorded!r}; "
            "it cannot change (older producers would no longer be fenced)"
        )
    return Identity(
        transactional_id_prefix=wanted,
        progress_group=pipeline.status.progress_group or progress_group(pipeline.pipeline_id),
    )


def build_run_config(
    pipeline: ExactlyOncePipeline,
    *,
    checkpoint_root: str,
    generation: int,
    source_secret_dir: str | None = None,
    sink_secret_dir: str | None = None,
    metrics_port: int | None = None,
    extra_spark_conf: dict[str, str] | None = None,
    reset_progress: bool = False,
    identity: Identity | None = None,
) -> RunConfig:
    """Resolve a pipeline into the configuration one runner process reads.

    ``identity``: the pipeline's, when the caller has resolved it already.
    """
    identity = identity or resolve_identity(pipeline)
    spark = pipeline.spec.spark
    # The object store's settings reach Hadoop as spark.hadoop.*; the user's spark.conf wins,
    # except for the settings eop owns (the API server refuses them; should one slip through,
    # eop's value holds, or none).
    store = {f"spark.hadoop.{k}": v for k, v in pipeline.spec.checkpoint.options.items()}
    user = {k: v for k, v in spark.conf.items() if not SPARK_CONF.owns(k)}
    conf = {**store, **(extra_spark_conf or {}), **user}
    return RunConfig(
        pipeline=pipeline.pipeline_id,
        source=pipeline.spec.source,
        transform=pipeline.spec.transform,
        sink=pipeline.spec.sink,
        trigger=pipeline.spec.trigger,
        spark=ResolvedSpark(**{**dict(spark), "conf": conf}),
        transactional_id_prefix=identity.transactional_id_prefix,
        progress_group=identity.progress_group,
        checkpoint_root=checkpoint_root,
        generation=generation,
        source_secret_dir=source_secret_dir,
        sink_secret_dir=sink_secret_dir,
        metrics_port=metrics_port,
        # Only written when set, so run.json (and the spec hash) of other generations is unchanged.
        reset_progress=True if reset_progress else None,
    )
