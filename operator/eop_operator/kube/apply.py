"""What the lifecycle sends besides the status: children, the RPC key, the list of warnings.

:func:`apply_children` applies a pipeline's rendered children, the driver's
StatefulSet last; :func:`ensure_rpc_secret` creates its Spark RPC key once;
:class:`WarningEvents` lists a namespace's Warning events for the conditions'
causes, at most every ``WARNINGS_SECONDS``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Mapping
from typing import Any

from eop_operator.api.models import ExactlyOncePipeline
from eop_operator.kube.client import KubeClient, KubeError
from eop_operator.reconcile.cadence import WARNINGS_SECONDS
from eop_operator.reconcile.children import ChildRef, NotOwned, child_ref, foreign_child
from eop_operator.reconcile.observe import WarningEvent
from eop_operator.render import rpc_secret
from eop_operator.render.executors import RPC_KEY_BYTES

log = logging.getLogger(__name__)


def _refused(exc: BaseException) -> bool:
    """An API server's "no" to this object (invalid, forbidden, immutable) or an object of its
    name that is not the pipeline's, not a passing fault."""
    if isinstance(exc, ForeignChild):
        return True
    return isinstance(exc, KubeError) and 400 <= exc.status < 500 and exc.status not in (408, 429)


def _refusal(obj: dict[str, Any], exc: BaseException) -> str:
    if isinstance(exc, ForeignChild):
        return exc.refusal
    return f"{obj['kind']} {obj['metadata']['name']}: {str(exc)[:300]}"


class ForeignChild(Exception):
    """An object of a child's name exists that eop did not create for the pipeline."""

    def __init__(self, refusal: str) -> None:
        super().__init__(refusal)
        self.refusal = refusal


async def _apply_own(
    client: KubeClient, obj: dict[str, Any], live: Mapping[ChildRef, Mapping[str, Any]]
) -> dict[str, Any]:
    """Apply ``obj`` unless an object of its name exists that is not the pipeline's.

    The watches show eop's children; an object they do not show is read first, so a server-side
    apply never takes over what someone else created under the child's name.
    """
    found = live.get(child_ref(obj))
    if found is None:
        meta = obj["metadata"]
        found = await client.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
    why = None if found is None else foreign_child(found, obj)
    if why is not None:
        raise ForeignChild(why)
    return await client.apply(obj)


async def apply_children(
    client: KubeClient,
    objects: list[dict[str, Any]],
    live: Mapping[ChildRef, Mapping[str, Any]],
    refused_before: tuple[str, ...] = (),
) -> tuple[dict[ChildRef, dict[str, Any]], tuple[str, ...]]:
    """Apply the children given; return the API server's answers and what it refused.

    ``live``: the pipeline's children the watches show. An object of a child's name that eop
    did not create for the pipeline is never written (:func:`foreign_child`): it counts as
    refused, and the status names it. ``refused_before``: what was refused already (the RPC
    key), returned first.

    Children do not block each other: a refused claim update (a size the
    StorageClass cannot expand) leaves the driver to start, and its readiness
    timeout and rollback still apply.  Only a refused ConfigMap holds the
    StatefulSet back: its pod would run the old ``run.json`` under the new
    spec hash, nor does an object of a child's name that is someone else's: its pod would
    mount or run as it.  Passing faults (5xx, time-outs) raise, and the step is retried.
    """
    supporting = [obj for obj in objects if obj["kind"] != "StatefulSet"]
    statefulsets = [obj for obj in objects if obj["kind"] == "StatefulSet"]
    # Everything the driver mounts or runs as goes first; the StatefulSet last,
    # so its pod never starts without its ConfigMap and claim.
    results = await asyncio.gather(
        *(_apply_own(client, obj, live) for obj in supporting), return_exceptions=True
    )
    applied: dict[ChildRef, dict[str, Any]] = {}
    refused: list[str] = list(refused_before)
    for obj, result in zip(supporting, results, strict=True):
        if isinstance(result, BaseException):
            if not _refused(result):
                raise result
            refused.append(_refusal(obj, result))
        else:
            applied[child_ref(obj)] = result
    for sts in statefulsets:
        if any(line.startswith("ConfigMap ") or isinstance(line, NotOwned) for line in refused):
            refused.append(
                f"StatefulSet {sts['metadata']['name']}: held back until what its pod mounts "
                "and runs as is applied"
            )
            continue
        try:
            applied[child_ref(sts)] = await _apply_own(client, sts, live)
        except (KubeError, ForeignChild) as exc:
            if not _refused(exc):
                raise
            refused.append(_refusal(sts, exc))
    return applied, tuple(refused)


