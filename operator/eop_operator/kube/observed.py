"""What the watches delivered, merged with the operator's own writes.

The lifecycle reads a pipeline, its StatefulSet, its pods and its other
children from here, not from the API server: kopf keeps an index per watched
kind (``controller.registration``), holding a slim copy of every object (:func:`slim`) keyed
by (namespace, pipeline).  A lifecycle step with nothing to do sends no
request.

A watch delivers the operator's own writes a moment after their responses.
The response of each apply and status patch is kept here (:class:`OwnWrites`,
one per operator run) and read instead of the watch's copy until the watch has delivered that
version or a newer one, or the object's deletion, and at most
``OWN_WRITES_SECONDS``: the step after an apply sees what it applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from eop_operator import KIND
from eop_operator.render.naming import PIPELINE_LABEL

#: (namespace, pipeline name): how every index is keyed.
PipelineKey = tuple[str, str]
#: A kopf index as the lifecycle reads it: pipeline -> the slim objects it holds.
WatchIndex = Mapping[PipelineKey, Iterable[dict[str, Any]]]
#: (kind, name) -> (uid, resourceVersion) of a pipeline's objects.
Versions = dict[tuple[str, str], tuple[str, str]]
#: The kinds the operator applies for a pipeline, each watched (``controller.registration``).
CHILD_KINDS = (
    "ConfigMap",
    "PersistentVolumeClaim",
    "ServiceAccount",
    "RoleBinding",
    "Service",
    "StatefulSet",
)
#: How long an own write may stand in for what the watch has not delivered yet.
OWN_WRITES_SECONDS = 30.0
#: Annotations the operator never reads and that can be large (a client-side apply's copy).
_UNREAD_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


def slim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of an object the operator reads; the rest stays out of its memory.

    Every kind keeps its metadata (no ``managedFields``); pipelines keep spec and
    status, StatefulSets their spec without the pod template's spec, and their
    status, pods their node and status, claims spec and status.  ConfigMaps, Services and
    the driver's RBAC keep only metadata: their versions tell the lifecycle
    whether anyone changed them.
    """
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    annotations = meta.get("annotations")
    if annotations and any(key in annotations for key in _UNREAD_ANNOTATIONS):
        meta["annotations"] = {k: v for k, v in annotations.items() if k not in _UNREAD_ANNOTATIONS}
    kind = obj.get("kind")
    kept: dict[str, Any] = {"apiVersion": obj.get("apiVersion"), "kind": kind, "metadata": meta}
    if kind in (KIND, "PersistentVolumeClaim"):
        kept.update(spec=obj.get("spec") or {}, status=obj.get("status") or {})
    elif kind == "StatefulSet":
        spec = dict(obj.get("spec") or {})
        template = spec.get("template") or {}
        spec["template"] = {"metadata": template.get("metadata") or {}}
        kept.update(spec=spec, status=obj.get("status") or {})
    elif kind == "Pod":
        node = (obj.get("spec") or {}).get("nodeName")
        if node:  # a driver lost with its node is named by it (reconcile.observe)
            kept["spec"] = {"nodeName": node}
        kept["status"] = obj.get("status") or {}
    return kept


