"""Status decisions: phase, READY column and kstatus-compatible conditions."""

from __future__ import annotations

from eop_operator.api.models import Condition, ConditionStatus, Phase, PipelineStatus
from eop_operator.reconcile.status import DriverObservation, judge, status_patch

RUNNING = DriverObservation(desired=1, ready=1, rolled_out=True)
STARTING = DriverObservation(desired=1, ready=0, rolled_out=True)
ROLLING = DriverObservation(desired=1, ready=1, rolled_out=False)


def test_phases() -> None:
    assert judge(suspend=False, driver=None, error=None).phase is Phase.PENDING
    assert judge(suspend=False, driver=STARTING, error=None).phase is Phase.PENDING
    assert judge(suspend=False, driver=ROLLING, error=None).reason == "RollingOut"
    running = judge(suspend=False, driver=RUNNING, error=None)
    assert running.phase is Phase.RUNNING and running.ready and not running.progressing
    assert judge(suspend=True, driver=RUNNING, error=None).reason == "Suspending"
    assert judge(suspend=True, driver=STARTING, error=None).reason == "Suspended"
    invalid = judge(suspend=False, driver=RUNNING, error="bad sql")
    assert invalid.phase is Phase.INVALID and invalid.degraded and invalid.message == "bad sql"


def _conditions(patch: dict[str, object]) -> dict[str, dict[str, str]]:
    return {c["type"]: c for c in patch["conditions"]}  # type: ignore[attr-defined, index]


def test_conditions_are_kstatus_compatible() -> None:
    verdict = judge(suspend=False, driver=None, error="spec.image is not set")
    patch = status_patch(verdict, previous=PipelineStatus(), generation=3, ready="0/1", now="T1")
    conditions = _conditions(patch)
    assert patch["observedGeneration"] == 3
    assert conditions["Stalled"]["status"] == "True"
    assert conditions["Degraded"]["message"] == "spec.image is not set"
    assert conditions["Ready"]["status"] == "False"


def test_transition_time_moves_only_when_status_flips() -> None:
    previous = PipelineStatus(
        conditions=[
            Condition(type="Ready", status=ConditionStatus.TRUE, last_transition_time="T0"),
            Condition(type="Progressing", status=ConditionStatus.TRUE, last_transition_time="T0"),
        ]
    )
    verdict = judge(suspend=False, driver=RUNNING, error=None)
    conditions = _conditions(
        status_patch(verdict, previous=previous, generation=1, ready="1/1", now="T1")
    )
    assert conditions["Ready"]["lastTransitionTime"] == "T0"
    assert conditions["Progressing"]["lastTransitionTime"] == "T1"


def test_observation_from_statefulset() -> None:
    sts = {
        "metadata": {"generation": 2},
        "spec": {"replicas": 1},
        "status": {
            "observedGeneration": 2,
            "readyReplicas": 1,
            "currentRevision": "a",
            "updateRevision": "b",
        },
    }
    assert DriverObservation.from_statefulset(sts) == ROLLING
    sts["status"]["currentRevision"] = "b"  # type: ignore[index]
    assert DriverObservation.from_statefulset(sts) == RUNNING
