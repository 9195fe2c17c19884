"""Which children to apply: those missing, rendered differently, or changed by someone else.

Pure: rendered objects, the objects the watches show and what the operator
last applied in, a list of objects to apply out.  Each child the operator
applies carries the hash of what was rendered (``exactlyonce.io/rendered-hash``);
its version after the apply (``metadata.generation`` for a StatefulSet,
whose status changes all the time, else ``resourceVersion``) is remembered.
A child is in sync while it carries the hash of the current rendering and
nobody has written it since.  After an operator restart nothing is
remembered: a child carrying the right hash counts as in sync (the periodic
apply of every child catches what was edited meanwhile).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from eop_operator.render import spec_hash
from eop_operator.render.naming import RENDERED_HASH_ANNOTATION

#: (kind, name): how a child is named among one pipeline's children.
ChildRef = tuple[str, str]
#: (uid, version) of a child as the operator applied it.
Version = tuple[str, str]


def child_ref(obj: Mapping[str, Any]) -> ChildRef:
    """(kind, name) of an object."""
    return str(obj["kind"]), str(obj["metadata"]["name"])


def version_of(obj: Mapping[str, Any]) -> Version:
    """Identity and version of a child: what changes when anyone writes its spec or data."""
    meta = obj.get("metadata") or {}
    key = "generation" if obj.get("kind") == "StatefulSet" else "resourceVersion"
    return str(meta.get("uid", "")), str(meta.get(key, ""))


def stamp_rendered_hash(obj: dict[str, Any]) -> str:
    """Annotate ``obj`` with the hash of everything else in it; return the hash."""
    annotations = obj["metadata"].setdefault("annotations", {})
    annotations.pop(RENDERED_HASH_ANNOTATION, None)
    digest = spec_hash(obj)
    annotations[RENDERED_HASH_ANNOTATION] = digest
    return digest


@dataclass(frozen=True)
class SyncPlan:
    """The children to apply, and the versions newly known to be in sync."""

    apply: list[dict[str, Any]] = field(default_factory=list)
    #: Children found in sync that the operator had no version of (after a restart).
    verified: dict[ChildRef, Version] = field(default_factory=dict)


def plan_sync(
    rendered: Iterable[dict[str, Any]],
    live: Mapping[ChildRef, Mapping[str, Any]],
    applied: Mapping[ChildRef, Version],
) -> SyncPlan:
    """The rendered children (stamped, see :func:`stamp_rendered_hash`) not in sync with ``live``.

    A child is out of sync when it is missing or being deleted, when it carries
    another rendering's hash, or when its version differs from the one the
    operator applied (someone else wrote it).
    """
    plan = SyncPlan()
    for obj in rendered:
        ref = child_ref(obj)
        found = live.get(ref)
        wanted = obj["metadata"]["annotations"][RENDERED_HASH_ANNOTATION]
        if found is None or (found.get("metadata") or {}).get("deletionTimestamp"):
            plan.apply.append(obj)
            continue
        carried = ((found.get("metadata") or {}).get("annotations") or {}).get(
            RENDERED_HASH_ANNOTATION
        )
        if carried != wanted:
            plan.apply.append(obj)
        elif ref not in applied:
            plan.verified[ref] = version_of(found)
        elif applied[ref] != version_of(found):
            plan.apply.append(obj)
    return plan
