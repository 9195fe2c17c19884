"""Lifecycle decisions: upgrades per mode, the write-ahead log, rollback, fallback, suspend."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest

from eop_operator.api.models import (
    CheckpointStatus,
    FailoverSpec,
    PipelineStatus,
    UpgradeMode,
    UpgradeSpec,
    UpgradeStatus,
    UpgradeStep,
)
from eop_operator.api.status_patch import merge_patch
from eop_operator.reconcile.decision import Action, Decision, Situation, target_generation
from eop_operator.reconcile.failover import stamp
from eop_operator.reconcile.observe import ClaimState, DriverState, PodObservation, Termination
from eop_operator.reconcile.upgrade import decide, holds_restart_slot
from tests.operator.merge_patch import merged

NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)


def hashes(version: str) -> Any:
    """A spec's hash at (generation, reset), like render_pipeline's: all three matter."""
    return lambda generation, reset: f"{version}-g{generation}{'-r' if reset else ''}"


def pod(spec_hash: str, *, ready: bool = False, uid: str = "u1", **kwargs: Any) -> PodObservation:
    return PodObservation(name="p-driver-0", uid=uid, ready=ready, spec_hash=spec_hash, **kwargs)


def running(spec_hash: str, *, ready: bool = True, replicas: int = 1) -> DriverState:
    pods = (pod(spec_hash, ready=ready),) if replicas else ()
    return DriverState(exists=True, replicas=replicas, template_hash=spec_hash, pods=pods)


def steady(version: str = "v1", generation: int = 0, **status: Any) -> PipelineStatus:
    return PipelineStatus(
        spec_hash=hashes(version)(generation, False),
        checkpoint=CheckpointStatus(generation=generation),
        applied_fingerprint=version,
        last_stable_fingerprint=version,
        last_stable_spec={"was": version},
        **status,
    )


def situation(
    status: PipelineStatus,
    driver: DriverState,
    *,
    version: str = "v1",
    mode: UpgradeMode = UpgradeMode.LAST_STATE,
    now: datetime.datetime = NOW,
    **kwargs: Any,
) -> Situation:
    upgrade = kwargs.pop("upgrade", UpgradeSpec(mode=mode))
    return Situation(
        status=status,
        fingerprint=version,
        spec_dump={"was": version},
        suspend=kwargs.pop("suspend", False),
        upgrade=upgrade,
        failover=kwargs.pop("failover", FailoverSpec()),
        driver=driver,
        hash_at=hashes(version),
        now=now,
        **kwargs,
    )


def apply_status(status: PipelineStatus, decision: Decision) -> PipelineStatus:
    """The status after the lifecycle wrote the decision's record."""
    data = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    return PipelineStatus.model_validate(merged(data, merge_patch(decision.record, data)))


def test_creation_submits_generation_zero() -> None:
    decision = decide(situation(PipelineStatus(), DriverState()))
    assert decision.action is Action.APPLY and decision.replicas == 1
    assert decision.generation == 0 and not decision.reset_progress
    assert decision.record.spec_hash == "v1-g0"
    assert [e.reason for e in decision.events] == ["Submitted"]


def test_creation_while_suspended_applies_zero_replicas() -> None:
    decision = decide(situation(PipelineStatus(), DriverState(), suspend=True))
    assert decision.action is Action.APPLY and decision.replicas == 0


def test_nothing_changed_waits_and_writes_nothing() -> None:
    decision = decide(situation(steady(), running("v1-g0")))
    assert decision.action is Action.WAIT
    assert decision.record.model_fields_set == set() and decision.events == ()


def test_in_place_change_is_applied_without_a_restart() -> None:
    # The fingerprint changed (say checkpoint.retention) but the driver's hash did not.
    status = steady()
    s = situation(status, running("v1-g0"), version="v1")
    s = dataclasses.replace(s, fingerprint="v1-retention")
    decision = decide(s)
    assert decision.action is Action.APPLY and decision.replicas == 1
    assert "upgrade" not in decision.record.model_fields_set
    assert decision.record.applied_fingerprint == "v1-retention"