def pipeline_key(obj: Mapping[str, Any]) -> PipelineKey | None:
    """The pipeline an object belongs to: itself, or the one its pipeline label names."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    name = (
        meta.get("name")
        if obj.get("kind") == KIND
        else (meta.get("labels") or {}).get(PIPELINE_LABEL)
    )
    return (str(namespace), str(name)) if namespace and name else None


def _ref(obj: Mapping[str, Any]) -> tuple[str, str]:
    return str(obj.get("kind")), str(obj["metadata"].get("name"))


def _version_of(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return str(meta.get("uid")), str(meta.get("resourceVersion"))


def _version(obj: Mapping[str, Any]) -> int | None:
    try:
        return int(obj["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return None


def caught_up(watched: Mapping[str, Any], written: Mapping[str, Any]) -> bool:
    """Whether the watch's copy is the written version or newer.

    resourceVersions are opaque to clients in general; the API server's are
    etcd revisions, which grow.  Any other form never counts as caught up, and
    the own write stands in until it expires.
    """
    seen, wrote = _version(watched), _version(written)
    same_object = watched["metadata"].get("uid") == written["metadata"].get("uid")
    return seen is not None and wrote is not None and same_object and seen >= wrote


@dataclass
class OwnWrites:
    """The API server's answers to the operator's writes, until the watches deliver them."""

    #: pipeline -> (kind, name) -> (event-loop time of the write, slim object).
    entries: dict[PipelineKey, dict[tuple[str, str], tuple[float, dict[str, Any]]]] = field(
        default_factory=dict
    )

    def record(self, obj: Mapping[str, Any], clock: float) -> None:
        """Remember the answer to a write (an apply or a patch), unless a newer one is kept.

        Answers to writes made at once (the lifecycle's and the health monitor's status
        writes) may arrive in any order: the newer version stays.
        """
        key = pipeline_key(obj)
        if key is None:
            return
        kept = self.entries.setdefault(key, {})
        ref = (str(obj["kind"]), str(obj["metadata"]["name"]))
        if ref in kept and caught_up(kept[ref][1], obj) and not caught_up(obj, kept[ref][1]):
            return
        kept[ref] = (clock, slim(obj))

    def forget(self, obj: Mapping[str, Any]) -> None:
        """A watch saw ``obj`` deleted: what the operator wrote of it is gone too."""
        key = pipeline_key(obj)
        kept = self.entries.get(key) if key else None
        meta = obj.get("metadata") or {}
        ref = (str(obj.get("kind")), str(meta.get("name")))
        if kept and ref in kept and kept[ref][1]["metadata"].get("uid") == meta.get("uid"):
            del kept[ref]

    def drop(self, key: PipelineKey) -> None:
        """Forget a pipeline that is gone."""
        self.entries.pop(key, None)

    def merged(
        self, key: PipelineKey, kind: str, watched: Iterable[dict[str, Any]], clock: float
    ) -> dict[str, dict[str, Any]]:
        """The objects of ``kind``, by name: the watch's, or a newer own write of each."""
        objects = {str(obj["metadata"]["name"]): obj for obj in watched}
        kept = self.entries.get(key)
        if not kept:
            return objects
        for (of_kind, name), (at, written) in list(kept.items()):
            if of_kind != kind:
                continue
            seen = objects.get(name)
            if clock - at > OWN_WRITES_SECONDS or (seen is not None and caught_up(seen, written)):
                del kept[(of_kind, name)]
            else:
                objects[name] = written
        if not kept:
            del self.entries[key]
        return objects


@dataclass(frozen=True)
class Observed:
    """The watches' view of pipelines and their children, and the operator's own writes."""

    pipelines: WatchIndex
    #: Every kind of child, and the driver pods.
    children: WatchIndex
    own: OwnWrites

    def pipeline(self, namespace: str, name: str, clock: float) -> dict[str, Any] | None:
        """The pipeline as last seen or written; None once the watch no longer has it.

        A pipeline is always seen by its watch before the operator writes to it,
        so one the watch has dropped is deleted, whatever was written before.
        """
        key = (namespace, name)
        watched = list(self.pipelines.get(key, ()))
        if not watched:
            self.own.drop(key)
            return None
        return self.own.merged(key, KIND, watched, clock).get(name)

    def objects(self, namespace: str, name: str, kind: str, clock: float) -> dict[str, Any]:
        """The pipeline's objects of ``kind`` (by name) as last seen or written."""
        key = (namespace, name)
        watched = (obj for obj in self.children.get(key, ()) if obj.get("kind") == kind)
        return self.own.merged(key, kind, watched, clock)

    def versions(self, namespace: str, name: str, clock: float) -> Versions:
        """What a lifecycle step reads of a pipeline: equal versions, nothing changed."""
        found = [self.pipeline(namespace, name, clock)]
        for kind in (*CHILD_KINDS, "Pod"):
            found += self.objects(namespace, name, kind, clock).values()
        return {_ref(obj): _version_of(obj) for obj in found if obj is not None}

    def written_since(self, namespace: str, name: str, clock: float) -> Versions:
        """The versions the operator wrote of a pipeline's objects since ``clock``."""
        kept = self.own.entries.get((namespace, name), {})
        return {ref: _version_of(obj) for ref, (at, obj) in kept.items() if at >= clock}

    def record(self, obj: Mapping[str, Any], clock: float) -> None:
        """Remember the answer to one of the operator's writes."""
        self.own.record(obj, clock)
