"""Typed writes of a pipeline's ``.status``: one model per writer, one serialiser.

Two components write the status, each its own fields (the table is in
:mod:`eop_operator.kube.status`, the one module that sends them):

* :class:`LifecyclePatch`: the lifecycle, with the part its decision records
  before acting, :class:`DecisionRecord` (``reconcile.upgrade``);
* :class:`HealthPatch`: the health monitor.

The models have keyword fields in the API's snake_case; :func:`merge_patch`
turns one into the JSON merge patch of ``.status`` (camelCase) that changes
what it sets and nothing else.  A test holds the field sets apart and makes
them cover :class:`~eop_operator.api.models.PipelineStatus`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from pydantic_core import to_jsonable_python

from eop_operator.api.models import (
    CheckpointStatus,
    Condition,
    FailoverStatus,
    Phase,
    ProgressStatus,
    UpgradeStatus,
)


class StatusPatch(BaseModel):
    """Some fields of ``.status``: only those given (None included) are written."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", validate_assignment=True
    )

    def given(self) -> dict[str, Any]:
        """The fields given, by name (to carry them into a wider patch)."""
        return {name: getattr(self, name) for name in self.model_fields_set}


class DecisionRecord(StatusPatch):
    """What a lifecycle decision records before it is acted on: the write-ahead log.

    ``checkpoint`` carries the generation and its reset flag (the lifecycle adds the path).
    """

    spec_hash: str | None = None
    rendered_by: str | None = None
    applied_fingerprint: str | None = None
    checkpoint: CheckpointStatus | None = None
    upgrade: UpgradeStatus | None = None
    failover: FailoverStatus | None = None
    last_stable_spec: dict[str, Any] | None = None
    last_stable_fingerprint: str | None = None
    rolled_back_fingerprint: str | None = None
    message: str | None = None


class LifecyclePatch(DecisionRecord):
    """What the lifecycle writes: its decision's record, the verdict, what the driver runs as."""

    phase: Phase | None = None
    ready: str | None = None
    observed_generation: int | None = None
    conditions: list[Condition] | None = None
    executors: int | None = None
    executor_selector: str | None = None
    transactional_id_prefix: str | None = None
    progress_group: str | None = None
    commit_mode: str | None = None


class HealthPatch(StatusPatch):
    """What the health monitor writes: the lag and its last reading of ``G`` (``progress``)."""

    lag: int | None = None
    progress: ProgressStatus | None = None


def merge_patch(patch: StatusPatch, current: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch of ``.status`` (``current``, as stored) that ``patch`` makes.

    Only what changes is in it (empty: nothing to write).  Three rules:

    * a nested model (``upgrade``, ``checkpoint``, ``progress``...) writes the
      fields it was given: ``CheckpointStatus(path=...)`` keeps the generation;
    * a map (``lastStableSpec``, ``failover.seen``, ``progress.heldPartitions``)
      and a list (``conditions``) become exactly the value given;
    * None removes the field.
    """
    return _model_patch(patch, current)


def _model_patch(model: BaseModel, current: Mapping[str, Any]) -> dict[str, Any]:
    patch: dict[str, Any] = {}
    for name, info in type(model).model_fields.items():
        if name not in model.model_fields_set:
            continue
        key = info.alias or name
        value, before = getattr(model, name), current.get(key)
        if value is None:
            if before is not None:
                patch[key] = None
        elif isinstance(value, BaseModel):
            change = _model_patch(value, before if isinstance(before, Mapping) else {})
            if change:
                patch[key] = change
        elif isinstance(value, dict):
            change = _map_patch(before, to_jsonable_python(value))
            if change:
                patch[key] = change
        else:
            after = to_jsonable_python(value, by_alias=True, exclude_none=True)
            if after != before:
                patch[key] = after
    return patch


def _map_patch(before: Any, after: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that turns the map ``before`` into ``after`` (empty: the same)."""
    if not isinstance(before, Mapping):
        return after
    patch: dict[str, Any] = {key: None for key in before if key not in after}
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, dict) and isinstance(old, Mapping):
            change = _map_patch(old, value)
            if change:
                patch[key] = change
        elif key not in before or old != value:
            patch[key] = value
    return patch
