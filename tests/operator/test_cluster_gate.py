"""The operator's cluster checks before a driver starts: when it asks again, what it refuses.

On a real broker and API server: tests/integration/test_admission_on_apiserver.py.
"""

from __future__ import annotations

import math
import socket
import time

import pytest

from eop_operator.api.load import load_pipeline
from eop_operator.controller.cluster_gate import (
    RECHECK_REFUSED_S,
    RETRY_FIRST_S,
    RETRY_MAX_S,
    next_answer,
)
from eop_operator.health.clusters import probe
from eop_operator.health.progress import SecretRefused, owned_secret_key
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


def test_a_secret_key_eop_owns_is_refused_naming_the_field_and_the_secret() -> None:
    pipeline = load_pipeline(
        {
            "apiVersion": "exactlyonce.io/v1alpha1",
            "kind": "ExactlyOncePipeline",
            "metadata": {"name": "p", "namespace": "team"},
            "spec": {
                "source": {"kafka": {"bootstrapServers": "k:9092", "topics": ["in"]}},
                "transform": {"sql": "SELECT value FROM source"},
                "sink": {
                    "kafka": {
                        "bootstrapServers": "k:9092",
                        "topic": "out",
                        "secretRef": {"name": "producer"},
                    }
                },
            },
        }
    )
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
