"""Which commit mode a query can use: pure functions over SQL text and plan text.

The partitioned mode needs every output row to come from exactly one source
row, in the same Spark task (no shuffle, no state), and to carry that row's
source topic, partition and offset.  Three checks, from cheapest to surest:

1. :func:`sql_with_provenance` -- sqlglot shows the transform SQL is one
   plain projection/filter (optionally ``LATERAL VIEW``) over ``source``, and
   adds the provenance columns to its select list, qualified by the table so
   user aliases such as ``... AS topic`` cannot capture them;
2. :func:`logical_blockers` -- Spark's analysed plan has only record-wise
   operators (catches Python transforms and UDAFs sqlglot cannot see);
3. :func:`physical_blockers` -- the first batch's physical plan has no
   Exchange, aggregate or state store (checked at run time by the runner).

The mode is decided here and nowhere else: whether a run may commit
partitioned at all (:func:`partitioned_possible`, before the query exists),
which mode the query uses (:func:`choose_mode`, from checks 1 and 2), and
whether its first batch's plan keeps it (:func:`confirm_mode`, check 3).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from eop_spark.contract.errors import ConfigError
from eop_spark.contract.spec import CommitMode
from eop_spark.exactly_once.sink_contract import PROVENANCE_COLUMNS

SOURCE_VIEW = "source"

#: Logical operators that keep one output row per source row in the same task.
RECORD_WISE_OPERATORS = frozenset(
    {
        "Project",
        "Filter",
        "SubqueryAlias",
        "View",
        "Generate",
        "EventTimeWatermark",
        "ResolvedHint",
        "StreamingRelationV2",
        "StreamingRelation",
        "StreamingDataSourceV2ScanRelation",
        "StreamingExecutionRelation",
        "MapInArrow",
        "MapInPandas",
        "PythonMapInArrow",
        "DeserializeToObject",
        "SerializeFromObject",
        "MapPartitions",
        "MapElements",
        "TypedFilter",
    }
)

#: Physical operators that move rows between tasks or keep state.
_PHYSICAL_BLOCKER = re.compile(
    r"Exchange|Aggregate|StateStore|Deduplicate|Join|Window|Sort|Union|Limit|Coalesce|"
    r"Expand|GroupsWithState|TransformWithState|TakeOrdered"
)
_NODE = re.compile(r"^[\s|:+\-~*()0-9]*([A-Za-z][A-Za-z0-9]*)")


@dataclass(frozen=True)
class SqlRewrite:
    """The transform SQL with provenance columns added, or why that is not possible."""

    sql: str | None
    reason: str = ""


def sql_with_provenance(sql: str) -> SqlRewrite:
    """Add ``source.topic AS __eop_src_topic`` (and partition, offset) to a record-wise SELECT.

    Returns ``SqlRewrite(None, reason)`` for anything but a single SELECT over
    ``source`` without joins, grouping, aggregates, window functions,
    DISTINCT, ORDER BY, LIMIT, subqueries or CTEs.
    """
    import sqlglot
    from sqlglot import exp

    try:
        statements = sqlglot.parse(sql, read="spark")
    except sqlglot.errors.SqlglotError as exc:
        return SqlRewrite(None, f"sqlglot cannot parse the SQL ({str(exc).splitlines()[0]})")
    if len(statements) != 1 or statements[0] is None:
        return SqlRewrite(None, "the SQL is not exactly one statement")
    tree = statements[0]
    if not isinstance(tree, exp.Select):
        return SqlRewrite(None, f"the query is a {type(tree).__name__}, not a plain SELECT")
    for clause in (
        "with",
        "joins",
        "group",
        "having",
        "qualify",
        "order",
        "limit",
        "offset",
        "distinct",
        "windows",
    ):
        # sqlglot names some arguments with a trailing underscore (from_, with_).
        if tree.args.get(clause) or tree.args.get(f"{clause}_"):
            return SqlRewrite(None, f"the query has {clause.upper()}")
    source = tree.args.get("from_") or tree.args.get("from")
    table = source.this if source is not None else None
    if not isinstance(table, exp.Table) or table.name.lower() != SOURCE_VIEW or table.db:
        return SqlRewrite(None, f"the query does not read the view {SOURCE_VIEW!r} directly")
    for node in tree.walk():
        if isinstance(node, exp.AggFunc):
            return SqlRewrite(None, f"the query aggregates ({node.sql('spark')})")
        if isinstance(node, exp.Window):
            return SqlRewrite(None, "the query uses a window function")
        if node is not tree and isinstance(node, exp.Select | exp.Subquery):
            return SqlRewrite(None, "the query has a subquery")
    output_names = {e.alias_or_name for e in tree.expressions}
    if output_names & set(PROVENANCE_COLUMNS):
        return SqlRewrite(None, "the query already defines __eop_src_* columns")
    qualifier = table.alias_or_name
    for column, name in zip(PROVENANCE_COLUMNS, ("topic", "partition", "offset"), strict=True):
        ref = exp.column(name, table=qualifier, quoted=True)
        tree.append("expressions", exp.alias_(ref, column, quoted=True))
    return SqlRewrite(tree.sql(dialect="spark"))


def plan_nodes(plan_text: str) -> list[str]:
    """Operator names of a Spark plan's tree string (``QueryExecution`` ``toString``)."""
    names = []
    for index, line in enumerate(plan_text.splitlines()):
        # Below the root a node's line starts with the tree's drawing; other lines go on with
        # a multi-line value of the line before (a PEM certificate in the source's options).
        if index and not line.startswith((" ", ":", "+- ", "|")):
            continue
        match = _NODE.match(line)
        if match:
            names.append(match.group(1))
    return names


