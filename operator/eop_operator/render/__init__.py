"""Pure rendering: a validated pipeline -> the Kubernetes objects that run it.

No I/O here.  ``eop render`` prints what :func:`render_pipeline` returns and the
operator applies the same objects, so what a reviewer sees is what runs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from eop_operator.api.models import ExactlyOncePipeline
from eop_operator.api.resolve import Identity, build_run_config
from eop_operator.render.driver import (
    CHECKPOINT_MOUNT,
    default_driver_ports,
    driver_spark_conf,
    render_driver_service,
    render_driver_statefulset,
    render_pod_template,
)
from eop_operator.render.executors import (
    EXECUTOR_TEMPLATE_KEY,
    RPC_KEY_BYTES,
    executor_template_yaml,
    render_executor_template,
    render_rpc_secret,
)
from eop_operator.render.naming import SPEC_HASH_ANNOTATION
from eop_operator.render.pods import secret_dir
from eop_operator.render.ports import driver_ports
from eop_operator.render.rbac import DEFAULT_DRIVER_ROLE, DriverRole, render_driver_rbac
from eop_operator.render.storage import render_checkpoint_claim, render_config_map
from eop_spark.contract.run_config import RunConfig


class MissingImage(ValueError):
    """Neither the pipeline nor the operator names a Spark application image."""


@dataclass(frozen=True)
class RenderedPipeline:
    """Everything the operator applies for one pipeline, in apply order."""

    run_config: RunConfig
    spec_hash: str
    objects: list[dict[str, Any]] = field(default_factory=list)
    #: Whether the pipeline's RPC key Secret must exist (executors on Kubernetes): the
    #: operator creates it once (:func:`rpc_secret`), never applies it again.
    needs_rpc_secret: bool = False


def checkpoint_root(pipeline: ExactlyOncePipeline) -> str:
    """Directory or URI holding every checkpoint generation of the pipeline."""
    uri = pipeline.spec.checkpoint.uri
    if uri is not None:
        return f"{uri.rstrip('/')}/{pipeline.metadata.namespace}/{pipeline.metadata.name}"
    return CHECKPOINT_MOUNT


def spec_hash(*parts: Any) -> str:
    """A short, stable hash of what the driver pod runs; a change restarts the driver."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def render_pipeline(
    pipeline: ExactlyOncePipeline,
    *,
    default_image: str | None,
    generation: int,
    metrics_host_port: int | None = None,
    reset_progress: bool = False,
    driver_role: DriverRole = DEFAULT_DRIVER_ROLE,
    identity: Identity | None = None,
) -> RenderedPipeline:
    """Render the ConfigMap, PVC, driver RBAC, Service and StatefulSet of a pipeline.

    ``metrics_host_port``: the port the operator assigned to a host-network driver
    (``render.ports.choose_host_port``); unset, the one derived from the pipeline's identity.
    ``reset_progress`` marks a stateless generation (see
    ``eop_spark.exactly_once.stateless_reset``).
    ``driver_role``: the pre-made role a driver with executors on Kubernetes is bound to.
    ``identity``: the pipeline's Kafka identity, when the caller has resolved it already.
    """
    image = pipeline.spec.image or default_image
    if not image:
        raise MissingImage(
            "spec.image is not set and the operator has no default image (--default-image)"
        )
    if metrics_host_port is None:
        ports = default_driver_ports(pipeline)
    else:
        ports = driver_ports(
            host_network=pipeline.spec.driver.host_network, metrics_host_port=metrics_host_port
        )
    run_config = build_run_config(
        pipeline,
        checkpoint_root=checkpoint_root(pipeline),
        generation=generation,
        source_secret_dir=secret_dir("source") if pipeline.spec.source.kafka.secret_ref else None,
        sink_secret_dir=secret_dir("sink") if pipeline.spec.sink.kafka.secret_ref else None,
        metrics_port=ports.metrics,
        extra_spark_conf=driver_spark_conf(pipeline, image, ports),
        reset_progress=reset_progress,
        identity=identity,
    )
    files: dict[str, str] = {}
    if pipeline.spec.spark.on_kubernetes:
        files[EXECUTOR_TEMPLATE_KEY] = executor_template_yaml(
            render_executor_template(pipeline, image)
        )
    config_map = render_config_map(pipeline, run_config, files)
    template = render_pod_template(pipeline, image, generation, ports)
    digest = spec_hash(config_map["data"], template)
    # For a new generation's guards (eop_spark.exactly_once.generation_guards): what the operator
    # saw G hold (status.progress.heldPartitions) and what started the generation (the upgrade
    # in flight).
    # In the ConfigMap but not in the hash: a status change never restarts a running driver;
    # a driver reads them when it starts.
    status = pipeline.status
    guards: dict[str, Any] = {}
    if status.progress and status.progress.held_partitions:
        guards["committed_partitions"] = status.progress.held_partitions
    if status.upgrade and status.upgrade.generation == generation:
        guards["generation_reason"] = status.upgrade.reason
    if guards:
        run_config = run_config.model_copy(update=guards)
        config_map = render_config_map(pipeline, run_config, files)
    template["metadata"]["annotations"][SPEC_HASH_ANNOTATION] = digest
    claim = render_checkpoint_claim(pipeline)
    objects = [config_map, *([claim] if claim else []), *render_driver_rbac(pipeline, driver_role)]
    objects += [
        render_driver_service(pipeline, ports),
        render_driver_statefulset(pipeline, template),
    ]
    return RenderedPipeline(
        run_config=run_config,
        spec_hash=digest,
        objects=objects,
        needs_rpc_secret=pipeline.spec.spark.on_kubernetes,
    )


def rpc_secret(pipeline: ExactlyOncePipeline, key: bytes) -> dict[str, Any]:
    """The RPC key Secret of a pipeline with executors on Kubernetes, holding ``key``.

    ``key`` must be random (:data:`RPC_KEY_BYTES` of ``secrets.token_bytes``): the caller
    draws it, so rendering stays a pure function.
    """
    if len(key) < RPC_KEY_BYTES:
        raise ValueError(f"an RPC key needs at least {RPC_KEY_BYTES} bytes")
    return render_rpc_secret(pipeline, key)
