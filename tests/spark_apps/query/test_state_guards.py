"""Whether a query keeps state, and what a stateful query may not do (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eop_spark.contract.errors import ConfigError, StateLost
from eop_spark.query.state_guards import (
    check_state_kept,
    check_state_store_reachable,
    stateful_operators,
)
from tests.spark_apps.exactly_once.test_generation_guards import config

WINDOWED = """\
WriteToMicroBatchDataSourceV1 ForeachWriterTable
+- Project [cast(window#1.start as string) AS key#2]
   +- Aggregate [window#1], [window#1, count(1) AS count#3L]
      +- Project [named_struct(start, ...) AS window#1]
         +- SubqueryAlias source
            +- StreamingRelationV2 org.apache.spark.sql.kafka010.KafkaSourceProvider
"""
STREAM_STATIC_JOIN = """\
Project [key#1, value#2]
+- Join Inner, (key#1 = k#3)
   :- StreamingRelationV2 org.apache.spark.sql.kafka010.KafkaSourceProvider
   +- LocalRelation [k#3]
"""
STREAM_STREAM_JOIN = STREAM_STATIC_JOIN.replace(
    "+- LocalRelation [k#3]", "+- StreamingRelationV2 org.apache.spark.sql.kafka010.Kafka"
)


def test_stateful_operators_in_analysed_plans() -> None:
    assert stateful_operators(WINDOWED) == ["Aggregate"]
    assert stateful_operators(STREAM_STATIC_JOIN) == []
    assert stateful_operators(STREAM_STREAM_JOIN) == ["Join"]
    assert stateful_operators("Deduplicate [key#1]\n+- StreamingRelationV2 x") == ["Deduplicate"]


def test_executors_on_kubernetes_need_a_shared_checkpoint_for_state(tmp_path: Path) -> None:
    """Executors write the state store: a volume of the driver pod is out of their reach."""
    spark = {"master": "k8s://https://kubernetes.default.svc"}
    cfg = config(tmp_path, 0).model_copy(
        update={"spark": config(tmp_path, 0).spark.model_copy(update=spark)}
    )
    with pytest.raises(ConfigError, match=r"Aggregate.*spec\.checkpoint\.uri"):
        check_state_store_reachable(cfg, WINDOWED)
    check_state_store_reachable(cfg, STREAM_STATIC_JOIN)  # no state: nothing to write
    shared = cfg.model_copy(update={"checkpoint_root": "s3a://bucket/eop/ns/p"})
    check_state_store_reachable(shared, WINDOWED)
    check_state_store_reachable(config(tmp_path, 0), WINDOWED)  # local mode: the driver's own


def test_state_check_refuses_only_a_stateful_resume(tmp_path: Path) -> None:
    cfg = config(tmp_path, 2)
    with pytest.raises(StateLost, match=r"stateless.*allowEmptyState"):
        check_state_kept(cfg, WINDOWED, resumes_progress=True)
    check_state_kept(cfg, WINDOWED, resumes_progress=False)  # a first run: G is empty
    check_state_kept(cfg, STREAM_STATIC_JOIN, resumes_progress=True)
    check_state_kept(
        cfg.model_copy(update={"reset_progress": True}), WINDOWED, resumes_progress=True
    )
    opted = cfg.model_copy(
        update={"transform": cfg.transform.model_copy(update={"allow_empty_state": True})}
    )
    check_state_kept(opted, WINDOWED, resumes_progress=True)
    # The refusal says what started the generation, as the operator rendered it.
    for reason, words in [("FellBack", "fallback"), ("CheckpointLost", "lost checkpoint")]:
        with pytest.raises(StateLost, match=rf"generation 2 \(started by an? {words}"):
            check_state_kept(cfg.model_copy(update={"generation_reason": reason}), WINDOWED, True)
