"""The lifecycle loop: each pipeline's steps, one at a time, until the next is to wait.

Every trigger (a pipeline event, a child or driver pod event, the pipeline's
timer) calls :meth:`Lifecycle.drive`.  It takes steps (``controller.step``)
while they act, skips a step whose inputs did not change since the last one,
and remembers when the next look is due, which the timer asks
(:meth:`Lifecycle.due`; the cadence is in ``reconcile.cadence``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from eop_operator import metrics
from eop_operator.api.load import InvalidPipeline
from eop_operator.api.resolve import IdentityChanged
from eop_operator.controller.cluster_gate import ClusterGate
from eop_operator.controller.context import Context
from eop_operator.controller.lifecycle_status import (
    refuse,
    report_step_failure,
    step_failure_message,
)
from eop_operator.controller.step import Memory, Renderer, take_step, warn_lenient
from eop_operator.controller.subject import Subject
from eop_operator.kube.client import is_transient
from eop_operator.kube.observed import Observed, PipelineKey
from eop_operator.reconcile.cadence import LOOK_SECONDS, POLL_SECONDS, first_verify_in
from eop_operator.render import MissingImage

#: Steps per :meth:`Lifecycle.drive` call before it yields to the next trigger.
MAX_STEPS = 6
#: Failed steps in a row, with one error, after which the status and an event say so: one
#: failure may be a race that the next look does not meet.
FAILURES_REPORTED_FROM = 2

log = logging.getLogger(__name__)


class Lifecycle:
    """Drives every pipeline's lifecycle; holds what it remembers of each between steps."""

    def __init__(self, context: Context, gate: ClusterGate | None = None) -> None:
        """``gate``: what the clusters say is asked before each step renders (None: nothing)."""
        self.context = context
        self.gate = gate
        #: One step at a time per pipeline: every trigger calls :meth:`drive`.
        self.locks: dict[PipelineKey, asyncio.Lock] = {}
        self.memories: dict[PipelineKey, Memory] = {}
        #: Set once the operator stops: no further step is taken.
        self.stopping = False

    def _memory(self, key: PipelineKey, clock: float) -> Memory:
        memory = self.memories.get(key)
        if memory is None:
            memory = self.memories[key] = Memory(verify_at=clock + first_verify_in(*key))
        return memory

    def forget(self, key: PipelineKey) -> None:
        """Drop what is remembered of a pipeline that is gone or going."""
        self.locks.pop(key, None)
        self.memories.pop(key, None)
        self.context.own_writes.drop(key)
        self.context.slots.forget(key)
        self.context.stalls.forget(key)

    def due(self, key: PipelineKey) -> bool:
        """Whether the timer should look at the pipeline now (its last step said when, a
        restart slot freed for it, or the health monitor found its driver stalled)."""
        memory = self.memories.get(key)
        woken = self.context.slots.wake(key) or self.context.stalls.pending(key)
        if memory is not None and woken:
            memory.look_at = 0.0
        return memory is None or asyncio.get_running_loop().time() >= memory.look_at

    async def quiesce(self, timeout: float) -> bool:
        """Take no new step; wait up to ``timeout`` for the steps under way.

        The operator calls this before it closes its API client: kopf abandons a
        timer that is mid-step when the operator exits, and that step would
        otherwise fail on the closed client.  Returns False if a step outlasted
        ``timeout``.
        """
        self.stopping = True

        async def settle() -> None:
            for lock in list(self.locks.values()):
                async with lock:
                    pass

        try:
            await asyncio.wait_for(settle(), timeout)
        except TimeoutError:
            return False
        return True

    async def _failed(self, memory: Memory, body: dict[str, Any], exc: Exception) -> None:
        """Count a failed step; the second in a row with the same error that is not the API
        server's or the network's passing trouble is reported (``report_step_failure``), so
        that an error no retry cures (a render error) does not leave a stale status behind."""
        if is_transient(exc):
            return
        message = step_failure_message(exc)
        said, times = memory.failure
        memory.failure = (message, times + 1 if said == message else 1)
        if memory.failure[1] < FAILURES_REPORTED_FROM:
            return
        try:
            await report_step_failure(self.context, body, message)
        except Exception as report:  # the API server may be what fails: say so, raise exc
            log.warning("cannot report the failed step of %s: %s", body["metadata"]["name"], report)

    async def drive(
        self,
        observed: Observed,
        key: PipelineKey,
        render: Renderer,
        *,
        invalid: tuple[type[Exception], ...] = (),
        pod: dict[str, Any] | None = None,
    ) -> float | None:
        """Take the pipeline's lifecycle steps until the next one is to wait.

        Reads what the watches delivered (``observed``).  Returns how long until the
        next look (also what :meth:`due` tells the timer), None for a pipeline that is
        gone.  An invalid spec (or an ``invalid`` extra error of ``render``) is refused
        (``controller.lifecycle_status.refuse``).  ``pod`` is a driver pod from a watch event: it
        may be gone already, and its termination still counts.
        """
        namespace, name = key
        refusable: tuple[type[Exception], ...] = (
            InvalidPipeline,
            IdentityChanged,
            MissingImage,
            *invalid,
        )
        lock = self.locks.setdefault(key, asyncio.Lock())
        async with lock:
            for _ in range(MAX_STEPS):
                if self.stopping:
                    return None
                clock = asyncio.get_running_loop().time()
                body = observed.pipeline(namespace, name, clock)
                if body is None or body["metadata"].get("deletionTimestamp"):
                    self.forget(key)
                    return None
                memory = self._memory(key, clock)
                seen = observed.versions(namespace, name, clock)
                stalled = self.context.stalls.pending(key)
                if seen == memory.seen and clock < memory.look_at and not stalled:
                    # Nothing changed since the last step and nothing is due: it would decide
                    # the same (the echo of the operator's own write, a timer tick).
                    return memory.look_at - clock
                memory.look_at = 0.0  # a step that fails is tried again at the next tick
                try:
                    subject = Subject.read(body)
                    await warn_lenient(self.context, subject, memory)
                    if self.gate is not None:  # before anything is rendered or applied
                        await self.gate.admit(body, subject.pipeline)
                    departed = [pod] if pod else []
                    wait = await take_step(
                        self.context, observed, subject, render, memory, departed
                    )
                except refusable as exc:
                    metrics.record_reconcile_failure(namespace, name, exc)
                    self.context.slots.update(key, holds=False)  # it waits for its user now
                    await refuse(self.context, body, exc)
                    wait = LOOK_SECONDS  # what made it invalid may go (another pipeline's claim)
                except Exception as exc:  # kopf logs it and tries again at the next trigger
                    metrics.record_reconcile_failure(namespace, name, exc)
                    await self._failed(memory, body, exc)
                    raise
                memory.failure = ("", 0)
                if wait is not None:
                    # What the step read, as its own writes left it: whatever else changed
                    # meanwhile (an event during the step) is news for the next trigger.
                    memory.seen = {**seen, **observed.written_since(namespace, name, clock)}
                    memory.look_at = clock + wait
                    return wait
        memory.look_at = clock + POLL_SECONDS
        return POLL_SECONDS