@pytest.mark.parametrize(
    ("mode", "generation", "reset"),
    [
        (UpgradeMode.LAST_STATE, 3, False),
        (UpgradeMode.COMMITTED_OFFSETS, 4, False),
        (UpgradeMode.STATELESS, 4, True),
    ],
)
def test_each_mode_picks_its_generation(mode: UpgradeMode, generation: int, reset: bool) -> None:
    assert target_generation(mode, 3, False) == (generation, reset)
    decision = decide(situation(steady(generation=3), running("v1-g3"), version="v2", mode=mode))
    assert decision.action is Action.STOP
    wal = decision.record.upgrade
    assert wal is not None
    assert wal.step is UpgradeStep.STOPPING and wal.mode is mode
    assert wal.generation == generation and wal.reset_progress is reset
    assert wal.from_hash == "v1-g3" and wal.to_hash == hashes("v2")(generation, reset)
    assert [e.reason for e in decision.events] == ["Upgrading"]


def run_upgrade(
    mode: UpgradeMode, status: PipelineStatus | None = None, render: str | None = None
) -> list[tuple[Decision, DriverState]]:
    """Walk an upgrade v1 -> v2 with the driver reacting as Kubernetes would.

    ``render``: the spec stays v1 and the operator renders it as ``render`` (an operator
    upgrade).
    """
    status = status or steady()
    assert status.spec_hash is not None
    driver = running(status.spec_hash)
    trace = []
    for _ in range(10):
        s = situation(status, driver, version="v1" if render else "v2", mode=mode)
        if render:
            s = dataclasses.replace(s, hash_at=hashes(render), rendered_by="0.2.0")
        decision = decide(s)
        trace.append((decision, driver))
        status = apply_status(status, decision)
        if decision.action is Action.STOP:
            driver = DriverState(exists=True, replicas=0, template_hash=driver.template_hash)
        elif decision.action is Action.APPLY:
            new = s.hash_at(decision.generation, decision.reset_progress)
            driver = DriverState(exists=True, replicas=1, template_hash=new, pods=(pod(new),))
        elif driver.pods and not driver.pods[0].ready:
            driver = running(driver.template_hash or "")  # the new driver gets Ready
        else:
            break
    return trace


@pytest.mark.parametrize("mode", list(UpgradeMode))
def test_an_upgrade_stops_the_old_driver_before_starting_the_new(mode: UpgradeMode) -> None:
    trace = run_upgrade(mode)
    actions = [d.action for d, _ in trace]
    assert actions[:2] == [Action.STOP, Action.APPLY]
    for decision, driver in trace:
        if decision.action is Action.APPLY:
            assert driver.pods == () and driver.replicas == 0, "old driver still there"
    reasons = [e.reason for d, _ in trace for e in d.events]
    assert reasons == ["Upgrading", "Upgraded"]
    final, _ = trace[-1]
    assert final.action is Action.WAIT
    assert final.record.last_stable_fingerprint == "v2"


def test_stopping_waits_for_the_old_pod_to_be_gone() -> None:
    wal = UpgradeStatus(
        from_hash="v1-g0",
        to_hash="v2-g1",
        mode=UpgradeMode.COMMITTED_OFFSETS,
        step=UpgradeStep.STOPPING,
        generation=1,
        reason="SpecChanged",
        started_at=stamp(NOW),
    )
    status = steady(upgrade=wal)
    terminating = DriverState(exists=True, replicas=0, template_hash="v1-g0", pods=(pod("v1-g0"),))
    assert decide(situation(status, terminating, version="v2")).action is Action.WAIT
    # An operator that died right after writing Stopping scales down again.
    not_scaled = running("v1-g0")
    assert decide(situation(status, not_scaled, version="v2")).action is Action.STOP
    gone = DriverState(exists=True, replicas=0, template_hash="v1-g0")
    decision = decide(situation(status, gone, version="v2"))
    assert decision.action is Action.APPLY and decision.generation == 1
    assert decision.record.upgrade is not None
    assert decision.record.upgrade.step is UpgradeStep.STARTING
    assert decision.record.checkpoint == CheckpointStatus(generation=1, reset_progress=False)


def starting(to_hash: str = "v2-g0", **kwargs: Any) -> PipelineStatus:
    fields: dict[str, Any] = {
        "from_hash": "v1-g0",
        "to_hash": to_hash,
        "mode": UpgradeMode.LAST_STATE,
        "step": UpgradeStep.STARTING,
        "generation": 0,
        "reason": "SpecChanged",
        "started_at": stamp(NOW),
        **kwargs,
    }
    return steady(upgrade=UpgradeStatus(**fields)).model_copy(update={"spec_hash": to_hash})


