"""The operator's throttle on restarts for its own upgrade (``controller.restart_slots``)."""

from __future__ import annotations

import datetime

import pytest

from eop_operator.controller.restart_slots import RestartSlots
from eop_operator.reconcile.failover import stamp

A, B, C = ("ns", "a"), ("ns", "b"), ("ns", "c")


def test_at_most_the_limit_restart_and_the_oldest_waiter_is_woken_when_one_ends() -> None:
    slots = RestartSlots(1)
    assert slots.free(A)
    slots.update(A, holds=True)
    assert slots.free(A) and not slots.free(B)
    slots.update(B, holds=False, waits=True)
    slots.update(C, holds=False, waits=True)
    slots.update(B, holds=False, waits=True)  # looked again: still the oldest
    assert not slots.wake(B)
    slots.update(A, holds=False)  # A's new driver is Ready
    assert slots.wake(B) and not slots.wake(B) and not slots.wake(C)
    assert slots.free(B)
    slots.update(B, holds=True)
    assert not slots.free(C)
    slots.forget(B)  # deleted mid-restart: its slot frees
    assert slots.wake(C) and slots.free(C)


def test_restarts_under_way_when_the_operator_starts_are_counted() -> None:
    now = stamp(datetime.datetime.now(datetime.UTC))
    wal = {
        "toHash": "h",
        "mode": "last-state",
        "step": "Starting",
        "generation": 0,
        "reason": "OperatorUpgrade",
        "startedAt": now,
    }
    slots = RestartSlots(2)
    # A's spec has a field of a newer operator (this one was rolled back): it still counts.
    newer = {"upgrade": {"mode": "last-state", "drainTimeout": "30s"}}
    slots.seed(
        [
            (A, {"spec": newer, "status": {"upgrade": wal}}),
            (B, {"spec": {}, "status": {"upgrade": {**wal, "reason": "SpecChanged"}}}),
            (C, {"spec": {}, "status": {}}),
        ]
    )
    assert slots.taken == {A}
    slots.seed([(B, {"spec": {}, "status": {"upgrade": wal}})])  # once only
    assert slots.taken == {A}


def test_the_limit_is_at_least_one() -> None:
    with pytest.raises(ValueError, match="operator-upgrade-parallelism"):
        RestartSlots(0)


def test_a_stuck_stop_frees_its_slot_for_the_pipeline_waiting() -> None:
    began = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=10)
    stuck = {
        "spec": {"upgrade": {"readinessTimeout": "5m"}},
        "status": {
            "upgrade": {
                "toHash": "h",
                "mode": "last-state",
                "step": "Stopping",
                "generation": 0,
                "reason": "OperatorUpgrade",
                "startedAt": stamp(began),
                "beganAt": stamp(began),
            }
        },
    }
    slots = RestartSlots(1)
    slots.seed([(A, stuck)])  # a stop that has not ended for 10 minutes holds nothing
    assert slots.taken == set() and slots.free(B)
