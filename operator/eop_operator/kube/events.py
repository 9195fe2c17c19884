"""Kubernetes events on a pipeline: the operator's decisions, where `kubectl describe` shows them.

The operator posts its own events rather than kopf's log-to-event bridge, so
the events carry eop's reasons (Submitted, Upgrading, Upgraded, RolledBack, FellBack,
Restarted, Suspended, Resumed, Degraded, InvalidSpec, CheckpointRetained, ...: see
docs/lifecycle.md) and kopf's per-handler chatter stays in the operator's log.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

from eop_operator.kube.client import KubeClient, KubeError

#: The component name shown in the events' Source/From column.
COMPONENT = "eop-operator"

log = logging.getLogger(__name__)


def render_event(
    involved: Mapping[str, Any], *, type: str, reason: str, message: str, now: datetime.datetime
) -> dict[str, Any]:
    """A core/v1 Event about ``involved`` (a pipeline body)."""
    meta = involved["metadata"]
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": involved["apiVersion"],
            "kind": involved["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "type": type,
        "reason": reason,
        # The API server limits messages to 1 KiB.
        "message": message[:1024],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


async def post_event(
    client: KubeClient, involved: Mapping[str, Any], *, type: str, reason: str, message: str
) -> None:
    """Post an event; a failure is logged, never raised (events are best effort)."""
    event = render_event(
        involved,
        type=type,
        reason=reason,
        message=message,
        now=datetime.datetime.now(datetime.UTC),
    )
    try:
        await client.create(event)
    except (KubeError, OSError) as exc:
        log.warning("could not post event %s: %s", reason, exc)