def test_starting_reapplies_when_the_apply_was_lost() -> None:
    # The operator died after writing Starting and before applying the new template.
    old = DriverState(exists=True, replicas=0, template_hash="v1-g0")
    decision = decide(situation(starting(), old, version="v2"))
    assert decision.action is Action.APPLY and decision.replicas == 1


def test_the_readiness_timeout_rolls_back_when_enabled() -> None:
    late = NOW + datetime.timedelta(minutes=6)
    new_driver = running("v2-g0", ready=False)
    upgrade = UpgradeSpec(rollback=True)
    decision = decide(situation(starting(), new_driver, version="v2", now=late, upgrade=upgrade))
    assert decision.action is Action.STOP
    assert decision.record.rolled_back_fingerprint == "v2"
    assert decision.record.upgrade.reason == "RolledBack"
    assert decision.record.upgrade.generation == 1  # a new generation from G
    assert "RolledBack" in [e.reason for e in decision.events]


def test_without_rollback_a_late_driver_is_degraded() -> None:
    late = NOW + datetime.timedelta(minutes=6)
    decision = decide(situation(starting(), running("v2-g0", ready=False), version="v2", now=late))
    assert decision.action is Action.WAIT
    assert decision.degraded is not None and decision.degraded.reason == "UpgradeNotReady"


def test_before_the_timeout_it_waits() -> None:
    soon = NOW + datetime.timedelta(minutes=1)
    decision = decide(situation(starting(), running("v2-g0", ready=False), version="v2", now=soon))
    assert decision.action is Action.WAIT and decision.degraded is None
    assert decision.requeue_after is not None and decision.requeue_after <= 30


def incompatible(spec_hash: str) -> PodObservation:
    return pod(
        spec_hash,
        phase="Failed",
        termination=Termination(4, "eop: error: [IncompatibleCheckpoint] state schema", True),
    )


def test_an_incompatible_checkpoint_falls_back_to_committed_offsets() -> None:
    driver = DriverState(
        exists=True, replicas=1, template_hash="v2-g0", pods=(incompatible("v2-g0"),)
    )
    decision = decide(situation(starting(), driver, version="v2"))
    assert decision.action is Action.STOP
    wal = decision.record.upgrade
    assert wal is not None
    assert wal.reason == "FellBack" and wal.mode is UpgradeMode.COMMITTED_OFFSETS
    assert wal.generation == 1
    assert {"FellBack", "Restarted"} <= {e.reason for e in decision.events}


def test_fallback_can_be_disabled() -> None:
    driver = DriverState(
        exists=True, replicas=1, template_hash="v2-g0", pods=(incompatible("v2-g0"),)
    )
    s = situation(starting(), driver, version="v2", upgrade=UpgradeSpec(allow_fallback=False))
    decision = decide(s)
    assert decision.action is Action.WAIT
    assert decision.degraded is not None and decision.degraded.reason == "IncompatibleCheckpoint"


def test_a_corrupt_checkpoint_starts_the_next_generation_after_a_backoff() -> None:
    broken = pod(
        "v1-g2",
        restart_count=1,
        termination=Termination(4, "eop: error: [CorruptCheckpoint] Log file was malformed"),
    )
    driver = DriverState(exists=True, replicas=1, template_hash="v1-g2", pods=(broken,))
    decision = decide(situation(steady(generation=2), driver))
    wal = decision.record.upgrade
    assert wal is not None
    assert decision.action is Action.STOP
    assert wal.reason == "CheckpointRecovery" and wal.generation == 3
    assert wal.not_before == stamp(NOW + datetime.timedelta(seconds=10))
    # Once the old pod is gone, the new driver waits for the backoff.
    status = apply_status(steady(generation=2), decision)
    gone = DriverState(exists=True, replicas=0, template_hash="v1-g2")
    assert decide(situation(status, gone)).action is Action.WAIT
    later = NOW + datetime.timedelta(seconds=11)
    assert decide(situation(status, gone, now=later)).action is Action.APPLY


