"""The operator's cluster checks before a driver starts: when it asks again, what it refuses.

On a real broker and API server: tests/integration/test_admission_on_apiserver.py.
"""

from __future__ import annotations

import asyncio
import base64
import math
import socket
import time
from typing import Any

import pytest

from eop_operator.api.load import load_pipeline
from eop_operator.api.models import ExactlyOncePipeline
from eop_operator.controller.cluster_gate import (
    RECHECK_REFUSED_S,
    RETRY_FIRST_S,
    RETRY_MAX_S,
    next_answer,
)
from eop_operator.health.checkpoint_secret import (
    check_checkpoint_secret,
    checkpoint_secret_refusal,
)
from eop_operator.health.clusters import probe
from eop_operator.health.progress import ProgressUnavailable, SecretRefused, owned_secret_key
from eop_spark.contract.errors import EnvironmentNotReady


def test_a_passed_generation_is_not_asked_again_and_a_refusal_is_within_a_minute() -> None:
    passed = next_answer(None, ("u", 3), refusal=None, unavailable=None, now=100.0)
    assert passed.again_at == math.inf
    refused = next_answer(
        passed, ("u", 4), refusal="spec.sink.kafka.topic ...", unavailable=None, now=5
    )
    assert refused.again_at == 5 + RECHECK_REFUSED_S


def test_a_cluster_out_of_reach_is_asked_again_with_back_off_and_keeps_a_refusal() -> None:
    answer = next_answer(None, ("u", 1), refusal="refused", unavailable=None, now=0.0)
    waits = []
    for _ in range(8):
        answer = next_answer(answer, ("u", 1), refusal=None, unavailable="down", now=0.0)
        waits.append(answer.again_at)
        assert answer.refusal == "refused"  # a cluster that does not answer clears nothing
    assert waits[:3] == [RETRY_FIRST_S, 2 * RETRY_FIRST_S, 4 * RETRY_FIRST_S]
    assert waits[-1] == RETRY_MAX_S
    # A new generation starts over, with nothing refused yet.
    fresh = next_answer(answer, ("u", 2), refusal=None, unavailable="down", now=0.0)
    assert (fresh.refusal, fresh.misses, fresh.again_at) == (None, 1, RETRY_FIRST_S)


def _pipeline(**spec: Any) -> ExactlyOncePipeline:
    """Pipeline p of namespace team, with ``spec`` over a plain one."""
    return load_pipeline(
        {
            "apiVersion": "exactlyonce.io/v1alpha1",
            "kind": "ExactlyOncePipeline",
            "metadata": {"name": "p", "namespace": "team"},
            "spec": {
                "source": {"kafka": {"bootstrapServers": "k:9092", "topics": ["in"]}},
                "transform": {"sql": "SELECT value FROM source"},
                "sink": {"kafka": {"bootstrapServers": "k:9092", "topic": "out"}},
                **spec,
            },
        }
    )


def test_a_secret_key_eop_owns_is_refused_naming_the_field_and_the_secret() -> None:
    sink = {"bootstrapServers": "k:9092", "topic": "out", "secretRef": {"name": "producer"}}
    pipeline = _pipeline(sink={"kafka": sink})
    owned_secret_key(pipeline, "sink", {"sasl.username": "u"})  # a login: fine
    with pytest.raises(SecretRefused, match=r"spec.sink.kafka.secretRef \(Secret producer\): "):
        owned_secret_key(pipeline, "sink", {"sasl.username": "u", "Kafka.Transactional.Id": "x"})


def test_a_cluster_nobody_listens_for_is_reported_at_once() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    began = time.monotonic()
    with pytest.raises(EnvironmentNotReady, match="cannot reach the sink Kafka cluster at"):
        probe(f"127.0.0.1:{port}", "sink")
    assert time.monotonic() - began < 1.0


