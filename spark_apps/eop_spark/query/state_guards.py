"""Whether a query keeps state between micro-batches, and the two guards that follow.

* **State lost** (invariant 8): a stateful query (aggregation, time window,
  deduplication, stream-stream join) that starts a new checkpoint generation
  while the progress group ``G`` holds progress resumes input from ``G`` with
  empty state: windows open at that point would be published incomplete
  (:func:`check_state_kept`; opt in with ``transform.allowEmptyState``; a
  ``stateless`` generation resets ``G`` on purpose and is never refused).
* **State store out of reach**: executors on Kubernetes write a stateful
  query's state into the checkpoint, which must then be in object storage
  (:func:`check_state_store_reachable`).

Both read the query's analysed plan; the progress guards of a new generation
are in :mod:`eop_spark.exactly_once.generation_guards`.
"""

from __future__ import annotations

import re

from eop_spark.contract.errors import ConfigError, StateLost
from eop_spark.contract.run_config import RunConfig
from eop_spark.exactly_once.generation_guards import describe_generation
from eop_spark.exactly_once.offsets_log import is_local
from eop_spark.query.commit_mode import plan_nodes

#: Logical operators that keep state across micro-batches in a streaming query.
_STATEFUL = re.compile(r"Aggregate|Deduplicate|GroupsWithState|TransformWithState")
#: How a streaming source appears in an analysed plan (a join of two keeps state).
_STREAMING_SOURCE = re.compile(r"^Streaming(Relation|ExecutionRelation|DataSourceV2)")


def stateful_operators(analyzed_plan: str) -> list[str]:
    """The operators of an analysed streaming plan that keep state between micro-batches.

    A join keeps state only between two streams (a stream-static join keeps none).
    """
    nodes = plan_nodes(analyzed_plan)
    found = [n for n in nodes if _STATEFUL.search(n)]
    if "Join" in nodes and sum(bool(_STREAMING_SOURCE.match(n)) for n in nodes) >= 2:
        found.append("Join")
    return list(dict.fromkeys(found))


def check_state_kept(config: RunConfig, analyzed_plan: str, resumes_progress: bool) -> None:
    """Raise :class:`StateLost` when a stateful query would resume G with empty state."""
    if not resumes_progress or config.reset_progress or config.transform.allow_empty_state:
        return
    operators = stateful_operators(analyzed_plan)
    if not operators:
        return
    raise StateLost(
        f"{describe_generation(config)} of a stateful query "
        f"({', '.join(operators)}): the input before progress group {config.progress_group}'s "
        "offsets is not read again, so its state (open windows, counts, seen keys) would restart "
        "empty and results would be incomplete. Choose an upgrade with mode stateless (reprocess "
        "from startingOffsets) or set spec.transform.allowEmptyState: true to restart with "
        "empty state"
    )


def check_state_store_reachable(config: RunConfig, analyzed_plan: str) -> None:
    """Refuse a stateful query whose executors on Kubernetes could not write its state.

    Executors write a stateful query's state store into the checkpoint; a checkpoint on a
    volume is mounted in the driver pod only. Object storage (``checkpoint.uri``) is reached
    from every pod.
    """
    if not config.spark.on_kubernetes or not is_local(config.checkpoint_location):
        return
    operators = stateful_operators(analyzed_plan)
    if operators:
        raise ConfigError(
            f"a stateful query ({', '.join(operators)}) with executors on Kubernetes needs its "
            "checkpoint in object storage (spec.checkpoint.uri): the executors write its state "
            f"there, and {config.checkpoint_location} is a volume of the driver pod only"
        )
