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

from eop_operator import KIND
from eop_operator.render import spec_hash
from eop_operator.render.naming import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PIPELINE_LABEL,
    RENDERED_HASH_ANNOTATION,
)

#: (kind, name): how a child is named among one pipeline's children.
ChildRef = tuple[str, str]
#: (uid, version) of a child as the operator applied it.
Version = tuple[str, str]


def child_ref(obj: Mapping[str, Any]) -> ChildRef:
    """(kind, name) of an object."""
    return str(obj["kind"]), str(obj["metadata"]["name"])


def _owner_uids(obj: Mapping[str, Any]) -> set[str]:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return {str(ref.get("uid")) for ref in refs}


class NotOwned(str):
    """A refused child: an object of its name exists that eop did not create for the pipeline
    (the pipeline is Degraded, reason ``ChildNotOwned``, until it is gone)."""


def foreign_child(live: Mapping[str, Any], rendered: Mapping[str, Any]) -> str | None:
    """Why ``live``, an existing object named as the ``rendered`` child, is not the pipeline's
    to change, or None when it is.

    The pipeline's own: owned by it (its uid in ``ownerReferences``), or left by eop for it, as a
    retained checkpoint claim is (eop's labels naming the pipeline, and no other controller).
    Anything else, another team's ConfigMap of the same name above all, is never written or
    adopted, so it never goes with the pipeline either (:class:`NotOwned`). A child of an
    earlier pipeline of the same name waits for the garbage collector (a plain refusal: the
    pipeline is not Degraded for it).
    """
    mine = _owner_uids(rendered)
    meta = live.get("metadata") or {}
    if mine & _owner_uids(live):
        return None
    labels = meta.get("labels") or {}
    controlled = any(ref.get("controller") for ref in meta.get("ownerReferences") or [])
    wanted = (rendered.get("metadata") or {}).get("labels") or {}
    if (
        not controlled
        and labels.get(MANAGED_BY_LABEL) == MANAGED_BY
        and labels.get(PIPELINE_LABEL) == wanted.get(PIPELINE_LABEL)
    ):
        return None
    kind, name = child_ref(live)
    earlier = [
        ref
        for ref in meta.get("ownerReferences") or []
        if ref.get("controller")
        and ref.get("kind") == KIND
        and ref.get("name") == labels.get(PIPELINE_LABEL) == wanted.get(PIPELINE_LABEL)
    ]
    if earlier:
        return (
            f"{kind} {name} is an earlier pipeline's of this name: applied once the garbage "
            "collector has deleted it"
        )
    return NotOwned(
        f"{kind} {name} exists and is not this pipeline's (eop did not create it for this "
        "pipeline): eop neither changes nor adopts it; remove or rename it, or rename the pipeline"
    )


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