def test_a_lost_object_store_checkpoint_starts_the_next_generation_from_g_at_once() -> None:
    """The driver found its checkpoint root empty while G holds progress (the prefix deleted):
    the operator cannot see the store, so the runner's reason drives the new generation."""
    message = (
        "eop: error: [CheckpointLost] checkpoint root s3a://b/eop/ads/clean holds no checkpoint "
        "generation, but progress group eop.ads.clean has held progress for 4 partitions"
    )
    lost = pod("v1-g2", restart_count=1, termination=Termination(4, message))
    driver = DriverState(exists=True, replicas=1, template_hash="v1-g2", pods=(lost,))
    decision = decide(situation(steady(generation=2), driver))
    wal = decision.record.upgrade
    assert wal is not None
    assert decision.action is Action.STOP
    assert (wal.reason, wal.generation, wal.mode) == (
        "CheckpointLost",
        3,
        "committed-offsets",
    )
    assert "notBefore" not in wal  # nothing to back off from: the new generation repairs it
    (event,) = [e for e in decision.events if e.reason == "CheckpointLost"]
    assert (
        event.type == "Warning" and "generation 3 starts from the progress group" in event.message
    )
    assert "s3a://b/eop/ads/clean" in event.message
    assert decision.record.message.startswith("CheckpointLost: new checkpoint generation 3")


def test_suspend_and_resume_keep_the_generation() -> None:
    suspend = decide(situation(steady(generation=2), running("v1-g2"), suspend=True))
    assert suspend.action is Action.APPLY and suspend.replicas == 0
    assert suspend.generation == 2
    assert [e.reason for e in suspend.events] == ["Suspended"]
    resume = decide(situation(steady(generation=2), running("v1-g2", replicas=0)))
    assert resume.action is Action.APPLY and resume.replicas == 1 and resume.generation == 2
    assert [e.reason for e in resume.events] == ["Resumed"]


def test_restart_nonce_upgrades_like_any_change() -> None:
    s = situation(steady(), running("v1-g0"), version="v1n", restart_reason="RestartNonce")
    decision = decide(s)
    assert decision.action is Action.STOP
    assert decision.record.upgrade.reason == "RestartNonce"
    assert decision.record.upgrade.generation == 0  # last-state: same checkpoint


def test_a_newer_spec_during_stopping_retargets_the_upgrade() -> None:
    status = starting().model_copy(
        update={
            "upgrade": starting().upgrade.model_copy(update={"step": UpgradeStep.STOPPING}),  # type: ignore[union-attr]
            "spec_hash": "v1-g0",
        }
    )
    decision = decide(situation(status, running("v1-g0", replicas=0), version="v3"))
    assert decision.record.upgrade.to_hash == "v3-g0"
    assert decision.record.spec_hash == "v3-g0"


def test_a_newer_spec_during_starting_starts_another_upgrade() -> None:
    decision = decide(situation(starting(), running("v2-g0", ready=False), version="v3"))
    assert decision.action is Action.STOP
    assert decision.record.upgrade.to_hash == "v3-g0"
    assert decision.record.upgrade.from_hash == "v2-g0"


def test_crash_loop_is_degraded() -> None:
    failover = FailoverSpec(max_restarts=2)
    looping = pod("v1-g0", restart_count=3, termination=Termination(4, "eop: error: [Failed] boom"))
    driver = DriverState(exists=True, replicas=1, template_hash="v1-g0", pods=(looping,))
    decision = decide(situation(steady(), driver, failover=failover))
    assert decision.degraded is not None and decision.degraded.reason == "CrashLoop"
    assert decision.record.failover.restarts == 3
    assert [e.reason for e in decision.events] == ["Restarted"]


def test_a_healthy_driver_of_a_new_spec_becomes_the_stable_spec() -> None:
    status = steady().model_copy(update={"last_stable_fingerprint": None})
    decision = decide(situation(status, running("v1-g0")))
    assert decision.record.last_stable_spec == {"was": "v1"}


def test_a_lost_claim_starts_the_next_generation_from_the_progress_group() -> None:
    s = situation(steady(generation=2), running("v1-g2"), claim=ClaimState.MISSING)
    s = dataclasses.replace(s, claim_name="p-checkpoint")
    decision = decide(s)
    assert decision.action is Action.STOP
    wal = decision.record.upgrade
    assert wal is not None
    assert wal.reason == "CheckpointLost" and wal.mode is UpgradeMode.COMMITTED_OFFSETS
    assert wal.generation == 3 and wal.reset_progress is False
    (event,) = decision.events
    assert (event.type, event.reason) == ("Warning", "CheckpointLost")
    assert "p-checkpoint" in event.message and "generation 3" in event.message
    # The deleted claim stays while a pod uses it; the new one is made only once it is gone.
    status = apply_status(steady(generation=2), decision)
    gone = DriverState(exists=True, replicas=0, template_hash="v1-g2")
    deleting = decide(situation(status, gone, claim=ClaimState.DELETING))
    assert deleting.action is Action.WAIT
    started = decide(situation(status, gone, claim=ClaimState.MISSING))
    assert started.action is Action.APPLY and started.generation == 3
    assert started.record.checkpoint == CheckpointStatus(generation=3, reset_progress=False)