def logical_blockers(analyzed_plan: str) -> list[str]:
    """Operators of an analysed logical plan that are not record-wise, in plan order."""
    return _unique(n for n in plan_nodes(analyzed_plan) if n not in RECORD_WISE_OPERATORS)


def physical_blockers(physical_plan: str) -> list[str]:
    """Operators of a physical plan that shuffle, aggregate or keep state."""
    return _unique(n for n in plan_nodes(physical_plan) if _PHYSICAL_BLOCKER.search(n))


def _unique(names: Iterable[str]) -> list[str]:
    seen: list[str] = []
    for name in names:
        if name not in seen:
            seen.append(name)
    return seen


@dataclass(frozen=True)
class ModeChoice:
    """The commit mode the runner uses and why (logged at start)."""

    mode: CommitMode
    reason: str


def choose_mode(
    requested: CommitMode, blockers: list[str], provenance: bool, provenance_reason: str
) -> ModeChoice:
    """Pick the commit mode from the request and the query's shape.

    ``blockers`` are non-record-wise operators of the plan; ``provenance``
    says whether the output carries the source topic/partition/offset
    (``provenance_reason`` explains when it does not).  Asking for
    ``partitioned`` on a query that cannot use it is a configuration error.
    """
    if requested == CommitMode.COORDINATED:
        return ModeChoice(CommitMode.COORDINATED, "commitMode coordinated requested")
    problem = ""
    if blockers:
        problem = f"the query is not record-wise (plan has {', '.join(blockers)})"
    elif not provenance:
        problem = f"the output does not carry the source offsets ({provenance_reason})"
    if requested == CommitMode.PARTITIONED:
        if problem:
            raise ConfigError(f"commitMode partitioned is not possible: {problem}")
        return ModeChoice(CommitMode.PARTITIONED, "commitMode partitioned requested")
    if problem:
        return ModeChoice(CommitMode.COORDINATED, f"auto: coordinated because {problem}")
    return ModeChoice(CommitMode.PARTITIONED, "auto: partitioned because the query is record-wise")


def partitioned_possible(requested: CommitMode) -> bool:
    """Whether a run asked for ``requested`` may commit partitioned (before its query exists)."""
    return requested != CommitMode.COORDINATED


def confirm_mode(requested: CommitMode, physical_plan: str) -> ModeChoice | None:
    """At the first batch of a partitioned run: None when its physical plan keeps the mode.

    Otherwise the run falls back to coordinated mode (the choice returned says
    why), unless ``partitioned`` was requested: then it is a configuration error.
    """
    blockers = physical_blockers(physical_plan)
    if not blockers:
        return None
    problem = f"the physical plan has {', '.join(blockers)}"
    if requested == CommitMode.PARTITIONED:
        raise ConfigError(f"commitMode partitioned is not possible: {problem}")
    return ModeChoice(CommitMode.COORDINATED, problem)
