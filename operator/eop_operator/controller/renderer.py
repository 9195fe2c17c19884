"""How the lifecycle renders a pipeline: admission first, then ``render_pipeline`` with the options.

What only the operator can check (a shipped transform that exists, an
identity no older pipeline holds, the pod policy, a free metrics host port)
is refused before anything is rendered, so nothing is created or changed for
such a pipeline (``controller.lifecycle_status.refuse`` says why).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from eop_operator.api.load import InvalidPipeline
from eop_operator.api.models import ExactlyOncePipeline
from eop_operator.api.resolve import Identity
from eop_operator.controller.context import OperatorOptions
from eop_operator.controller.step import Renderer
from eop_operator.reconcile.admission import (
    Claimant,
    IdentityTaken,
    identity_conflict,
    identity_keys,
    shipped_transform_problem,
)
from eop_operator.render import RenderedPipeline, render_pipeline
from eop_operator.render.pod_policy import check_pod_policy
from eop_operator.render.ports import assign_metrics_host_port


def admit(
    pipeline: ExactlyOncePipeline,
    identity: Identity,
    held: Mapping[str, Iterable[list[Claimant]]],
) -> None:
    """Refuse what only the operator can check: a missing shipped transform, a taken identity.

    ``held``: per identity key, the pipelines that claim it (``claimed_identities``).
    """
    problem = shipped_transform_problem(pipeline)
    if problem is not None:
        raise InvalidPipeline(problem)
    meta = pipeline.metadata
    me = Claimant(meta.creation_timestamp or "", meta.namespace, meta.name)
    keys = [key for key in identity_keys(identity) if key in held]  # not the whole index
    holders = {key: [c for value in held[key] for c in value] for key in keys}
    conflict = identity_conflict(identity, me, holders)
    if conflict is not None:
        raise IdentityTaken(conflict)


def renderer(
    options: OperatorOptions,
    host_ports: Mapping[str, Iterable[list[int]]],
    identities: Mapping[str, Iterable[list[Claimant]]],
) -> Renderer:
    """Render with the operator's options, after :func:`admit` and the pod policy.

    ``host_ports``: per pipeline id, the metrics host port its driver holds;
    ``identities``: the claimed identities (both kopf indices).
    """

    def render(
        pipeline: ExactlyOncePipeline, identity: Identity, generation: int, reset: bool
    ) -> RenderedPipeline:
        admit(pipeline, identity, identities)
        check_pod_policy(pipeline, options.pod_policy)  # an InvalidPipeline: no driver
        port = None
        if pipeline.spec.driver.host_network:
            ports = {key: [p for value in host_ports[key] for p in value] for key in host_ports}
            port = assign_metrics_host_port(pipeline.pipeline_id, options.host_ports, ports)
        return render_pipeline(
            pipeline,
            default_image=options.default_image,
            generation=generation,
            metrics_host_port=port,
            reset_progress=reset,
            driver_role=options.driver_role,
            identity=identity,
        )

    return render