def test_a_claim_that_is_there_or_not_looked_at_changes_nothing() -> None:
    for claim in (ClaimState.BOUND, ClaimState.PENDING, ClaimState.UNKNOWN):
        decision = decide(situation(steady(), running("v1-g0"), claim=claim))
        assert decision.action is Action.WAIT and decision.events == ()


def test_starting_makes_the_claim_again_when_it_is_missing() -> None:
    s = situation(starting(), running("v2-g0", ready=False), version="v2", claim=ClaimState.MISSING)
    assert decide(s).action is Action.APPLY


def test_a_new_pipeline_waits_for_the_claim_of_an_earlier_one_to_go() -> None:
    s = situation(PipelineStatus(), DriverState(), claim=ClaimState.DELETING)
    s = dataclasses.replace(s, claim_name="p-checkpoint")
    decision = decide(s)
    assert decision.action is Action.WAIT and decision.events == ()
    assert "p-checkpoint" in decision.record.message
    assert decide(situation(PipelineStatus(), DriverState())).action is Action.APPLY


def _between_crashes(restarts: int, message: str, seconds_ago: int) -> DriverState:
    """A driver pod Ready for a moment after its container restarted."""
    ended = stamp(NOW - datetime.timedelta(seconds=seconds_ago))
    crashing = pod(
        "v1-g0",
        ready=True,
        restart_count=restarts,
        termination=Termination(2, message, finished_at=ended),
    )
    return DriverState(exists=True, replicas=1, template_hash="v1-g0", pods=(crashing,))


def test_a_crash_loop_is_degraded_while_the_driver_is_ready_between_crashes() -> None:
    driver = _between_crashes(3, "eop: error: [Failed] boom", seconds_ago=5)
    decision = decide(situation(steady(), driver, failover=FailoverSpec(max_restarts=2)))
    assert decision.degraded is not None and decision.degraded.reason == "CrashLoop"
    assert "boom" in decision.degraded.message


def test_a_config_error_is_degraded_at_once_even_while_ready_for_a_moment() -> None:
    message = "eop: error: [ConfigError] source.kafka.startingOffsets: 'abc' is not an offset"
    decision = decide(situation(steady(), _between_crashes(1, message, seconds_ago=5)))
    assert decision.degraded is not None and decision.degraded.reason == "ConfigError"
    assert "startingOffsets: 'abc' is not an offset" in decision.degraded.message


def test_a_driver_ready_long_after_its_last_restart_is_not_degraded() -> None:
    status = steady()
    driver = _between_crashes(3, "eop: error: [Failed] boom", seconds_ago=5)
    counted = apply_status(status, decide(situation(status, driver)))
    later = NOW + datetime.timedelta(minutes=2)
    assert decide(situation(counted, driver, now=later)).degraded is None


def test_a_crash_looping_spec_does_not_become_the_stable_spec() -> None:
    status = steady().model_copy(update={"last_stable_fingerprint": None})
    driver = _between_crashes(2, "eop: error: [Failed] boom", seconds_ago=5)
    assert "last_stable_spec" not in decide(situation(status, driver)).record.model_fields_set


# An operator upgrade: the spec stays v1 (its fingerprint), the operator renders it as "r2".


def rendered(status: PipelineStatus, driver: DriverState, **kwargs: Any) -> Situation:
    """The v1 spec as a new operator (version 0.2.0) renders it: hashes r2-g<k>."""
    s = situation(status, driver, **kwargs)
    return dataclasses.replace(s, hash_at=hashes("r2"), rendered_by="0.2.0")


