"""Failover decisions: counting restarts once, the window, backoff, termination reasons."""

from __future__ import annotations

import datetime

from eop_operator.api.models import FailoverSpec, FailoverStatus
from eop_operator.reconcile.failover import (
    NODE_LOST,
    backoff_seconds,
    classify,
    count_failures,
    crash_looping,
    stamp,
)
from eop_operator.reconcile.observe import DriverState, PodObservation, Termination
from eop_spark.contract.termination import FailureReason

NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
SPEC = FailoverSpec(max_restarts=2, window="10m", backoff="10s", max_backoff="1m")


def crashed(uid: str, restarts: int, message: str = "eop: error: [Failed] boom") -> PodObservation:
    return PodObservation(
        name="p-driver-0", uid=uid, restart_count=restarts, termination=Termination(4, message)
    )


def test_each_restart_is_counted_once_however_often_it_is_seen() -> None:
    first = count_failures(FailoverStatus(), (crashed("a", 1),), now=NOW, spec=SPEC)
    assert first.status.restarts == 1 and len(first.new) == 1
    again = count_failures(first.status, (crashed("a", 1),), now=NOW, spec=SPEC)
    assert again.status.restarts == 1 and again.new == ()
    # The pod is gone, then a late event shows it again: still not counted twice.
    gone = count_failures(again.status, (), now=NOW, spec=SPEC)
    late = count_failures(gone.status, (crashed("a", 1),), now=NOW, spec=SPEC)
    assert late.status.restarts == 1 and late.new == ()
    more = count_failures(late.status, (crashed("a", 3),), now=NOW, spec=SPEC)
    assert more.status.restarts == 3 and len(more.status.recent) == 3


def test_the_last_termination_is_the_one_that_ended_last_whatever_order_it_is_seen() -> None:
    def ended(uid: str, message: str, at: str) -> PodObservation:
        return PodObservation(
            name="p-driver-0",
            uid=uid,
            phase="Failed",
            termination=Termination(4, f"eop: error: [Failed] {message}", finished_at=at),
        )

    # The watch event of the later pod is handled before the earlier pod's.
    later = count_failures(
        FailoverStatus(), (ended("c", "third", "2026-01-01T12:00:09Z"),), now=NOW, spec=SPEC
    )
    earlier = count_failures(
        later.status, (ended("b", "second", "2026-01-01T12:00:05Z"),), now=NOW, spec=SPEC
    )
    assert earlier.status.restarts == 2
    assert earlier.status.last_message == "third"
    # Seen together, they are reported in the order they ended.
    both = count_failures(
        FailoverStatus(),
        (ended("c", "third", "2026-01-01T12:00:09Z"), ended("b", "second", "2026-01-01T12:00:05Z")),
        now=NOW,
        spec=SPEC,
    )
    assert [f.message for f in both.new] == ["second", "third"]
    assert both.status.last_message == "third"


def test_restarts_outside_the_window_do_not_count_toward_degraded() -> None:
    counted = count_failures(FailoverStatus(), (crashed("a", 3),), now=NOW, spec=SPEC)
    assert crash_looping(counted.status, SPEC)
    later = NOW + datetime.timedelta(minutes=11)
    aged = count_failures(counted.status, (), now=later, spec=SPEC)
    assert aged.status.restarts == 3 and aged.status.recent == []
    assert not crash_looping(aged.status, SPEC)


def test_backoff_doubles_up_to_the_maximum() -> None:
    def after(restarts: int) -> float:
        recent = [stamp(NOW)] * restarts
        return backoff_seconds(FailoverStatus(recent=recent), SPEC)

    assert [after(n) for n in (0, 1, 2, 3, 4, 5)] == [10, 10, 20, 40, 60, 60]


def test_a_failed_pod_counts_and_a_clean_exit_does_not() -> None:
    failed = PodObservation(name="p", uid="b", phase="Failed")
    assert failed.failures == 1
    stopped = PodObservation(name="p", uid="c", termination=Termination(0, "", current=True))
    assert stopped.failures == 0


def test_termination_reasons_are_read_from_the_message() -> None:
    assert classify(Termination(4, "eop: error: [IncompatibleCheckpoint] schema"))[0] is (
        FailureReason.INCOMPATIBLE_CHECKPOINT
    )
    reason, message = classify(Termination(4, "eop: error: [CorruptCheckpoint] bad log"))
    assert reason is FailureReason.CORRUPT_CHECKPOINT and message == "bad log"
    # Without a token (an older runner, an OOM kill) the exit code decides.
    assert classify(Termination(2, "eop: error: invalid run config"))[0] is (
        FailureReason.CONFIG_ERROR
    )
    assert classify(Termination(137, "OOMKilled"))[0] is FailureReason.FAILED


