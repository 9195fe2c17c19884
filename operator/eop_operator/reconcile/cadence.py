"""When the operator looks at a pipeline again: every interval of the lifecycle, in one place.

A *look* is one lifecycle step (``controller.lifecycle``): read what the
watches delivered, decide, write the status, act.  A pipeline is looked at

* on every event of the pipeline, of one of its children or of its driver pod
  (a look whose inputs did not change since the last one is skipped), and
* when its next look is due.  Each look ends by naming the next one
  (:func:`next_look`): the earliest of

  - what the decision asks (``Decision.requeue_after``): ``POLL_SECONDS`` while
    an old driver's pods go or a claim is deleted, what is left of an upgrade's
    readiness timeout (at least ``POLL_SECONDS``, at most ``UPGRADE_WAIT_SECONDS``),
    a restart backoff (``status.upgrade.notBefore``);
  - ``LOOK_SECONDS`` while the driver does not run (a new cause may show),
    ``SETTLED_SECONDS`` while it does;
  - a child out of sync again within ``HEAL_SECONDS`` of the last heal, and
    each pipeline's apply of every child every ``VERIFY_SECONDS``;
  - the moment a restarted driver counts as running again
    (``reconcile.observe.RECOVERY_SECONDS`` after its restart).

  A look that just applied children waits ``CONTROLLER_SECONDS`` for the
  StatefulSet controller's word; a look that acted (applied, scaled to zero)
  looks again at once.

Each pipeline's timer ticks every ``TIMER_SECONDS`` and takes the look when it
is due: that is the resolution of every interval above.  A look that fails (an
API error) is taken again at the timer's next tick (``RETRY_SECONDS``, kopf's
backoff of the timer).  The health monitor has its own cadence,
``spec.health.checkInterval`` (``controller.health_monitor``).
"""

from __future__ import annotations

import hashlib
import math

#: How often each pipeline's timer asks whether its next look is due.
TIMER_SECONDS = 5.0
#: After a failed look (an API error), the next try; kopf's default is 60 s, and while an
#: upgrade waits for its own apply no event would come to drive it sooner.
RETRY_SECONDS = 5.0
#: How soon to look again while waiting for pods to go or to get Ready.
POLL_SECONDS = 2.0
#: The longest an upgrade waiting for its driver to get Ready goes without a look.
UPGRADE_WAIT_SECONDS = 30.0
#: A pipeline whose driver does not run is looked at this often without events (the
#: namespace's Warning events, listed at most as often, may name a new cause).
LOOK_SECONDS = 10.0
#: A running pipeline is looked at this often without events.
SETTLED_SECONDS = 60.0
#: A child deleted or changed by hand is applied again at once, and then at most this
#: often per pipeline (another controller fighting over a field gets no loop).
HEAL_SECONDS = 10.0
#: Every child is applied again this often whatever it looks like: what was edited while
#: the operator was down comes back too.  Each pipeline's first time is spread over it.
VERIFY_SECONDS = 600.0
#: After an apply, the StatefulSet controller's word is awaited this long before the
#: status describes a StatefulSet it has not seen yet.
CONTROLLER_SECONDS = 2.0
#: The namespace's Warning events are listed at most this often (all its pipelines share
#: the list: a burst of new pipelines would list them at every look).
WARNINGS_SECONDS = 10.0


def next_look(*deadlines: float) -> float:
    """Seconds until the next look: the earliest deadline still ahead (inf: none)."""
    return min((d for d in deadlines if d > 0), default=math.inf)


def first_verify_in(namespace: str, name: str) -> float:
    """Seconds from the operator's first look at a pipeline to its first apply of every child.

    Spread over ``VERIFY_SECONDS`` by the pipeline's name: an operator start looks at all
    pipelines at once, and would otherwise apply all of their children again at once.
    """
    offset = int(hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:8], 16)
    return float(offset % int(VERIFY_SECONDS))
