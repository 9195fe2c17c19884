"""Status decisions: phase, READY column, kstatus-compatible conditions, and the causes."""

from __future__ import annotations

import datetime
from typing import Any

from eop_operator.api.load import load_pipeline
from eop_operator.api.models import Condition, ConditionStatus, Phase, PipelineStatus
from eop_operator.api.status_patch import StatusPatch, merge_patch
from eop_operator.reconcile.causes import Cause, diagnose
from eop_operator.reconcile.children import NotOwned
from eop_operator.reconcile.decision import Degradation
from eop_operator.reconcile.observe import ClaimState, DriverState, WarningEvent
from eop_operator.reconcile.status import (
    DriverObservation,
    judge,
    lifecycle_verdict,
    scale_status,
    verdict_status,
)

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


def written(patch: StatusPatch, current: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the operator sends for ``patch`` to a status that holds ``current``."""
    return merge_patch(patch, current or {})


def status_patch(verdict: Any, **kwargs: Any) -> dict[str, Any]:
    return written(verdict_status(verdict, **kwargs))


def _conditions(patch: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {c["type"]: c for c in patch["conditions"]}


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


def test_scale_status_reports_the_executors_of_the_ready_driver(manifest: dict[str, Any]) -> None:
    """What `kubectl get eop -o wide`, the /scale subresource and an autoscaler read."""
    sts = {
        "metadata": {"generation": 3},
        "spec": {
            "replicas": 1,
            "template": {"metadata": {"annotations": {"exactlyonce.io/executors": "4"}}},
        },
        "status": {"observedGeneration": 3, "readyReplicas": 1, "currentRevision": "a"},
    }
    manifest["spec"]["spark"] = {"master": "k8s://https://kubernetes.default.svc"}
    pipeline = load_pipeline(manifest)
    selector = "app.kubernetes.io/name=eop-executor,app.kubernetes.io/instance=clean,"
    selector += "app.kubernetes.io/component=executor,exactlyonce.io/pipeline=clean"
    running = DriverObservation.from_statefulset(sts)
    assert written(scale_status(pipeline, running)) == {
        "executors": 4,
        "executorSelector": selector,
    }
    # A driver being rolled out with a new count, or not Ready yet, runs none of them.
    sts["status"]["updateRevision"] = "b"  # type: ignore[index]
    rolling = DriverObservation.from_statefulset(sts)
    assert scale_status(pipeline, rolling).executors == 0
    assert scale_status(pipeline, None).executors == 0
    # Local mode: nothing to scale, both fields removed.
    manifest["spec"]["spark"] = {"master": "local[2]"}
    local = load_pipeline(manifest)
    before = {"executors": 4, "executorSelector": selector}
    assert written(scale_status(local, RUNNING), before) == {
        "executors": None,
        "executorSelector": None,
    }


NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
STS_UID = "sts-uid"


def driver_pod(**status: Any) -> dict[str, Any]:
    """A driver pod as the API server shows it, with the given status fields."""
    return {"metadata": {"name": "p-driver-0", "uid": "pod-uid"}, "status": status}


def container(**fields: Any) -> dict[str, Any]:
    return {"containerStatuses": [{"name": "driver", "restartCount": 0, **fields}]}


def warning(kind: str, uid: str, reason: str, message: str, name: str = "") -> WarningEvent:
    return WarningEvent(kind, name, uid, reason, message, at="2026-01-01T11:59:59")


def cause(
    *pods: dict[str, Any],
    claim: ClaimState = ClaimState.BOUND,
    warnings: tuple[WarningEvent, ...] = (),
    replicas: int = 1,
) -> Cause | None:
    sts = {"metadata": {"uid": STS_UID}, "spec": {"replicas": replicas}}
    driver = DriverState.from_objects(sts, list(pods))
    return diagnose(
        driver,
        claim=claim,
        claim_name="p-checkpoint",
        warnings=warnings,
        statefulset_uid=STS_UID,
        now=NOW,
    )


def test_a_running_driver_has_no_cause() -> None:
    ready = driver_pod(
        phase="Running",
        conditions=[{"type": "Ready", "status": "True"}],
        **container(state={"running": {}}),
    )
    assert cause(ready) is None


def test_an_image_that_cannot_be_pulled_is_degraded_with_the_kubelets_words() -> None:
    waiting = {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "eop:nope"'}
    found = cause(driver_pod(phase="Pending", **container(state={"waiting": waiting})))
    assert found is not None and found.stuck and found.reason == "ImagePullFailed"
    assert 'Back-off pulling image "eop:nope"' in found.message


def test_a_crash_loop_quotes_the_runners_termination_message() -> None:
    last = {
        "exitCode": 2,
        "message": "eop: error: [ConfigError] source.kafka.startingOffsets: 'abc' is no offset\n",
        "finishedAt": "2026-01-01T11:59:50Z",
    }
    pod = driver_pod(
        phase="Running",
        **container(
            restartCount=3,
            state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
            lastState={"terminated": last},
        ),
    )
    found = cause(pod)
    assert found is not None and found.stuck and found.reason == "CrashLoop"
    assert "[ConfigError] source.kafka.startingOffsets: 'abc' is no offset" in found.message
    assert "restarted 3 times" in found.message


def test_ready_between_two_crashes_is_not_running() -> None:
    last = {
        "exitCode": 1,
        "message": "eop: error: [Failed] boom",
        "finishedAt": "2026-01-01T11:59:55Z",
    }
    pod = driver_pod(
        phase="Running",
        conditions=[{"type": "Ready", "status": "True"}],
        **container(restartCount=2, state={"running": {}}, lastState={"terminated": last}),
    )
    found = cause(pod)
    assert found is not None and found.reason == "CrashLoop" and found.stuck
    once = driver_pod(
        phase="Running",
        conditions=[{"type": "Ready", "status": "True"}],
        **container(restartCount=1, state={"running": {}}, lastState={"terminated": last}),
    )
    first = cause(once)
    assert first is not None and first.reason == "DriverRestarted" and not first.stuck
    last["finishedAt"] = "2026-01-01T11:50:00Z"  # long ago: it runs
    assert cause(pod) is None


def test_unschedulable_quotes_the_scheduler() -> None:
    scheduled = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/1 nodes are available: 1 Insufficient cpu.",
    }
    found = cause(driver_pod(phase="Pending", conditions=[scheduled]))
    assert found is not None and found.reason == "Unschedulable" and not found.stuck
    assert "1 Insufficient cpu" in found.message


def test_a_pod_without_a_sandbox_is_degraded_with_the_events_words() -> None:
    creating = driver_pod(
        phase="Pending", **container(state={"waiting": {"reason": "ContainerCreating"}})
    )
    sandbox = warning("Pod", "pod-uid", "FailedCreatePodSandBox", "failed to setup network")
    stale = warning("Pod", "an-older-pod", "FailedCreatePodSandBox", "not this pod's")
    found = cause(creating, warnings=(stale, sandbox))
    assert found is not None and found.reason == "SandboxFailed" and found.stuck
    assert "failed to setup network" in found.message and "not this pod" not in found.message
    assert cause(creating, warnings=(stale,)) is None


def test_a_statefulset_that_cannot_create_its_pod_is_degraded() -> None:
    refused = warning(
        "StatefulSet", STS_UID, "FailedCreate", 'pods "p-driver-0" is forbidden: maximum cpu'
    )
    found = cause(warnings=(refused,))
    assert found is not None and found.reason == "FailedCreate" and found.stuck
    assert "maximum cpu" in found.message
    assert cause(warnings=(refused,), replicas=0) is None  # suspended: no pod is wanted


def test_the_claim_missing_or_pending_is_the_cause_of_a_waiting_pod() -> None:
    pending = driver_pod(phase="Pending")
    missing = cause(pending, claim=ClaimState.MISSING)
    assert missing is not None and missing.reason == "CheckpointClaimMissing"
    assert "p-checkpoint is missing" in missing.message
    plain = cause(pending, claim=ClaimState.PENDING)
    assert plain is not None and plain.reason == "ClaimPending" and not plain.stuck
    failed = warning(
        "PersistentVolumeClaim",
        "",
        "ProvisioningFailed",
        'storageclass "fast" not found',
        name="p-checkpoint",
    )
    provisioning = cause(pending, claim=ClaimState.PENDING, warnings=(failed,))
    assert provisioning is not None and provisioning.stuck
    assert 'storageclass "fast" not found' in provisioning.message


def test_a_stuck_cause_makes_the_pipeline_degraded_and_not_ready() -> None:
    stuck = Cause(reason="ImagePullFailed", message="the driver image cannot be pulled", stuck=True)
    verdict = lifecycle_verdict(
        suspend=False, driver=RUNNING, degraded=None, upgrading=None, cause=stuck
    )
    assert verdict.phase is Phase.DEGRADED and not verdict.ready and verdict.degraded
    assert verdict.reason == "ImagePullFailed"
    waiting = Cause(reason="Unschedulable", message="0/1 nodes", stuck=False)
    verdict = lifecycle_verdict(
        suspend=False, driver=STARTING, degraded=None, upgrading=None, cause=waiting
    )
    assert verdict.phase is Phase.PENDING and verdict.progressing and not verdict.degraded
    upgrading = lifecycle_verdict(
        suspend=False, driver=STARTING, degraded=None, upgrading="SpecChanged: x", cause=stuck
    )
    assert upgrading.phase is Phase.UPGRADING and upgrading.degraded
    assert upgrading.message == "SpecChanged: x; the driver image cannot be pulled"


def test_what_the_api_server_refused_is_in_the_status() -> None:
    refused = ("PersistentVolumeClaim p-checkpoint: HTTP 422: spec is immutable",)
    verdict = lifecycle_verdict(
        suspend=False, driver=RUNNING, degraded=None, upgrading=None, refused=refused
    )
    assert verdict.ready and verdict.reason == "ApplyRefused"
    assert verdict.message.endswith("refused by the API server: " + refused[0])


def test_claim_states() -> None:
    assert ClaimState.of(None) is ClaimState.MISSING
    assert ClaimState.of({"metadata": {"deletionTimestamp": "T"}}) is ClaimState.DELETING
    assert ClaimState.of({"metadata": {}, "status": {"phase": "Bound"}}) is ClaimState.BOUND
    assert ClaimState.of({"metadata": {}, "status": {}}) is ClaimState.PENDING
    assert ClaimState.MISSING.gone and ClaimState.DELETING.gone and not ClaimState.LOST.gone


def test_every_degraded_pipeline_is_stalled_for_gitops_tools() -> None:
    # kstatus (Flux, kubectl wait tooling) reads Stalled=True as Failed: a crash loop must not
    # read InProgress until a health-check timeout runs out.
    verdict = lifecycle_verdict(
        suspend=False,
        driver=STARTING,
        degraded=Degradation(
            reason="CrashLoop", message="eop: error: the sink Kafka cluster refused the login"
        ),
        upgrading=None,
    )
    patch = status_patch(verdict, previous=PipelineStatus(), generation=2, ready="0/1", now="T")
    conditions = _conditions(patch)
    assert conditions["Stalled"]["status"] == "True"
    assert conditions["Reconciling"]["status"] == "False"
    assert "refused the login" in conditions["Stalled"]["message"]
    healthy = judge(suspend=False, driver=RUNNING, error=None)
    healthy_patch = status_patch(
        healthy, previous=PipelineStatus(), generation=2, ready="1/1", now="T"
    )
    assert _conditions(healthy_patch)["Stalled"]["status"] == "False"


def test_a_driver_that_restarted_a_moment_ago_is_looked_at_again_when_it_counts_as_running() -> (
    None
):
    """Between two crashes a driver is Ready: it runs only after a minute without a restart."""
    ended = {"exitCode": 1, "finishedAt": "2026-01-01T11:59:40Z"}  # 20 s before NOW
    restarted = driver_pod(
        phase="Running",
        conditions=[{"type": "Ready", "status": "True"}],
        **container(restartCount=1, state={"running": {}}, lastState={"terminated": ended}),
    )
    driver = DriverState.from_objects({"metadata": {}, "spec": {}}, [restarted])
    assert not driver.steady_with(None, NOW)
    assert driver.recovers_in(NOW) == 40.0
    later = NOW + datetime.timedelta(seconds=41)
    assert driver.recovers_in(later) == float("inf")
    never = DriverState.from_objects(None, [driver_pod(phase="Pending", **container())])
    assert never.recovers_in(NOW) == float("inf")


def test_someone_elses_object_of_a_childs_name_makes_the_pipeline_degraded() -> None:
    not_owned = NotOwned("ConfigMap victim-config exists and is not this pipeline's (...)")
    verdict = lifecycle_verdict(
        suspend=False, driver=None, degraded=None, upgrading=None, refused=(not_owned,)
    )
    assert verdict.phase is Phase.DEGRADED and verdict.degraded
    assert verdict.reason == "ChildNotOwned" and verdict.message == not_owned