def _data(**keys: str) -> dict[str, str]:
    """A Secret's data as the API server holds it: base64 values."""
    return {k: base64.b64encode(v.encode()).decode() for k, v in keys.items()}


ID, KEY, TOKEN = "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"


@pytest.mark.parametrize(
    ("keys", "found"),
    [
        ({ID: "AKIA1", KEY: "s3cr3t-value"}, None),
        ({ID: "AKIA1", KEY: "s3cr3t-value", TOKEN: "t0ken-value"}, None),
        ({ID: "AKIA1", KEY: "s3cr3t-value", TOKEN: ""}, None),  # the SDK skips a blank one
        ({ID: "AKIA1"}, f"{KEY} is missing."),
        ({KEY: "s3cr3t-value", TOKEN: "t0ken-value"}, f"{ID} is missing."),
        ({}, f"{ID}, {KEY} are missing."),
        ({ID: "AKIA1", KEY: ""}, f"{KEY} is empty."),
        ({ID: "AKIA1", KEY: "s3cr3t-value", "AWS_REGION": "eu"}, "AWS_REGION is read by nothing."),
        (
            {"accessKey": "AKIA1", "secretKey": "s3cr3t-value"},
            f"{ID}, {KEY} are missing; accessKey, secretKey are read by nothing.",
        ),
        (
            {ID: "AKIA1", KEY: "s3cr3t-value", **{f"k{i}": "v" for i in range(7)}},
            "k0, k1, k2, k3, k4 and 2 more are read by nothing.",
        ),
    ],
)
def test_checkpoint_secret_keys_that_make_no_credentials_are_refused_naming_them(
    keys: dict[str, str], found: str | None
) -> None:
    refusal = checkpoint_secret_refusal("store", _data(**keys))
    if found is None:
        assert refusal is None
        return
    assert refusal is not None
    assert refusal.startswith(f"spec.checkpoint.secretRef (Secret store): {found} Its keys are")
    for value in ("AKIA1", "s3cr3t-value", "t0ken-value"):
        assert value not in refusal
        assert base64.b64encode(value.encode()).decode() not in refusal


class _Secrets:
    """An API server holding some Secrets of namespace team."""

    def __init__(self, **secrets: dict[str, str]) -> None:
        self.secrets = secrets
        self.asked: list[str] = []

    async def get(self, version: str, kind: str, namespace: str, name: str) -> Any:
        assert (version, kind, namespace) == ("v1", "Secret", "team")
        self.asked.append(name)
        data = self.secrets.get(name)
        return None if data is None else {"data": data}


def _on_store(secret: str | None) -> ExactlyOncePipeline:
    checkpoint: dict[str, Any] = {"uri": "s3a://bucket/eop"}
    if secret is not None:
        checkpoint["secretRef"] = {"name": secret}
    return _pipeline(checkpoint=checkpoint)


def test_the_checkpoint_secret_is_read_only_when_named_and_a_missing_one_is_not_refused() -> None:
    api = _Secrets(good=_data(**{ID: "AKIA1", KEY: "s3cr3t-value"}), half=_data(**{ID: "AKIA1"}))
    check = check_checkpoint_secret
    asyncio.run(check(api, _on_store(None)))  # type: ignore[arg-type]
    assert api.asked == []
    asyncio.run(check(api, _on_store("good")))  # type: ignore[arg-type]
    with pytest.raises(SecretRefused, match=f"secretRef \\(Secret half\\): {KEY} is missing"):
        asyncio.run(check(api, _on_store("half")))  # type: ignore[arg-type]
    # Not there yet: the check is deferred (not refused), naming the field.
    with pytest.raises(ProgressUnavailable) as gone:
        asyncio.run(check(api, _on_store("later")))  # type: ignore[arg-type]
    assert not isinstance(gone.value, SecretRefused)
    assert str(gone.value) == "spec.checkpoint.secretRef: Secret later does not exist"
    assert api.asked == ["good", "half", "later"]