def test_pods_are_read_from_the_api_objects() -> None:
    pod = {
        "metadata": {
            "name": "p-driver-0",
            "uid": "u",
            "annotations": {
                "exactlyonce.io/spec-hash": "h",
                "exactlyonce.io/checkpoint-generation": "2",
            },
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {
                    "name": "driver",
                    "restartCount": 2,
                    "lastState": {"terminated": {"exitCode": 4, "message": "eop: error: x"}},
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                }
            ],
        },
    }
    observed = PodObservation.from_pod(pod)
    assert observed.spec_hash == "h" and observed.generation == 2 and not observed.ready
    assert observed.failures == 2 and observed.termination == Termination(4, "eop: error: x")
    sts = {
        "spec": {
            "replicas": 1,
            "template": {"metadata": {"annotations": {"exactlyonce.io/spec-hash": "h"}}},
        }
    }
    state = DriverState.from_objects(sts, [pod], departed=[pod])
    assert state.template_hash == "h" and state.departed == ()  # still listed: not departed


def test_a_new_generation_the_runner_refuses_stops_for_good() -> None:
    """Exits 5 and 6 (progress missing, state that would be lost) need a spec change."""
    missing = "eop: error: [Failed] no progress in eop.ns.p for impressions-raw[2]: set ..."
    for code in (5, 6):
        reason, message = classify(Termination(code, missing))
        assert reason is FailureReason.CONFIG_ERROR
        assert message.startswith("no progress in eop.ns.p for impressions-raw[2]")
    assert classify(Termination(4, missing))[0] is FailureReason.FAILED


def test_a_driver_killed_before_its_line_is_read_from_its_last_log_record() -> None:
    """FallbackToLogsOnError: the kubelet puts the last log lines in the message."""
    record = (
        '{"ts": 1795628865.2, "level": "info", "logger": "eop_spark.runtime.runner", '
        '"msg": "batch 7"}'
    )
    reason, message = classify(Termination(137, record))
    assert reason is FailureReason.FAILED
    assert message == "exit 137 without a message; last logged: batch 7"
    assert classify(Termination(137, "OOMKilled"))[1] == "OOMKilled"


def lost_driver_pod(uid: str = "lost") -> dict[str, object]:
    """A driver pod as the API server shows it once its node stopped reporting and the taint
    manager failed it (read from the multi-node cluster after ``node-lose``)."""
    return {
        "metadata": {
            "name": "p-driver-0",
            "uid": uid,
            "deletionTimestamp": "2026-11-26T07:56:43Z",
        },
        "spec": {"nodeName": "node3"},
        "status": {
            "phase": "Failed",
            "conditions": [
                {"type": "Ready", "status": "False"},
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "DeletionByTaintManager",
                    "message": "Taint manager: deleting due to NoExecute taint",
                    "lastTransitionTime": "2026-11-26T07:56:43Z",
                },
            ],
            "containerStatuses": [
                {
                    "name": "driver",
                    "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-11-26T07:54:45Z"}},
                }
            ],
        },
    }


def test_a_driver_pod_that_went_with_its_node_is_one_restart_named_node_lost() -> None:
    """No kubelet reports the end of a container on a lost node: the pod's Failed phase and
    its DisruptionTarget condition say what happened, once."""
    observed = PodObservation.from_pod(lost_driver_pod())
    assert observed.failures == 1
    assert observed.termination is not None and observed.termination.node_lost
    reason, message = classify(observed.termination)
    assert reason == NODE_LOST
    assert "node node3 was not reporting" in message and "DeletionByTaintManager" in message
    # Seen while it is still listed, then once more in its DELETED event: one restart.
    first = count_failures(FailoverStatus(), (observed,), now=NOW, spec=SPEC)
    assert first.status.restarts == 1 and first.status.last_reason == NODE_LOST
    assert first.status.last_time == "2026-11-26T07:56:43Z"
    gone = DriverState.from_objects(None, [], departed=[lost_driver_pod()])
    again = count_failures(first.status, gone.departed, now=NOW, spec=SPEC)
    assert again.status.restarts == 1 and again.new == ()
    # A pod whose container did report its end (an eviction it honoured) is the runner's.
    honoured = lost_driver_pod("drained")
    honoured["status"]["containerStatuses"][0]["state"] = {  # type: ignore[index]
        "terminated": {"exitCode": 0, "message": "", "finishedAt": "2026-11-26T07:56:50Z"}
    }
    assert not PodObservation.from_pod(honoured).termination.node_lost  # type: ignore[union-attr]
