"""Commit-mode choice: sqlglot shape of the SQL, Spark plan operators, and the decision."""

from __future__ import annotations

import pytest

from eop_spark.contract.errors import ConfigError
from eop_spark.contract.spec import CommitMode
from eop_spark.query.commit_mode import (
    choose_mode,
    logical_blockers,
    physical_blockers,
    plan_nodes,
    sql_with_provenance,
)

PROVENANCE = "`__eop_src_topic`"


@pytest.mark.parametrize(
    ("sql", "qualifier"),
    [
        ("SELECT key, value FROM source WHERE offset % 2 = 0", "`source`"),
        ("SELECT * FROM source", "`source`"),
        ("SELECT s.key, upper(CAST(s.value AS STRING)) AS value FROM source AS s", "`s`"),
        ("SELECT 'x' AS topic, value FROM Source", "`Source`"),
        (
            "SELECT key, x AS value FROM source LATERAL VIEW explode(array(value)) t AS x",
            "`source`",
        ),
    ],
)
def test_record_wise_sql_gets_qualified_provenance_columns(sql: str, qualifier: str) -> None:
    rewrite = sql_with_provenance(sql)
    assert rewrite.sql is not None, rewrite.reason
    # Qualified by the table, so an output alias named topic cannot capture the reference.
    assert f"{qualifier}.`topic` AS {PROVENANCE}" in rewrite.sql
    assert f"{qualifier}.`partition` AS `__eop_src_partition`" in rewrite.sql
    assert f"{qualifier}.`offset` AS `__eop_src_offset`" in rewrite.sql


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("SELECT count(*) AS value FROM source", "aggregates"),
        ("SELECT key, count(*) AS value FROM source GROUP BY key", "GROUP"),
        ("SELECT DISTINCT value FROM source", "DISTINCT"),
        ("SELECT value FROM source ORDER BY offset", "ORDER"),
        ("SELECT value FROM source LIMIT 5", "LIMIT"),
        ("SELECT value, row_number() OVER (ORDER BY offset) AS n FROM source", "window"),
        ("SELECT value FROM source UNION ALL SELECT value FROM source", "Union"),
        ("SELECT a.value FROM source a JOIN source b ON a.key = b.key", "JOINS"),
        ("WITH x AS (SELECT * FROM source) SELECT value FROM x", "WITH"),
        ("SELECT value FROM (SELECT value FROM source)", "does not read"),
        ("SELECT value FROM source WHERE key IN (SELECT key FROM source)", "subquery"),
        ("SELECT value FROM other", "does not read"),
        ("SELECT value FRM source", "cannot parse"),
        ("SELECT 1 AS __eop_src_topic, value FROM source", "already"),
    ],
)
def test_other_sql_is_left_alone_with_a_reason(sql: str, why: str) -> None:
    rewrite = sql_with_provenance(sql)
    assert rewrite.sql is None
    assert why.lower() in rewrite.reason.lower()


# Plan strings as Spark 4 prints them (QueryExecution.analyzed / executedPlan).
ANALYZED_FILTER = """\
~Project [value#1L, timestamp#0]
+- ~Filter ((value#1L % cast(2 as bigint)) = cast(0 as bigint))
   +- ~SubqueryAlias source
      +- View (`source`, [timestamp#0, value#1L])
         +- ~StreamingRelationV2 org.apache.spark.sql.kafka010.KafkaSourceProvider@1, kafka
"""
ANALYZED_AGGREGATE = """\
~Aggregate [window#9], [window#9 AS w#6, count(1) AS c#7L]
+- ~Project [named_struct(start, ...) AS window#9, timestamp#0, value#1L]
   +- ~Filter isnotnull(timestamp#0)
      +- ~SubqueryAlias source
         +- View (`source`, [timestamp#0, value#1L])
            +- ~StreamingRelationV2 org.apache.spark.sql.kafka010.KafkaSourceProvider@1, kafka
"""
PHYSICAL_AGGREGATE = """\
*(4) HashAggregate(keys=[partition#11], functions=[count(1)], output=[key#23, value#24])
+- StateStoreSave [partition#11], state info [ checkpoint = file:/tmp/ck/state ], Update, 0, 2
   +- *(3) HashAggregate(keys=[partition#11], functions=[merge_count(1)])
      +- StateStoreRestore [partition#11], state info [ checkpoint = file:/tmp/ck/state ], 2
         +- Exchange hashpartitioning(partition#11, 2), REQUIRED_BY_STATEFUL_OPERATOR
            +- *(1) Project [partition#11]
               +- MicroBatchScan[key#8, value#9] class KafkaSourceProvider$KafkaScan
"""
PHYSICAL_FILTER = """\
*(1) Project [key#8, value#9, offset#12L]
+- *(1) Filter (isnotnull(offset#12L) AND ((offset#12L % 2) = 0))
   +- MicroBatchScan[key#8, value#9, topic#10] class KafkaSourceProvider$KafkaScan
"""


def test_plan_nodes_reads_operator_names() -> None:
    assert plan_nodes(ANALYZED_FILTER) == [
        "Project",
        "Filter",
        "SubqueryAlias",
        "View",
        "StreamingRelationV2",
    ]
    assert plan_nodes(PHYSICAL_FILTER) == ["Project", "Filter", "MicroBatchScan"]


def test_blockers() -> None:
    assert logical_blockers(ANALYZED_FILTER) == []
    assert logical_blockers(ANALYZED_AGGREGATE) == ["Aggregate"]
    assert physical_blockers(PHYSICAL_FILTER) == []
    assert physical_blockers(PHYSICAL_AGGREGATE) == [
        "HashAggregate",
        "StateStoreSave",
        "StateStoreRestore",
        "Exchange",
    ]


def test_auto_picks_partitioned_only_for_record_wise_output_with_provenance() -> None:
    assert choose_mode(CommitMode.AUTO, [], True, "").mode == CommitMode.PARTITIONED
    by_plan = choose_mode(CommitMode.AUTO, ["Aggregate"], False, "no")
    assert by_plan.mode == CommitMode.COORDINATED and "Aggregate" in by_plan.reason
    by_columns = choose_mode(CommitMode.AUTO, [], False, "the Python transform dropped them")
    assert by_columns.mode == CommitMode.COORDINATED and "dropped" in by_columns.reason


def test_explicit_modes() -> None:
    assert choose_mode(CommitMode.COORDINATED, [], True, "").mode == CommitMode.COORDINATED
    assert choose_mode(CommitMode.PARTITIONED, [], True, "").mode == CommitMode.PARTITIONED
    with pytest.raises(ConfigError, match="not record-wise"):
        choose_mode(CommitMode.PARTITIONED, ["Join"], True, "")
