"""What the lifecycle writes to a pipeline's status: after a decision, or why it cannot run.

One write per step, through the status writer (``kube.status``): the
decision's record, the verdict on what was observed, and where and as whom
the driver runs, as one ``LifecyclePatch``.
"""

from __future__ import annotations

import datetime
from typing import Any

from pydantic import ValidationError

from eop_operator.api.models import CheckpointStatus, Phase, PipelineStatus
from eop_operator.api.status_patch import LifecyclePatch
from eop_operator.controller.context import Context
from eop_operator.controller.subject import Subject
from eop_operator.kube.events import post_event
from eop_operator.reconcile.admission import IdentityTaken
from eop_operator.reconcile.causes import Cause
from eop_operator.reconcile.decision import Decision
from eop_operator.reconcile.failover import stamp
from eop_operator.reconcile.status import (
    DriverObservation,
    failed_step,
    judge,
    lifecycle_verdict,
    ready_column,
    scale_status,
    verdict_status,
)
from eop_operator.render import checkpoint_root


async def write_status(
    context: Context,
    subject: Subject,
    decision: Decision,
    statefulset: dict[str, Any] | None,
    *,
    cause: Cause | None,
    refused: tuple[str, ...],
) -> None:
    """Write the decision's record, the verdict it leads to and what the driver runs as."""
    pipeline, record = subject.pipeline, decision.record
    previous = pipeline.status
    observation = DriverObservation.from_statefulset(statefulset) if statefulset else None
    given = record.model_fields_set
    in_flight = record.upgrade if "upgrade" in given else previous.upgrade
    message = (record.message if "message" in given else None) or previous.message or "upgrading"
    verdict = lifecycle_verdict(
        suspend=pipeline.spec.suspend,
        driver=observation,
        degraded=decision.degraded,
        upgrading=message if in_flight else None,
        cause=cause,
        refused=refused,
    )
    seen = verdict_status(
        verdict,
        previous=previous,
        generation=pipeline.metadata.generation,
        ready=ready_column(observation, suspend=pipeline.spec.suspend),
        now=stamp(datetime.datetime.now(datetime.UTC)),
        ratcheted=subject.ratcheted,
    )
    checkpoint = record.checkpoint if "checkpoint" in given else None
    generation = (checkpoint or previous.checkpoint or CheckpointStatus()).generation
    path = f"{checkpoint_root(pipeline).rstrip('/')}/gen-{generation}"
    patch = LifecyclePatch(
        **{
            **seen.given(),
            **scale_status(pipeline, observation).given(),
            **record.given(),
            "checkpoint": (checkpoint or CheckpointStatus()).model_copy(update={"path": path}),
            "transactional_id_prefix": subject.identity.transactional_id_prefix,
            "progress_group": subject.identity.progress_group,
            "commit_mode": pipeline.spec.sink.kafka.commit_mode.value,
        }
    )
    if verdict.phase is Phase.DEGRADED and previous.phase is not Phase.DEGRADED:
        await post_event(
            context.client, subject.body, type="Warning", reason="Degraded", message=verdict.message
        )
    await context.status.write(subject.body, patch)


def status_of(body: dict[str, Any]) -> PipelineStatus:
    """The pipeline's status as stored (an empty one when it does not validate)."""
    try:
        return PipelineStatus.model_validate(body.get("status") or {})
    except ValidationError:
        return PipelineStatus()


async def refuse(context: Context, body: dict[str, Any], exc: Exception) -> None:
    """Say why a pipeline cannot run: a Warning event and the status, once per generation.

    Nothing is created or changed for it (what is checked fails before anything is rendered).
    """
    previous = status_of(body)
    generation = body["metadata"].get("generation")
    said = [c.message for c in previous.conditions if c.type == "Ready"]
    if (previous.phase, previous.observed_generation, said) == (
        Phase.INVALID,
        generation,
        [str(exc)],
    ):
        return  # said already: every event of the pipeline comes here
    reason = "IdentityInUse" if isinstance(exc, IdentityTaken) else "InvalidSpec"
    await post_event(context.client, body, type="Warning", reason=reason, message=str(exc))
    patch = verdict_status(
        judge(suspend=False, driver=None, error=str(exc)),
        previous=previous,
        generation=generation,
        ready=ready_column(None, suspend=False),
        now=stamp(datetime.datetime.now(datetime.UTC)),
    )
    await context.status.write(body, patch)


#: The most of an error's text a status message or event carries.
MAX_FAILURE_MESSAGE = 600


def step_failure_message(exc: Exception) -> str:
    """What the status and the event say of a step that failed with ``exc``."""
    text = " ".join(str(exc).split())[:MAX_FAILURE_MESSAGE]
    return (
        f"the operator cannot take the pipeline's next step ({type(exc).__name__}: {text}); "
        "it tries again at every look"
    )


async def report_step_failure(context: Context, body: dict[str, Any], message: str) -> None:
    """Say that the operator's own step keeps failing (``message``: :func:`step_failure_message`):
    a Warning event ``ReconcileFailed`` and the status Degraded with the error, once per error (a
    step that succeeds writes the status it decides, which clears this)."""
    previous = status_of(body)
    said = [c.message for c in previous.conditions if c.type == "Ready"]
    if previous.phase is Phase.DEGRADED and said == [message]:
        return  # said already
    await post_event(
        context.client, body, type="Warning", reason="ReconcileFailed", message=message
    )
    patch = verdict_status(
        failed_step(message),
        previous=previous,
        generation=previous.observed_generation,
        ready=previous.ready or ready_column(None, suspend=False),
        now=stamp(datetime.datetime.now(datetime.UTC)),
    )
    await context.status.write(body, patch)
