"""The one writer of a pipeline's ``.status``: every status write of the operator goes here.

Each field has one owner, the component that decides it; the owner's patch
model (:mod:`eop_operator.api.status_patch`) holds its fields and no others:

================================================  ==========================================
``status`` field                                  written by
================================================  ==========================================
``specHash``, ``appliedFingerprint``,             the lifecycle's decision
``checkpoint.generation``/``resetProgress``,      (``reconcile.upgrade``, a
``upgrade``, ``failover``, ``lastStableSpec``,    ``DecisionRecord``), before it acts:
``lastStableFingerprint``,                        the write-ahead log of an upgrade
``rolledBackFingerprint``, ``message``
``phase``, ``ready``, ``observedGeneration``,     the lifecycle's verdict on what it observed
``conditions``, ``executors``,                    (``reconcile.status``)
``executorSelector``
``checkpoint.path``, ``transactionalIdPrefix``,   the lifecycle: where and as whom the
``progressGroup``, ``commitMode``                 driver runs (recorded once, then checked)
``lag``, ``progress``                             the health monitor
                                                  (``controller.health_monitor``)
================================================  ==========================================

The first three rows are :class:`~eop_operator.api.status_patch.LifecyclePatch`,
the last :class:`~eop_operator.api.status_patch.HealthPatch`.  A write sends only
what changes (:func:`~eop_operator.api.status_patch.merge_patch`), and none when
nothing does; the API server's answer is remembered as an own write
(``kube.observed``), so the next lifecycle step reads what was written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from eop_operator import API_VERSION, KIND
from eop_operator.api.status_patch import HealthPatch, LifecyclePatch, merge_patch
from eop_operator.kube.client import KubeClient
from eop_operator.kube.observed import OwnWrites


class StatusWriter:
    """Writes the status patches of the lifecycle and of the health monitor."""

    def __init__(self, client: KubeClient, own_writes: OwnWrites) -> None:
        self._client = client
        self._own_writes = own_writes

    async def write(self, pipeline: Mapping[str, Any], patch: LifecyclePatch | HealthPatch) -> bool:
        """Write what ``patch`` changes in the status of ``pipeline`` (a body as last read).

        Returns whether anything was sent.  An API error (a 404 for a pipeline deleted
        meanwhile) is raised as ``KubeError``.
        """
        change = merge_patch(patch, pipeline.get("status") or {})
        if not change:
            return False
        meta = pipeline["metadata"]
        written = await self._client.patch(
            API_VERSION,
            KIND,
            meta["namespace"],
            meta["name"],
            {"status": change},
            subresource="status",
        )
        self._own_writes.record(written, asyncio.get_running_loop().time())
        return True
