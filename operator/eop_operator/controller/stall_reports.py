"""The health monitor's stall verdicts, handed to the lifecycle, which alone restarts a driver.

The monitor (``controller.health_monitor``) only observes: when a check finds a Ready
driver with input waiting and ``G`` standing still for the stall timeout, it reports a
:class:`~eop_operator.reconcile.step_plan.Stall` here.  The pipeline's next lifecycle step
(at once, at the timer's next tick) takes the report, and its plan
(``reconcile.step_plan``) decides the restart: never while an upgrade is in flight (the
lifecycle owns the driver then).  The step that restarted says when here, and the monitor
counts a new driver's readiness from then on (no second restart of a driver just started).
"""

from __future__ import annotations

from eop_operator.kube.observed import PipelineKey
from eop_operator.reconcile.step_plan import Stall


class StallReports:
    """Stalls found and not yet acted on, and when each pipeline's driver was last restarted
    for one (epoch seconds). Lives in the operator's process, as the daemons and steps do."""

    def __init__(self) -> None:
        self._found: dict[PipelineKey, Stall] = {}
        self._restarted: dict[PipelineKey, float] = {}

    def report(self, key: PipelineKey, stall: Stall) -> None:
        """A check found the pipeline's driver stalled (the latest report replaces any)."""
        self._found[key] = stall

    def pending(self, key: PipelineKey) -> bool:
        """Whether a stall waits for the pipeline's next step."""
        return key in self._found

    def take(self, key: PipelineKey) -> Stall | None:
        """The stall to act on in this step, if any; taken once (a check that still finds
        the driver stalled reports it again)."""
        return self._found.pop(key, None)

    def restarted(self, key: PipelineKey, at: float) -> None:
        """A step restarted the pipeline's driver for a stall at ``at``."""
        self._restarted[key] = at

    def restarted_at(self, key: PipelineKey) -> float | None:
        """When the pipeline's driver was last restarted for a stall (None: not since the
        operator started, or since :meth:`forget`)."""
        return self._restarted.get(key)

    def forget(self, key: PipelineKey) -> None:
        """Drop what is known of a pipeline: gone, or suspended (a resumed one starts fresh)."""
        self._found.pop(key, None)
        self._restarted.pop(key, None)
