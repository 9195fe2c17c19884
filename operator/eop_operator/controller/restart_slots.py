"""The operator's throttle on restarts for its own upgrade: at most N drivers at once.

A pipeline whose spec renders differently under this operator restarts in
``last-state`` (``reconcile.upgrade``), but only while it holds one of
``--operator-upgrade-parallelism`` slots.  A slot is held from the decision
that begins the restart until the new driver is Ready, or until a step (the
old driver's stop, the new one's start) has run for the readiness timeout
(``reconcile.upgrade.holds_restart_slot``), as the pipeline's own
``status.upgrade`` says: a driver pod that never goes holds no slot for ever.
Pipelines that wait are woken, oldest first, as slots free.

The count lives in this process: a step takes a slot synchronously, between
its decision and its first await, so two pipelines never take the last one.
Restarts under way when the operator starts (an operator replaced mid-upgrade)
are counted from the pipelines' statuses once, before the first slot is given.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from eop_operator.api.load import InvalidPipeline, validate_lenient
from eop_operator.api.models import UpgradeSpec, UpgradeStatus
from eop_operator.kube.observed import PipelineKey
from eop_operator.reconcile.upgrade import holds_restart_slot


def holds_slot(body: dict[str, Any], now: datetime.datetime) -> bool:
    """Whether a pipeline (as the watch has it) holds a restart slot per its status."""
    wal = (body.get("status") or {}).get("upgrade")
    if not wal:
        return False
    try:
        spec = (body.get("spec") or {}).get("upgrade") or {}
        upgrade = validate_lenient(UpgradeSpec, spec, ratchet=True).value
        return holds_restart_slot(UpgradeStatus.model_validate(wal), upgrade, now)
    except (ValidationError, InvalidPipeline):
        return False


class RestartSlots:
    """Operator-upgrade restarts under way, and the pipelines waiting for one."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("--operator-upgrade-parallelism must be at least 1")
        self.limit = limit
        self.taken: set[PipelineKey] = set()
        #: Pipelines waiting for a slot, oldest first (a dict keeps insertion order).
        self.waiting: dict[PipelineKey, None] = {}
        #: Waiting pipelines to look at now: a slot freed for them.
        self.woken: set[PipelineKey] = set()
        self.seeded = False

    def seed(self, pipelines: Iterable[tuple[PipelineKey, dict[str, Any]]]) -> None:
        """Count the restarts the statuses show under way (once, at the first use)."""
        if self.seeded:
            return
        self.seeded = True
        now = datetime.datetime.now(datetime.UTC)
        self.taken.update(key for key, body in pipelines if holds_slot(body, now))

    def free(self, key: PipelineKey) -> bool:
        """Whether ``key`` may begin (or go on with) an operator-upgrade restart now."""
        return key in self.taken or len(self.taken) < self.limit

    def update(self, key: PipelineKey, *, holds: bool, waits: bool = False) -> None:
        """What the last step of ``key`` decided: it holds a slot, or waits for one, or neither."""
        if waits:
            self.waiting.setdefault(key)
        else:
            self.waiting.pop(key, None)
        if holds:
            self.taken.add(key)
        elif key in self.taken:
            self.taken.discard(key)
            room = self.limit - len(self.taken)
            self.woken.update(list(self.waiting)[: max(room, 0)])

    def forget(self, key: PipelineKey) -> None:
        """A pipeline that is gone holds nothing and waits for nothing."""
        self.update(key, holds=False)
        self.woken.discard(key)

    def wake(self, key: PipelineKey) -> bool:
        """Whether a slot freed for ``key`` since it last looked (asked once)."""
        if key in self.woken:
            self.woken.discard(key)
            return True
        return False
