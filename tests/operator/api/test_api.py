"""The API models accept what users write and name the field of every mistake."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest

from eop_operator.api.load import InvalidPipeline, load_pipeline
from eop_operator.api.models import Retention, UpgradeMode
from tests.integration.test_crd_on_apiserver import (
    OWNED_AND_REFUSED_LATER,
    REFUSED_AT_THE_DOOR,
    VALID,
    near_misses,
)


def test_minimal_manifest_gets_documented_defaults(manifest: dict[str, Any]) -> None:
    pipeline = load_pipeline(manifest)
    spec = pipeline.spec
    assert pipeline.pipeline_id == "ads.clean"
    assert spec.source.kafka.starting_offsets == "earliest"
    assert spec.sink.kafka.commit_mode.value == "auto"
    assert spec.checkpoint.claim is not None and spec.checkpoint.claim.size == "1Gi"
    assert spec.checkpoint.retention is Retention.RETAIN
    assert spec.upgrade.mode is UpgradeMode.LAST_STATE
    assert spec.spark.master == "local[2]"
    assert spec.trigger.interval.ms == 10_000


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (["spec", "transform", "python"], {"module": "m", "function": "f"}, "spec.transform"),
        (["spec", "source", "kafka", "topicPattern"], "raw.*", "spec.source.kafka"),
        (["spec", "source", "kafka", "startingOffsets"], "yesterday", "startingOffsets"),
        (["spec", "sink", "kafka", "commitMode"], "fast", "spec.sink.kafka.commitMode"),
        (["spec", "sink", "kafka", "transactionTimeout"], "1 minute", "transactionTimeout"),
        (["spec", "trigger"], {"processingTime": "5s", "availableNow": True}, "spec.trigger"),
        (["spec", "checkpoint"], {"uri": "s3://bucket/p"}, "spec.checkpoint.uri"),
        (["spec", "checkpoint"], {"secretRef": {"name": "s3"}}, "spec.checkpoint"),
        (["spec", "spark", "master"], "yarn", "spec.spark.master"),
        # Not offered until the operator honours it (see RestartPolicy).
        (["spec", "restartPolicy"], "Never", "spec.restartPolicy"),
        (["spec", "surprise"], 1, "spec.surprise"),
        (["metadata", "name"], "x" * 43, "metadata.name"),
    ],
)
def test_invalid_manifest_names_the_field(
    manifest: dict[str, Any], path: list[str], value: Any, field: str
) -> None:
    node = manifest
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    with pytest.raises(InvalidPipeline, match=field.replace(".", r"\.")):
        load_pipeline(manifest)


def test_wrong_kind_is_rejected(manifest: dict[str, Any]) -> None:
    manifest["kind"] = "SparkApplication"
    with pytest.raises(InvalidPipeline, match=r"expected apiVersion exactlyonce\.io/v1alpha1"):
        load_pipeline(manifest)


@pytest.mark.parametrize(
    ("case", "mutate", "expected"), REFUSED_AT_THE_DOOR, ids=[m[0] for m in REFUSED_AT_THE_DOOR]
)
def test_what_the_api_server_refuses_eop_run_refuses_too(
    case: str, mutate: Callable[[dict[str, Any]], None], expected: tuple[str, ...]
) -> None:
    # Each rule is declared once and enforced twice: CEL for kubectl, pydantic for eop run.
    obj = copy.deepcopy(VALID)
    mutate(obj)
    field = expected[0].split(":")[0].split(" ")[0].removeprefix("spec.").replace("[0]", ".0")
    with pytest.raises(InvalidPipeline, match=re.escape(field)):
        load_pipeline(obj)


@pytest.mark.parametrize(
    ("case", "mutate", "field", "reason"),
    OWNED_AND_REFUSED_LATER,
    ids=[m[0] for m in OWNED_AND_REFUSED_LATER],
)
def test_eop_run_refuses_what_the_api_server_refuses_with_the_same_field_and_reason(
    case: str, mutate: Callable[[dict[str, Any]], None], field: str, reason: str
) -> None:
    obj = copy.deepcopy(VALID)
    mutate(obj)
    with pytest.raises(InvalidPipeline) as refused:
        load_pipeline(obj)
    # pydantic names list entries spec.driver.env.0 where the API server says env[0], a
    # duplicate on the list, and a rule relating fields on their model, in the message.
    named = re.sub(r"\[(\d+)\]", r".\1", field).removeprefix("spec.")
    if reason == "Duplicate value":
        named = named.rsplit(".", 1)[0]
    assert named in str(refused.value)
    assert reason in str(refused.value)


def test_eop_run_takes_the_near_misses_the_api_server_takes() -> None:
    spec = load_pipeline(near_misses()).spec
    assert spec.driver.tolerations[1]["tolerationSeconds"] == 30
    assert spec.spark.conf["spark.kubernetes.authenticate.executor.serviceAccountName"]


def test_a_topic_pattern_python_cannot_compile_is_refused_by_the_operator() -> None:
    # CEL cannot compile regexes: this one passes kubectl apply, the operator refuses it.
    obj = copy.deepcopy(VALID)
    del obj["spec"]["source"]["kafka"]["topics"]
    obj["spec"]["source"]["kafka"]["topicPattern"] = "raw("
    with pytest.raises(InvalidPipeline, match=r"topicPattern 'raw\(' is not a valid regex"):
        load_pipeline(obj)


@pytest.mark.parametrize(
    ("pattern", "sink_servers", "refused"),
    [
        ("cl.*", "127.0.0.1:9092", True),
        ("raw|clean", "127.0.0.1:9092", True),
        ("cl", "127.0.0.1:9092", False),  # whole names: "cl" does not read "clean"
        ("cl.*", "kafka-sink:9092", False),  # another cluster, as far as the spec tells
    ],
)
def test_a_sink_topic_the_source_pattern_matches_is_refused_by_the_operator(
    pattern: str, sink_servers: str, refused: bool
) -> None:
    # CEL checks listed topics only (RE2 cannot compile every Java pattern); the operator
    # matches the pattern before any driver starts, the runner by cluster id.
    obj = copy.deepcopy(VALID)
    del obj["spec"]["source"]["kafka"]["topics"]
    obj["spec"]["source"]["kafka"]["topicPattern"] = pattern
    obj["spec"]["sink"]["kafka"]["bootstrapServers"] = sink_servers
    if not refused:
        load_pipeline(obj)
        return
    with pytest.raises(InvalidPipeline) as error:
        load_pipeline(obj)
    assert f"sink.kafka.topic 'clean' matches source.kafka.topicPattern {pattern!r}" in str(
        error.value
    )
    assert "read its own output" in str(error.value)


def test_the_runner_never_subscribes_internal_topics() -> None:
    obj = copy.deepcopy(VALID)
    del obj["spec"]["source"]["kafka"]["topics"]
    obj["spec"]["source"]["kafka"]["topicPattern"] = ".*"
    obj["spec"]["sink"]["kafka"]["bootstrapServers"] = "kafka-sink:9092"  # not read back
    pattern = load_pipeline(obj).spec.source.kafka.subscribed_pattern
    assert pattern is not None
    names = ["raw", "__consumer_offsets", "__transaction_state", "__eop_progress", "a__b"]
    assert [n for n in names if re.fullmatch(pattern, n)] == ["raw", "a__b"]


@pytest.mark.parametrize(
    ("source", "refused"),
    [
        ({"topics": ["raw"], "startingOffsets": '{"rwa": {"0": 5}}'}, "'rwa'"),
        ({"topicPattern": "raw-.*", "startingOffsets": '{"raw": {"0": 5}}'}, "'raw'"),
        ({"topicPattern": "raw-.*", "startingOffsets": '{"raw-eu": {"0": 5}}'}, None),
    ],
)
def test_starting_offsets_of_a_topic_the_pipeline_does_not_read_are_refused(
    source: dict[str, Any], refused: str | None
) -> None:
    # A typo here would silently start the real topic at earliest: a full reprocess.
    obj = copy.deepcopy(VALID)
    obj["spec"]["source"]["kafka"] = {"bootstrapServers": "127.0.0.1:9092", **source}
    if refused is None:
        load_pipeline(obj)
        return
    with pytest.raises(InvalidPipeline, match=f"startingOffsets names topic {refused}"):
        load_pipeline(obj)
