"""A pipeline being deleted never hangs its namespace, and gives up only its own references."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from eop_operator.controller.context import Context, OperatorOptions
from eop_operator.controller.finalizer import honour_retention
from eop_operator.kube.client import KubeClient, KubeError
from eop_operator.reconcile.deletion import release_patch


class _Cluster:
    """The few requests the finalizer sends, answered from a dict; events are recorded."""

    def __init__(self, objects: dict[tuple[str, str], dict[str, Any]], refuse: int = 0) -> None:
        self.objects = objects
        self.refuse = refuse
        self.events: list[dict[str, Any]] = []

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        return self.objects.get((kind, name))

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] == "Event":
            self.events.append(obj)
        elif self.refuse:
            raise KubeError(
                self.refuse, f'namespace "{obj["metadata"]["namespace"]}" is being terminated'
            )
        else:
            self.objects[(obj["kind"], obj["metadata"]["name"])] = obj
        return obj


def _deleting(manifest: dict[str, Any]) -> dict[str, Any]:
    manifest["spec"]["image"] = "eop-spark:1"
    manifest["spec"]["checkpoint"] = {"uri": "s3a://bucket/p", "retention": "Delete"}
    return manifest


def _finalize(cluster: _Cluster, body: dict[str, Any]) -> None:
    context = Context.of(OperatorOptions(), cast(KubeClient, cluster))
    asyncio.run(honour_retention(context, body))


def test_a_failed_checkpoint_deletion_keeps_the_checkpoint_and_lets_the_pipeline_go(
    manifest: dict[str, Any],
) -> None:
    """The Job's own retries bound the wait: once it failed, the pipeline goes (no retry)."""
    failed = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
    job = {
        "metadata": {"ownerReferences": [{"uid": "uid-1"}]},
        "status": {"conditions": [failed]},
    }
    cluster = _Cluster({("Job", "clean-checkpoint-delete"): job})
    _finalize(cluster, _deleting(manifest))  # returns: kopf removes the finalizer
    (event,) = cluster.events
    assert event["reason"] == "CheckpointDeletionFailed" and event["type"] == "Warning"
    assert "the checkpoint is kept and the pipeline goes" in event["message"]


@pytest.mark.parametrize("status", [403, 422])
def test_a_job_the_api_server_refuses_keeps_the_checkpoint_and_lets_the_pipeline_go(
    manifest: dict[str, Any], status: int
) -> None:
    """A namespace being deleted refuses the Job: its pipelines never hold it up."""
    cluster = _Cluster({}, refuse=status)
    _finalize(cluster, _deleting(manifest))
    (event,) = cluster.events
    assert event["reason"] == "CheckpointRetained" and "is being terminated" in event["message"]


def test_someone_elses_job_of_the_name_is_left_alone(manifest: dict[str, Any]) -> None:
    theirs = {"metadata": {"ownerReferences": [{"kind": "CronJob", "name": "x", "uid": "u9"}]}}
    cluster = _Cluster({("Job", "clean-checkpoint-delete"): theirs})
    _finalize(cluster, _deleting(manifest))
    (event,) = cluster.events
    assert "exists and is not this pipeline's" in event["message"]


def test_the_finalizer_releases_only_the_pipelines_own_reference() -> None:
    backup = {"apiVersion": "v1", "kind": "ConfigMap", "name": "keeper", "uid": "u2"}
    claim = {
        "metadata": {"resourceVersion": "7", "ownerReferences": [{"uid": "uid-1"}, backup]},
    }
    patch = release_patch(claim, "uid-1")
    assert patch == {"metadata": {"ownerReferences": [backup], "resourceVersion": "7"}}
    assert release_patch({"metadata": {"ownerReferences": [backup]}}, "uid-1") is None


class _ChangingClaim(_Cluster):
    """A retained claim that changes under the finalizer ``conflicts`` times (HTTP 409), as its
    protection finalizer or a namespace being deleted change it."""

    def __init__(self, objects: dict[tuple[str, str], dict[str, Any]], conflicts: int) -> None:
        super().__init__(objects)
        self.conflicts = conflicts

    async def patch(
        self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        if self.conflicts:
            self.conflicts -= 1
            raise KubeError(409, f'Operation cannot be fulfilled on {kind} "{name}"')
        self.objects[(kind, name)]["metadata"].update(patch["metadata"])
        return self.objects[(kind, name)]


def test_a_retained_claim_that_changes_meanwhile_is_released_at_once(
    manifest: dict[str, Any],
) -> None:
    """A conflict is read again and retried now: kopf's own retry would come a minute later,
    and the namespace being deleted would wait for it."""
    name, uid = manifest["metadata"]["name"], "uid-1"
    body = {**manifest, "metadata": {**manifest["metadata"], "namespace": "ns", "uid": uid}}
    claim = {"metadata": {"ownerReferences": [{"uid": uid}], "resourceVersion": "7"}}
    cluster = _ChangingClaim({("PersistentVolumeClaim", f"{name}-checkpoint"): claim}, 2)
    _finalize(cluster, body)
    assert claim["metadata"]["ownerReferences"] is None
    (event,) = cluster.events
    assert event["reason"] == "CheckpointRetained"


class _DeletedClaim(_Cluster):
    """A retained claim that the namespace controller deletes between its read and the
    finalizer's patch."""

    async def patch(self, api_version: str, kind: str, namespace: str, name: str, _: Any) -> Any:
        del self.objects[(kind, name)]
        raise KubeError(404, f'{kind.lower()}s "{name}" not found')


@pytest.mark.parametrize("gone", ["before its read", "between its read and the patch"])
def test_a_retained_claim_deleted_with_its_namespace_lets_the_pipeline_go_at_once(
    manifest: dict[str, Any], gone: str
) -> None:
    """A namespace being deleted takes the claim too: nothing is left to release, and the
    pipeline must not wait for kopf's next try a minute later (its namespace would)."""
    name, uid = manifest["metadata"]["name"], "uid-1"
    body = {**manifest, "metadata": {**manifest["metadata"], "namespace": "ns", "uid": uid}}
    claim = {"metadata": {"ownerReferences": [{"uid": uid}], "resourceVersion": "7"}}
    ref = ("PersistentVolumeClaim", f"{name}-checkpoint")
    cluster = _DeletedClaim({} if gone == "before its read" else {ref: claim})
    _finalize(cluster, body)  # returns: kopf removes the finalizer
    (event,) = cluster.events
    assert event["reason"] == "CheckpointGone" and f"{name}-checkpoint" in event["message"]
