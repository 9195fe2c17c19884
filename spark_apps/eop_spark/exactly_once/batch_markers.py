"""Telling a replay from a new batch: the markers G's offsets carry, and the decision they feed.

Every sink commit to the progress group ``G`` stores, as the offsets' commit
metadata, a marker naming the checkpoint's query and the batch that moved
``G`` (:func:`batch_marker`).  The coordinated sink reads them back to skip a
batch whose output is visible already (:func:`decide_batch`); the keep-alive
refresh re-commits them as they are.  Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from eop_spark.contract.offsets import TopicPartition, covers, to_spark_json

#: Prefix of the commit metadata the sinks store with each offset of G.
MARKER_PREFIX = "eop:v1"


def batch_marker(query_id: str, batch_id: int) -> str:
    """The offset-commit metadata naming the batch that moved G: ``eop:v1:<query>:<batch>``.

    ``query_id`` is the Spark checkpoint's query id (stable across restarts of
    one checkpoint), so a marker tells which checkpoint's batch is visible.
    """
    return f"{MARKER_PREFIX}:{query_id}:{batch_id}"


def marker_batch(marker: str) -> str:
    """The batch id a :func:`batch_marker` names, as text."""
    return marker.rsplit(":", 1)[-1]


def marked_batch(
    metadata: Mapping[TopicPartition, str], partitions: Iterable[TopicPartition], query_id: str
) -> int | None:
    """The batch id that every one of ``partitions`` carries from query ``query_id``, if any."""
    prefix = f"{MARKER_PREFIX}:{query_id}:"
    batches = []
    for tp in partitions:
        marker = metadata.get(tp, "")
        if not marker.startswith(prefix) or not marker[len(prefix) :].isdigit():
            return None
        batches.append(int(marker[len(prefix) :]))
    return min(batches) if batches else None


class BatchAction(StrEnum):
    """What the coordinated sink does with a batch, given G and the batch's offset range."""

    RUN = "run"  #: G is where the batch starts: produce it and commit its end to G
    SKIP = "skip"  #: G already holds the batch end: its output is visible, a replay
    CONFLICT = "conflict"  #: G is ahead of the start but not at the end: someone else wrote


@dataclass(frozen=True)
class BatchDecision:
    """The action for a batch and, for a conflict or an anomaly, why."""

    action: BatchAction
    detail: str = ""


def decide_batch(
    committed: Mapping[TopicPartition, int],
    start: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
    *,
    batch_id: int,
    committed_batch: int | None = None,
) -> BatchDecision:
    """Decide the coordinated sink's action for batch ``batch_id`` reading ``[start, end)``.

    ``committed_batch`` is the batch id G's markers name for this checkpoint
    (see :func:`marked_batch`).  One transaction moves G from the batch start
    to its end for every partition at once, so with one writer G is either at
    ``start`` (run) or at ``end`` with this batch's marker (skip: a replay).
    The marker matters for batches that read no input (``start == end``):
    Spark runs them for stateful queries to emit what a watermark closed, and
    only the batch id tells them apart.  A batch that reads input is also
    visible when G covers its end, whoever moved G.

    A partition of G past ``start`` but short of ``end`` means a writer with
    other batch boundaries (another checkpoint) got there first: running would
    duplicate, so it is a conflict.  A partition G has never seen, or G behind
    ``start`` (G reset by hand), is allowed and reported.
    """
    if committed_batch is not None and committed_batch >= batch_id:
        return BatchDecision(BatchAction.SKIP)
    reads_input = any(end[tp] != start.get(tp, 0) for tp in end)
    if reads_input and covers(committed, end):
        return BatchDecision(BatchAction.SKIP)
    ahead = {
        tp: committed[tp]
        for tp in end
        # A partition new in this batch (absent from start) is read from its beginning.
        if tp in committed and committed[tp] > start.get(tp, 0)
    }
    if ahead:
        return BatchDecision(
            BatchAction.CONFLICT,
            f"progress group is at {to_spark_json(ahead)}, past this batch's start "
            f"{to_spark_json({tp: start.get(tp, 0) for tp in ahead})} but not at its end "
            f"{to_spark_json({tp: end[tp] for tp in ahead})}",
        )
    behind = {
        tp: committed[tp] for tp, offset in start.items() if 0 <= committed.get(tp, -1) < offset
    }
    if behind:
        return BatchDecision(
            BatchAction.RUN,
            f"progress group {to_spark_json(behind)} is behind the checkpoint's batch start "
            f"{to_spark_json({tp: start[tp] for tp in behind})} (offsets reset by hand?)",
        )
    return BatchDecision(BatchAction.RUN)