@pytest.mark.parametrize("mode", list(UpgradeMode))
@pytest.mark.parametrize("reset", [False, True])
def test_an_operator_rendering_change_restarts_in_last_state_whatever_the_mode(
    mode: UpgradeMode, reset: bool
) -> None:
    """Never a reprocess (stateless) nor a new generation without state (committed-offsets)."""
    status = steady(generation=3).model_copy(
        update={
            "spec_hash": hashes("v1")(3, reset),
            "checkpoint": CheckpointStatus(generation=3, reset_progress=reset),
        }
    )
    trace = run_upgrade(mode, status, render="r2")
    first, _ = trace[0]
    wal = first.record.upgrade
    assert wal is not None and first.action is Action.STOP
    assert wal.reason == "OperatorUpgrade" and wal.mode is UpgradeMode.LAST_STATE
    assert (wal.generation, wal.reset_progress) == (3, reset)
    assert wal.to_hash == hashes("r2")(3, reset)
    (upgrading,) = first.events
    assert upgrading.reason == "Upgrading" and upgrading.message.startswith("OperatorUpgrade:")
    assert "resuming checkpoint generation 3" in upgrading.message
    reasons = [e.reason for d, _ in trace for e in d.events]
    assert reasons == ["Upgrading", "Upgraded"]
    applied = [d for d, _ in trace if d.action is Action.APPLY]
    assert [(d.generation, d.reset_progress) for d in applied] == [(3, reset)]
    recorded = [d.record for d, _ in trace if "spec_hash" in d.record.model_fields_set]
    assert [(r.spec_hash, r.rendered_by) for r in recorded] == [(hashes("r2")(3, reset), "0.2.0")]


def test_a_rendering_change_waits_for_a_restart_slot_with_its_children_held() -> None:
    s = dataclasses.replace(rendered(steady(), running("v1-g0")), restart_slot=lambda: False)
    decision = decide(s)
    assert decision.action is Action.WAIT and decision.hold
    assert "upgrade" not in decision.record.model_fields_set
    assert decision.record.message is not None
    assert decision.record.message.startswith("OperatorUpgrade: the driver runs spec hash v1-g0")
    # Said once: the next look writes nothing.
    again = decide(dataclasses.replace(s, status=apply_status(steady(), decision)))
    assert again.hold and again.record.model_fields_set == set() and again.events == ()
    # A slot frees: the restart begins.
    began = decide(dataclasses.replace(s, restart_slot=lambda: True))
    assert began.action is Action.STOP and not began.hold
    assert began.record.upgrade is not None
    assert began.record.upgrade.reason == "OperatorUpgrade"


def test_a_crash_looping_driver_waiting_for_a_restart_slot_stays_degraded() -> None:
    failover = FailoverSpec(max_restarts=2)
    looping = pod("r1-g0", restart_count=3, termination=Termination(4, "eop: error: [Failed] boom"))
    driver = DriverState(exists=True, replicas=1, template_hash="v1-g0", pods=(looping,))
    s = rendered(steady(), driver, failover=failover)
    decision = decide(dataclasses.replace(s, restart_slot=lambda: False))
    assert decision.hold
    assert decision.degraded is not None and decision.degraded.reason == "CrashLoop"


def test_a_rendering_change_of_a_driver_without_a_pod_needs_no_slot() -> None:
    suspended = running("v1-g0", replicas=0)
    s = rendered(steady(), suspended, suspend=True)
    decision = decide(dataclasses.replace(s, restart_slot=lambda: False))
    assert decision.action is Action.STOP and not decision.hold
    assert decision.record.upgrade is not None
    assert decision.record.upgrade.reason == "OperatorUpgrade"


def test_a_status_of_an_older_operator_restarts_only_in_last_state_and_only_when_needed() -> None:
    # Written by an operator that recorded neither the fingerprint nor its version.
    old = steady(generation=2).model_copy(update={"applied_fingerprint": None})
    # The same rendering: adopted in place (nothing restarts), with what this operator records.
    s = dataclasses.replace(
        situation(old, running("v1-g2"), mode=UpgradeMode.STATELESS), rendered_by="0.2.0"
    )
    same = decide(s)
    assert same.action is Action.APPLY and not same.hold
    assert "upgrade" not in same.record.model_fields_set
    assert (same.record.applied_fingerprint, same.record.rendered_by) == ("v1", "0.2.0")
    # A new rendering: unknown whether the spec changed, so the restart safe in every mode.
    new = decide(rendered(old, running("v1-g2"), mode=UpgradeMode.STATELESS))
    assert new.record.upgrade is not None
    assert new.record.upgrade.reason == "OperatorUpgrade"
    assert new.record.upgrade.mode is UpgradeMode.LAST_STATE
    assert new.record.upgrade.generation == 2


