"""One pipeline per Kafka identity; deletion keeps what retention keeps, whatever the spec."""

from __future__ import annotations

import copy
from typing import Any

from eop_operator.api.load import load_pipeline
from eop_operator.reconcile.admission import (
    Claimant,
    claimed_identities,
    claimed_identity,
    identity_conflict,
    shipped_transform_problem,
)
from eop_operator.reconcile.deletion import checkpoint_on_delete
from eop_operator.render.naming import checkpoint_claim_name
from tests.operator.conftest import BASE_MANIFEST


def _pipeline(name: str, created: str, namespace: str = "ads", **spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(BASE_MANIFEST)
    body["metadata"] = {"name": name, "namespace": namespace, "creationTimestamp": created}
    body["spec"].update(spec)
    return body


def _index(*bodies: dict[str, Any]) -> dict[str, list[Claimant]]:
    index: dict[str, list[Claimant]] = {}
    for body in bodies:
        for key, claimants in claimed_identities(body).items():
            index.setdefault(key, []).extend(claimants)
    return index


def _conflict(body: dict[str, Any], index: dict[str, list[Claimant]]) -> str | None:
    identity = claimed_identity(body)
    assert identity is not None
    meta = body["metadata"]
    me = Claimant(meta["creationTimestamp"], meta["namespace"], meta["name"])
    return identity_conflict(identity, me, index)


def test_the_younger_of_two_pipelines_with_one_prefix_is_refused_naming_the_older() -> None:
    shared = {"transactions": {"idPrefix": "team.clean"}}
    first = _pipeline("clean", "2026-01-01T00:00:00Z", **shared)
    copy_pasted = _pipeline("clean-copy", "2026-01-02T00:00:00Z", namespace="other", **shared)
    index = _index(first, copy_pasted)
    assert _conflict(first, index) is None
    message = _conflict(copy_pasted, index)
    assert message is not None
    assert "transactions.idPrefix 'team.clean' is already used by pipeline ads/clean" in message
    # Created in the same second: the name decides, the same way every time.
    twin = _pipeline("a-twin", "2026-01-01T00:00:00Z", namespace="ads", **shared)
    index = _index(first, twin)
    assert _conflict(twin, index) is None
    assert "ads/a-twin" in (_conflict(first, index) or "")


def test_an_explicit_prefix_may_collide_with_another_pipelines_default() -> None:
    first = _pipeline("clean", "2026-01-01T00:00:00Z")
    second = _pipeline("b", "2026-01-02T00:00:00Z", transactions={"idPrefix": "eop.ads.clean"})
    assert "ads/clean" in (_conflict(second, _index(first, second)) or "")


def test_distinct_pipelines_and_a_pipeline_alone_are_unaffected() -> None:
    one = _pipeline("clean", "2026-01-01T00:00:00Z")
    other = _pipeline("clean", "2026-01-02T00:00:00Z", namespace="eu")
    index = _index(one, other)
    assert _conflict(one, index) is None and _conflict(other, index) is None


def test_the_recorded_identity_counts_and_an_invalid_spec_still_holds_its_own() -> None:
    recorded = _pipeline("clean", "2026-01-01T00:00:00Z")
    recorded["status"] = {"transactionalIdPrefix": "legacy.prefix"}
    broken = _pipeline("broken", "2026-01-02T00:00:00Z", transactions={"idPrefix": "legacy.prefix"})
    broken["spec"]["source"] = "not an object"
    assert "ads/clean" in (_conflict(broken, _index(recorded, broken)) or "")
    assert claimed_identities({"metadata": {"name": "no-namespace"}}) == {}


def test_deleting_keeps_the_claim_by_the_raw_spec_even_when_it_no_longer_validates() -> None:
    valid = _pipeline("clean", "2026-01-01T00:00:00Z")
    assert checkpoint_on_delete(valid) == (checkpoint_claim_name(load_pipeline(valid)), True)
    broken = copy.deepcopy(valid)
    broken["spec"]["source"]["kafka"]["startingOffsets"] = '{"raw": {"0": "abc"}}'
    assert checkpoint_on_delete(broken) == ("clean-checkpoint", True)
    broken["spec"]["checkpoint"] = {"retention": "Delete", "volume": "garbage"}
    assert checkpoint_on_delete(broken) == ("clean-checkpoint", False)
    broken["spec"]["checkpoint"] = {"uri": "s3a://bucket/clean"}
    assert checkpoint_on_delete(broken) == (None, False)
    broken["spec"] = "garbage"
    assert checkpoint_on_delete(broken) == ("clean-checkpoint", True)


def test_a_shipped_transform_that_does_not_exist_is_named_before_a_driver_runs() -> None:
    body = _pipeline("count", "2026-01-01T00:00:00Z")
    python = {"module": "eop_spark.examples.impressions", "function": "count_impressions"}
    body["spec"]["transform"] = {"python": python}
    assert shipped_transform_problem(load_pipeline(body)) is None
    python["function"] = "count_impresions"
    assert shipped_transform_problem(load_pipeline(body)) == (
        "transform.python.function 'count_impresions' is not defined in "
        "eop_spark.examples.impressions"
    )
    python["module"] = "eop_spark.examples.impresions"
    assert "transform.python.module 'eop_spark.examples.impresions' does not exist" in (
        shipped_transform_problem(load_pipeline(body)) or ""
    )
    # A module of the user's own, or the user's own image: the runner's to check.
    python["module"] = "acme.transforms"
    assert shipped_transform_problem(load_pipeline(body)) is None
    python["module"] = "eop_spark.examples.impresions"
    body["spec"]["image"] = "registry.example/acme/spark:1"
    assert shipped_transform_problem(load_pipeline(body)) is None
