"""Which children the operator applies: missing, rendered differently, or written by others."""

from __future__ import annotations

import copy
from typing import Any

from eop_operator.reconcile.children import (
    NotOwned,
    child_ref,
    foreign_child,
    plan_sync,
    stamp_rendered_hash,
    version_of,
)
from eop_operator.render.naming import RENDERED_HASH_ANNOTATION


def _rendered(kind: str, name: str, **fields: Any) -> dict[str, Any]:
    obj = {"apiVersion": "v1", "kind": kind, "metadata": {"name": name}, **fields}
    stamp_rendered_hash(obj)
    return obj


def _live(rendered: dict[str, Any], uid: str = "u1", version: str = "7") -> dict[str, Any]:
    """What the API server answers: the rendered object, with identity and versions."""
    obj = copy.deepcopy(rendered)
    obj["metadata"].update(uid=uid, resourceVersion=version, generation=1)
    obj["status"] = {"replicas": 0}
    return obj


CONFIG = _rendered("ConfigMap", "p-config", data={"run.json": "{}"})
DRIVER = _rendered("StatefulSet", "p-driver", spec={"replicas": 1})


def test_the_hash_covers_everything_rendered_but_itself() -> None:
    again = _rendered("ConfigMap", "p-config", data={"run.json": "{}"})
    assert again == CONFIG  # stable: the same rendering, the same hash
    edited = _rendered("ConfigMap", "p-config", data={"run.json": '{"generation": 1}'})
    hashes = {o["metadata"]["annotations"][RENDERED_HASH_ANNOTATION] for o in (CONFIG, edited)}
    assert len(hashes) == 2
    restamped = copy.deepcopy(CONFIG)
    assert (
        stamp_rendered_hash(restamped)
        == CONFIG["metadata"]["annotations"][RENDERED_HASH_ANNOTATION]
    )


def test_children_in_sync_are_not_applied() -> None:
    live = {child_ref(o): _live(o) for o in (CONFIG, DRIVER)}
    applied = {ref: version_of(obj) for ref, obj in live.items()}
    assert plan_sync([CONFIG, DRIVER], live, applied).apply == []


def test_missing_or_deleting_children_are_applied() -> None:
    deleting = _live(DRIVER)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    live = {child_ref(DRIVER): deleting}
    assert plan_sync([CONFIG, DRIVER], live, {}).apply == [CONFIG, DRIVER]


def test_a_child_rendered_differently_is_applied() -> None:
    old = _live(_rendered("ConfigMap", "p-config", data={"run.json": '{"old": 1}'}))
    live = {child_ref(CONFIG): old}
    assert plan_sync([CONFIG], live, {child_ref(CONFIG): version_of(old)}).apply == [CONFIG]


def test_a_child_written_by_someone_else_is_applied() -> None:
    mine = _live(CONFIG, version="7")
    theirs = _live(CONFIG, version="9")  # kubectl edit: same hash annotation, new version
    plan = plan_sync([CONFIG], {child_ref(CONFIG): theirs}, {child_ref(CONFIG): version_of(mine)})
    assert plan.apply == [CONFIG]
    recreated = _live(CONFIG, uid="u2", version="7")  # deleted and made again by someone
    plan = plan_sync(
        [CONFIG], {child_ref(CONFIG): recreated}, {child_ref(CONFIG): version_of(mine)}
    )
    assert plan.apply == [CONFIG]


def test_a_statefulset_counts_spec_writes_not_its_controllers_status() -> None:
    applied = {child_ref(DRIVER): version_of(_live(DRIVER, version="7"))}
    status_update = _live(DRIVER, version="12")  # the controller's status: generation stays
    assert plan_sync([DRIVER], {child_ref(DRIVER): status_update}, applied).apply == []
    scaled = _live(DRIVER, version="13")
    scaled["metadata"]["generation"] = 2  # kubectl scale
    assert plan_sync([DRIVER], {child_ref(DRIVER): scaled}, applied).apply == [DRIVER]


def test_after_a_restart_children_carrying_the_hash_are_taken_as_in_sync() -> None:
    live = {child_ref(o): _live(o) for o in (CONFIG, DRIVER)}
    plan = plan_sync([CONFIG, DRIVER], live, {})
    assert plan.apply == []
    assert plan.verified == {ref: version_of(obj) for ref, obj in live.items()}
    unstamped = _live(CONFIG)
    del unstamped["metadata"]["annotations"][RENDERED_HASH_ANNOTATION]  # an older operator's
    assert plan_sync([CONFIG], {child_ref(CONFIG): unstamped}, {}).apply == [CONFIG]


# --- what is the pipeline's to change --------------------------------------------------------

_OWNER = {"apiVersion": "exactlyonce.io/v1alpha1", "kind": "ExactlyOncePipeline", "name": "p"}
_EOP_LABELS = {"app.kubernetes.io/managed-by": "eop-operator", "exactlyonce.io/pipeline": "p"}


def _child(uid: str | None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p-config", "labels": labels or {}}
    if uid is not None:
        meta["ownerReferences"] = [{**_OWNER, "uid": uid, "controller": True}]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}


RENDERED = _child("pipeline-uid", _EOP_LABELS)


def test_a_child_the_pipeline_owns_or_eop_retained_for_it_is_its_own() -> None:
    assert foreign_child(_child("pipeline-uid", _EOP_LABELS), RENDERED) is None
    # A checkpoint claim kept (retention Retain) after an earlier pipeline of the name went.
    assert foreign_child(_child(None, _EOP_LABELS), RENDERED) is None


def test_another_teams_object_of_a_childs_name_is_never_the_pipelines() -> None:
    """A ConfigMap another team made, or one another pipeline (or anything else) controls,
    even with eop's labels, is named and never written."""
    other = _child("other-uid", {**_EOP_LABELS, "exactlyonce.io/pipeline": "other"})
    other["metadata"]["ownerReferences"][0]["name"] = "other"
    for live in (_child(None), _child(None, other["metadata"]["labels"]), other):
        refusal = foreign_child(live, RENDERED)
        assert isinstance(refusal, NotOwned)
        assert refusal.startswith("ConfigMap p-config exists and is not this pipeline's")


def test_an_earlier_pipelines_child_of_the_name_waits_for_the_garbage_collector() -> None:
    """Deleted and created again under its name: the earlier pipeline's children are not
    written, but they are no reason to call the new one Degraded."""
    refusal = foreign_child(_child("earlier-pipeline-uid", _EOP_LABELS), RENDERED)
    assert refusal is not None and not isinstance(refusal, NotOwned)
    assert "earlier pipeline's of this name" in refusal
