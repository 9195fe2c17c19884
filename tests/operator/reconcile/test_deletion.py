"""What lets a pipeline being deleted go (``reconcile.deletion``): table tests, no API.

Each case is a stored pipeline (valid or not) and the deletion Job as found; the plan says
what is read, released or created, which events say what, and whether the pipeline is held.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from eop_operator.reconcile.deletion import (
    DELETION_POLL_SECONDS,
    EARLIER_JOB_SECONDS,
    UNREAD,
    DeletionPlan,
    plan_deletion,
)
from eop_operator.render.pod_policy import PodPolicy
from tests.operator.conftest import BASE_MANIFEST

JOB = "clean-checkpoint-delete"
ROOT = "s3a://bucket/p/ads/clean"


def _stored(checkpoint: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(BASE_MANIFEST)
    body["spec"].update(spec)
    if checkpoint is not None:
        body["spec"]["checkpoint"] = checkpoint
    return body


IN_STORAGE = {"uri": "s3a://bucket/p", "retention": "Delete"}
ON_A_CLAIM: dict[str, Any] = {}  # the default: a claim, retention Retain


def _job(*conditions: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    owner = owner or {"kind": "ExactlyOncePipeline", "name": "clean", "uid": "uid-1"}
    return {
        "metadata": {"name": JOB, "ownerReferences": [owner]},
        "status": {
            "conditions": [
                {"type": c, "status": "True", "reason": "BackoffLimitExceeded", "message": "x"}
                for c in conditions
            ]
        },
    }


def _plan(
    body: dict[str, Any], job: Any = UNREAD, image: str | None = "eop-spark:1", **policy: Any
) -> DeletionPlan:
    return plan_deletion(body, job, default_image=image, pod_policy=PodPolicy(**policy))


def _said(plan: DeletionPlan) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in plan.events]


@pytest.mark.parametrize(
    ("case", "plan", "expected"),
    [
        (
            "a claim, retention Delete: it goes with the pipeline",
            _plan(_stored({"retention": "Delete"})),
            {"events": [("Normal", "CheckpointDeleted")], "release_claim": None, "again_in": None},
        ),
        (
            "a claim, retention Retain: the pipeline's reference released, then it goes",
            _plan(_stored(ON_A_CLAIM)),
            {"events": [("Normal", "CheckpointRetained")], "release_claim": "clean-checkpoint"},
        ),
        (
            "a claim under a spec that no longer validates: retained (the safe side)",
            _plan(_stored({"retention": "Sometimes"}, transform="not a transform")),
            {"release_claim": "clean-checkpoint", "again_in": None},
        ),
        (
            "object storage under a spec that no longer validates: kept, said, it goes",
            _plan(_stored(IN_STORAGE, transform="not a transform")),
            {"events": [("Warning", "CheckpointRetained")], "read_job": None, "again_in": None},
        ),
        (
            "object storage, retention Retain: kept, it goes",
            _plan(_stored({"uri": "s3a://bucket/p"})),
            {"events": [("Normal", "CheckpointRetained")], "read_job": None},
        ),
        (
            "no image to run the Job with: kept, said, it goes",
            _plan(_stored(IN_STORAGE), image=None),
            {"events": [("Warning", "CheckpointRetained")], "read_job": None},
        ),
        (
            "a pod policy that forbids the Job: kept, said, it goes",
            _plan(_stored(IN_STORAGE, driver={"hostNetwork": True})),
            {"events": [("Warning", "CheckpointRetained")], "read_job": None},
        ),
        (
            "retention Delete: the Job is read first",
            _plan(_stored(IN_STORAGE)),
            {"read_job": JOB, "events": [], "create_job": None},
        ),
        (
            "no Job yet: created, said, the pipeline held while it runs",
            _plan(_stored(IN_STORAGE), None),
            {"events": [("Normal", "CheckpointDeleting")], "again_in": DELETION_POLL_SECONDS},
        ),
        (
            "its Job running: held, nothing said again",
            _plan(_stored(IN_STORAGE), _job()),
            {"events": [], "again_in": DELETION_POLL_SECONDS, "create_job": None},
        ),
        (
            "its Job complete: said, it goes",
            _plan(_stored(IN_STORAGE), _job("Complete")),
            {"events": [("Normal", "CheckpointDeleted")], "again_in": None},
        ),
        (
            "its Job failed after its retries: kept, said, it goes",
            _plan(_stored(IN_STORAGE), _job("Failed")),
            {"events": [("Warning", "CheckpointDeletionFailed")], "again_in": None},
        ),
        (
            "an earlier pipeline's Job of the name: held until the collector takes it",
            _plan(
                _stored(IN_STORAGE),
                _job(owner={"kind": "ExactlyOncePipeline", "name": "clean", "uid": "uid-0"}),
            ),
            {"events": [], "again_in": EARLIER_JOB_SECONDS, "create_job": None},
        ),
        (
            "someone else's Job of the name: left alone, kept, said, it goes",
            _plan(_stored(IN_STORAGE), _job(owner={"kind": "CronJob", "name": "x", "uid": "u9"})),
            {"events": [("Warning", "CheckpointRetained")], "again_in": None, "create_job": None},
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_deletion_plan(case: str, plan: DeletionPlan, expected: dict[str, Any]) -> None:
    got = {key: (_said(plan) if key == "events" else getattr(plan, key)) for key in expected}
    assert got == expected, case


def test_the_deletion_job_runs_the_pipelines_image_on_its_checkpoint_and_is_owned_by_it() -> None:
    plan = _plan(_stored(IN_STORAGE, image="eop-spark:7"), None)
    job = plan.create_job
    assert job is not None and job["kind"] == "Job" and job["metadata"]["name"] == JOB
    (owner,) = job["metadata"]["ownerReferences"]
    assert owner["uid"] == "uid-1"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "eop-spark:7" and ROOT in container["args"]
    assert plan.checkpoint == ROOT and ROOT in plan.events[0].message


def test_a_failed_jobs_event_says_why_and_how_to_delete_the_checkpoint_by_hand() -> None:
    (event,) = _plan(_stored(IN_STORAGE), _job("Failed")).events
    assert "BackoffLimitExceeded" in event.message
    assert f"eop checkpoint delete {ROOT}" in event.message