def test_a_spec_edit_before_an_operator_upgrades_driver_starts_restarts_in_the_users_mode() -> None:
    stopping = starting("r2-g0", step=UpgradeStep.STOPPING, reason="OperatorUpgrade")
    status = stopping.model_copy(update={"spec_hash": "v1-g0"})
    s = situation(status, running("v1-g0", replicas=0), version="v2")
    decision = decide(dataclasses.replace(s, upgrade=UpgradeSpec(mode=UpgradeMode.STATELESS)))
    new = decision.record.upgrade
    assert new is not None and new.reason == "SpecChanged"
    assert new.mode is UpgradeMode.STATELESS and (new.generation, new.reset_progress) == (1, True)


def test_an_operator_upgrade_never_falls_back_to_a_new_generation() -> None:
    driver = DriverState(
        exists=True, replicas=1, template_hash="r2-g0", pods=(incompatible("r2-g0"),)
    )
    status = starting("r2-g0", reason="OperatorUpgrade")
    decision = decide(rendered(status, driver))
    assert decision.action is Action.WAIT and "upgrade" not in decision.record.model_fields_set
    assert decision.degraded is not None and decision.degraded.reason == "IncompatibleCheckpoint"
    assert "never drops state" in decision.degraded.message


def test_an_operator_upgrade_holds_its_slot_until_ready_or_timed_out() -> None:
    def wal(step: UpgradeStep, reason: str = "OperatorUpgrade") -> UpgradeStatus | None:
        return starting("r2-g0", step=step, reason=reason).upgrade

    spec = UpgradeSpec(readiness_timeout="1m")
    later = NOW + datetime.timedelta(minutes=2)
    assert holds_restart_slot(wal(UpgradeStep.STOPPING), spec, NOW)
    assert not holds_restart_slot(wal(UpgradeStep.STOPPING), spec, later)
    assert holds_restart_slot(wal(UpgradeStep.STARTING), spec, NOW)
    assert not holds_restart_slot(wal(UpgradeStep.STARTING), spec, later)
    assert not holds_restart_slot(wal(UpgradeStep.STOPPING, "SpecChanged"), spec, NOW)
    assert not holds_restart_slot(None, spec, NOW)


def test_a_stop_that_does_not_end_gives_its_restart_slot_back_and_says_so() -> None:
    """A driver pod that never goes (a lost node, a finalizer) holds no slot for ever."""
    stopping = starting("r2-g0", step=UpgradeStep.STOPPING, reason="OperatorUpgrade")
    status = stopping.model_copy(update={"spec_hash": "v1-g0"})
    stuck = DriverState(
        exists=True, replicas=0, template_hash="v1-g0", pods=(pod("v1-g0", deleting=True),)
    )
    s = rendered(status, stuck, upgrade=UpgradeSpec(readiness_timeout="1m"))
    wal = status.upgrade
    assert wal is not None
    # Within the bound: the stop waits and holds its slot, nothing said.
    early = decide(dataclasses.replace(s, now=NOW + datetime.timedelta(seconds=59)))
    assert early.action is Action.WAIT and early.degraded is None
    assert holds_restart_slot(wal, s.upgrade, NOW + datetime.timedelta(seconds=59))
    # Past it: the slot is free for others, the pipeline is Degraded naming the pod, and the
    # new driver still waits for the old one to go (never two drivers).
    late = NOW + datetime.timedelta(minutes=2)
    overdue = decide(dataclasses.replace(s, now=late))
    assert not holds_restart_slot(wal, s.upgrade, late)
    assert overdue.action is Action.WAIT and "upgrade" not in overdue.record.model_fields_set
    assert overdue.degraded is not None and overdue.degraded.reason == "DriverNotStopped"
    assert "p-driver-0" in overdue.degraded.message
    assert "restart slot is free" in overdue.degraded.message
    # The pod goes at last: the new driver waits for a slot like any other restart ...
    gone = DriverState(exists=True, replicas=0, template_hash="v1-g0")
    s = dataclasses.replace(s, driver=gone, now=late)
    waits = decide(dataclasses.replace(s, restart_slot=lambda: False))
    assert waits.action is Action.WAIT and waits.hold
    assert "upgrade" not in waits.record.model_fields_set
    # ... and starts when one is free, holding it again.
    starts = decide(dataclasses.replace(s, restart_slot=lambda: True))
    assert starts.action is Action.APPLY and starts.record.upgrade is not None
    assert starts.record.upgrade.step is UpgradeStep.STARTING
    assert holds_restart_slot(starts.record.upgrade, s.upgrade, late)
