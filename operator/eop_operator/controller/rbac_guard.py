"""In namespaced mode, the operator's rights in a namespace outlive the pipelines there.

Deleting a namespace deletes everything in it at once, in no order: the Role
and RoleBinding that give the operator its rights there may go before the
pipelines, whose finalizer then cannot run (the operator may no longer read
their children nor remove the finalizer), and the namespace would stay
``Terminating`` forever.

So while a served namespace holds a pipeline, the operator keeps the finalizer
:data:`GUARD` on its own Role and RoleBinding there (named by ``--rbac-name``,
which the chart sets in namespaced mode): objects being deleted still grant
their rights until their finalizers are gone.  When the namespace's last
pipeline is gone, the operator removes :data:`GUARD`, and a namespace being
deleted goes.

Removing the finalizers needs rights that outlive the Role: the chart's
ClusterRole ``NAME-guard`` (get and patch on those objects, by name), bound in
each served namespace by the RoleBinding ``NAME-guard``, which carries
:data:`GUARD` too and is released last.  With no pipeline in a namespace there
is no guard: ``helm uninstall`` after ``kubectl delete eop --all`` (as
docs/install.md says) leaves nothing behind.

Cluster-wide, the rights come from a ClusterRoleBinding, which no namespace's
deletion touches: nothing to guard.
"""

from __future__ import annotations

import logging
from typing import Any

from eop_operator import GROUP
from eop_operator.kube.client import KubeClient, KubeError

#: The finalizer on the operator's Role and RoleBinding of a namespace that holds pipelines.
GUARD = f"{GROUP}/pipelines"
RBAC = "rbac.authorization.k8s.io/v1"
#: Tries of one finalizer change that conflicts with another writer of the object.
TRIES = 3

log = logging.getLogger(__name__)


class RbacGuard:
    """Holds and releases :data:`GUARD` on the operator's Role and RoleBinding per namespace."""

    def __init__(self, client: KubeClient, name: str) -> None:
        """``name``: the Role's and the RoleBinding's name in every served namespace."""
        self.client = client
        #: What grants the operator its rights in a served namespace, released in this order:
        #: the guard's own binding last (its ClusterRole authorizes every release).
        self.guarded = (("Role", name), ("RoleBinding", name), ("RoleBinding", f"{name}-guard"))
        #: The namespaces whose guard this run has seen in place.
        self.held: set[str] = set()

    async def hold(self, namespace: str) -> None:
        """Put :data:`GUARD` on the Role and RoleBinding of ``namespace`` (once per run)."""
        if namespace in self.held:
            return
        self.held.add(namespace)  # tried once per run: a refusal must not hold pipelines back
        try:
            for kind, name in self.guarded:
                await self._change(namespace, kind, name, add=True)
        except (KubeError, OSError) as exc:
            log.warning(
                "could not put the finalizer %s on the operator's Role and RoleBindings in %s "
                "(deleting the namespace may then wait on its pipelines): %s",
                GUARD,
                namespace,
                exc,
            )

    async def release(self, namespace: str, pipeline_api: str, pipeline_kind: str) -> None:
        """Remove :data:`GUARD` from ``namespace``'s Role and RoleBinding if no pipeline is left.

        Called when a pipeline there is gone.  A failure is logged: the next pipeline
        gone from the namespace (or ``kubectl patch``) releases it.
        """
        self.held.discard(namespace)
        try:
            if await self.client.list_objects(pipeline_api, pipeline_kind, namespace):
                return
            for kind, name in self.guarded:
                await self._change(namespace, kind, name, add=False)
        except (KubeError, OSError) as exc:
            log.warning("could not release the finalizer %s in %s: %s", GUARD, namespace, exc)

    async def _change(self, namespace: str, kind: str, name: str, *, add: bool) -> None:
        for attempt in range(TRIES):
            found = await self.client.get(RBAC, kind, namespace, name)
            if found is None:
                return  # not the chart's (rbac.create=false, another name): nothing to guard
            meta: dict[str, Any] = found["metadata"]
            finalizers = list(meta.get("finalizers") or [])
            if (GUARD in finalizers) == add or (add and meta.get("deletionTimestamp")):
                return  # as wanted; or going already (a deleted object takes no new finalizer)
            wanted = [*finalizers, GUARD] if add else [f for f in finalizers if f != GUARD]
            patch = {"metadata": {"finalizers": wanted, "resourceVersion": meta["resourceVersion"]}}
            try:
                await self.client.patch(RBAC, kind, namespace, name, patch)
                return
            except KubeError as exc:
                if exc.status != 409 or attempt == TRIES - 1:
                    raise