async def ensure_rpc_secret(client: KubeClient, pipeline: ExactlyOncePipeline) -> tuple[str, ...]:
    """Create the pipeline's RPC key Secret with a new random key, unless it exists.

    Created, never applied: an existing key stays as it is (a running driver and the
    executors it starts later must read the same one), and the operator never reads it.
    Returns what the API server refused (the driver then waits for the Secret to mount).
    """
    secret = rpc_secret(pipeline, secrets.token_bytes(RPC_KEY_BYTES))
    try:
        await client.create(secret)
    except KubeError as exc:
        if exc.status == 409:  # AlreadyExists: the pipeline's key, unless someone else's Secret
            return await _foreign_secret(client, secret)
        if not _refused(exc):
            raise
        return (_refusal(secret, exc),)
    return ()


async def _foreign_secret(client: KubeClient, secret: dict[str, Any]) -> tuple[str, ...]:
    """The refusal when the existing Secret of the key's name is not the pipeline's: its
    driver would mount another's Secret as its key. Unread (no ``get`` on Secrets: the chart's
    ``rbac.readSecrets`` false), it is taken for the pipeline's."""
    meta = secret["metadata"]
    try:
        found = await client.get("v1", "Secret", meta["namespace"], meta["name"])
    except KubeError as exc:
        if exc.status != 403:
            raise
        return ()
    why = None if found is None else foreign_child(found, secret)
    return () if why is None else (why,)


class WarningEvents:
    """The namespaces' Warning events: one list at a time, at most every ``WARNINGS_SECONDS``.

    An operator start looks at all pipelines of a namespace at once: they share one list.
    """

    def __init__(self) -> None:
        #: The last list per namespace (event-loop time, the list under way or done).
        self._lists: dict[str, tuple[float, asyncio.Future[list[WarningEvent]]]] = {}

    async def of(self, client: KubeClient, namespace: str, clock: float) -> list[WarningEvent]:
        """The Warning events of ``namespace``, listed again when the last list is too old."""
        cached = self._lists.get(namespace)
        if cached is None or clock - cached[0] >= WARNINGS_SECONDS:
            for stale in [
                ns for ns, (at, _) in self._lists.items() if clock - at >= WARNINGS_SECONDS
            ]:
                del self._lists[stale]  # no pipeline of these namespaces waits for its driver now
            cached = (clock, asyncio.ensure_future(_list_warnings(client, namespace)))
            self._lists[namespace] = cached
        try:
            return await asyncio.shield(cached[1])
        except BaseException:
            if self._lists.get(namespace) is cached:
                del self._lists[namespace]  # a failed list is not kept: the next step lists again
            raise


async def _list_warnings(client: KubeClient, namespace: str) -> list[WarningEvent]:
    try:
        events = await client.list_objects("v1", "Event", namespace, field_selector="type=Warning")
    except KubeError as exc:
        if exc.status != 403:
            raise
        # An older chart's RBAC: the status says less, the lifecycle goes on.
        log.warning("cannot list events in %s (%s): conditions give fewer causes", namespace, exc)
        events = []
    return [WarningEvent.from_event(event) for event in events]
