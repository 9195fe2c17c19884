"""An operator reads what other operator versions wrote: unknown fields, tightened rules.

A rolled-back operator meets objects (and status) written for its successor; a new operator
meets specs accepted under rules it has since tightened.  Neither turns a running pipeline
``Invalid`` nor erases what it does not know.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from eop_operator.api.load import InvalidPipeline, load_pipeline, load_stored
from eop_operator.controller.context import Context, OperatorOptions
from eop_operator.controller.lifecycle import Lifecycle
from eop_operator.kube.observed import Observed, OwnWrites
from eop_operator.render import render_pipeline

#: A condition a newer operator writes, of a type this one does not know.
FOREIGN_CONDITION = {
    "type": "Autoscaled",
    "status": "True",
    "reason": "Scaled",
    "message": "3 executors",
    "lastTransitionTime": "2026-01-01T00:00:00Z",
}


class _Recording:
    """An API server that accepts every write and records it."""

    def __init__(self) -> None:
        self.applied: list[str] = []
        self.status: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []

    async def patch(self, api_version: str, kind: str, *args: Any, **kwargs: Any) -> Any:
        namespace, name, body = args[0], args[1], args[2]
        if kwargs.get("subresource") == "status":
            self.status.append(body["status"])
        return {"kind": kind, "metadata": {"namespace": namespace, "name": name}}

    async def list_objects(self, *_: Any, **__: Any) -> list[dict[str, Any]]:
        return []

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] == "Event":
            self.events.append(obj)
        return obj

    async def get(self, *_: Any, **__: Any) -> None:
        return None

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.applied.append(obj["kind"])
        answer = copy.deepcopy(obj)
        answer["metadata"].update(uid=f"uid-{obj['kind']}", resourceVersion="1", generation=1)
        return answer

    def reasons(self) -> dict[str, str]:
        return {e["reason"]: e["message"] for e in self.events}


def _step(body: dict[str, Any]) -> _Recording:
    """One lifecycle step of ``body`` (a pipeline with no children yet)."""
    client = _Recording()
    lifecycle = Lifecycle(Context.of(OperatorOptions(), client))  # type: ignore[arg-type]
    observed = Observed(pipelines={("ads", "clean"): [body]}, children={}, own=OwnWrites())

    def render(pipeline: Any, identity: Any, generation: int, reset: bool) -> Any:
        return render_pipeline(
            pipeline, default_image="eop:test", generation=generation, reset_progress=reset
        )

    asyncio.run(lifecycle.drive(observed, ("ads", "clean"), render))
    return client


def _written_by_a_newer_operator(manifest: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(manifest)
    body["spec"]["autoscaling"] = {"maxExecutors": 4}  # a field this operator does not know
    body["spec"]["upgrade"] = {"mode": "last-state", "drainTimeout": "30s"}  # nor this one
    body["status"] = {
        "phase": "Pending",
        "observedGeneration": 1,
        "conditions": [FOREIGN_CONDITION],
        "autoscaling": {"lastScaleAt": "2026-01-01T00:00:00Z"},
        "renderedBy": "9.9.9",
    }
    return body


def test_a_pipeline_written_for_a_newer_operator_runs_and_keeps_what_this_one_does_not_know(
    manifest: dict[str, Any],
) -> None:
    body = _written_by_a_newer_operator(manifest)
    client = _step(body)
    reasons = client.reasons()
    assert "InvalidSpec" not in reasons, reasons.get("InvalidSpec")
    assert "StatefulSet" in client.applied, "the pipeline's driver was not created"
    assert "spec.autoscaling" in reasons["UnknownFields"]
    assert "spec.upgrade.drainTimeout" in reasons["UnknownFields"]
    assert client.status, "no status was written"
    for status in client.status:
        assert status.get("phase") != "Invalid"
        # A merge patch: what it leaves out stays; what it sets to null is deleted.
        assert "autoscaling" not in status, "the newer operator's status field was touched"
        conditions = status.get("conditions", [FOREIGN_CONDITION])
        assert FOREIGN_CONDITION in conditions, "the newer operator's condition was lost"


def test_a_stored_object_with_unknown_fields_loads_but_a_users_manifest_is_refused(
    manifest: dict[str, Any],
) -> None:
    body = _written_by_a_newer_operator(manifest)
    loaded = load_stored(body)
    assert sorted(loaded.ignored) == ["spec.autoscaling", "spec.upgrade.drainTimeout"]
    assert loaded.value.spec.upgrade.mode == "last-state"
    # At the door (eop render, eop run, a manifest file) an unknown field is a mistake.
    with pytest.raises(InvalidPipeline, match=r"spec\.autoscaling: Extra inputs"):
        load_pipeline(body)


def _accepted_under_looser_rules(manifest: dict[str, Any], *, generation: int) -> dict[str, Any]:
    """A spec an earlier operator accepted that breaks a rule of this one (stallTimeout)."""
    body = copy.deepcopy(manifest)
    body["spec"]["trigger"] = {"processingTime": "2m"}
    body["spec"]["health"] = {"stallTimeout": "1m"}
    body["metadata"]["generation"] = generation
    body["status"] = {"phase": "Running", "observedGeneration": 1, "conditions": []}
    return body


def test_a_tightened_rule_keeps_an_accepted_spec_running_with_a_warning(
    manifest: dict[str, Any],
) -> None:
    client = _step(_accepted_under_looser_rules(manifest, generation=1))
    reasons = client.reasons()
    assert "InvalidSpec" not in reasons, reasons.get("InvalidSpec")
    assert "StatefulSet" in client.applied, "the accepted spec no longer runs"
    assert "health.stallTimeout must be longer" in reasons["SpecNoLongerValid"]
    status = client.status[0]
    assert status.get("phase") not in ("Invalid", "Degraded")
    condition = next(c for c in status["conditions"] if c["type"] == "SpecNoLongerValid")
    assert condition["status"] == "True"
    assert "health.stallTimeout" in condition["message"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "False"


def test_a_changed_spec_must_pass_the_tightened_rule(manifest: dict[str, Any]) -> None:
    client = _step(_accepted_under_looser_rules(manifest, generation=2))  # edited since
    assert "health.stallTimeout must be longer" in client.reasons()["InvalidSpec"]
    assert client.applied == [], "a changed spec that breaks a rule was run"
    assert client.status[0]["phase"] == "Invalid"


def test_the_warning_condition_goes_when_the_spec_passes_again(manifest: dict[str, Any]) -> None:
    body = copy.deepcopy(manifest)
    body["metadata"]["generation"] = 2  # the user fixed the spec
    warned = {"type": "SpecNoLongerValid", "status": "True", "reason": "RuleTightened"}
    body["status"] = {"phase": "Running", "observedGeneration": 1, "conditions": [warned]}
    client = _step(body)
    assert client.status, "no status was written"
    assert "SpecNoLongerValid" not in client.reasons()
    for status in client.status:
        kinds = [c["type"] for c in status.get("conditions", [])]
        assert "SpecNoLongerValid" not in kinds, "a fixed spec is still said to break a rule"
