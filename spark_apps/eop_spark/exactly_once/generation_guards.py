"""What a new checkpoint generation must not forget: its progress, and its checkpoint.

A new generation (``<root>/gen-<k>`` with no batch yet) starts Spark from the
progress group ``G``.  Three things can make that start wrong without any error
from Kafka or Spark, and each becomes a stop with one line (the first two here,
the third, a question of the query's plan, in :mod:`eop_spark.query.state_guards`):

* **Progress missing** (invariant 7): an earlier generation read input from a
  partition (so its sink committed that partition to ``G``), but ``G`` has no
  offset for it now: expired after ``offsets.retention.minutes`` or deleted by
  hand.  Starting it at ``startingOffsets`` would repeat (earliest) or skip
  (latest) output.  The record of "committed before" is the earlier
  generations' offsets logs under the checkpoint root: a completed batch whose
  end offset for a partition is past where that generation started it; and,
  for a lost checkpoint root, the partitions the operator saw ``G`` hold
  (``RunConfig.committed_partitions``).
* **Checkpoint lost**: the checkpoint root lost every generation while ``G``
  holds progress (:func:`check_checkpoint_kept`).
* **State lost** (invariant 8): a stateful query would resume ``G`` with
  empty state (:mod:`eop_spark.query.state_guards`).

Progress missing can be allowed in the spec (``source.kafka.allowMissingProgress``);
a lost checkpoint is repaired by a new generation from ``G``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from eop_spark.contract.errors import CheckpointLost, ProgressMissing
from eop_spark.contract.offsets import Offsets, TopicPartition, to_spark_json
from eop_spark.contract.progress_names import ProgressNames
from eop_spark.contract.run_config import RunConfig
from eop_spark.exactly_once.offsets_log import CheckpointFormatError, FileReader, OffsetsLog

_GENERATION = re.compile(r"^gen-(\d+)$")


@dataclass(frozen=True)
class EarlierProgress:
    """Per partition, the furthest end offset an earlier generation's completed batch read to."""

    offsets: Offsets
    #: The generation that reached each offset.
    generation: dict[TopicPartition, int]


def earlier_generations(root: str, files: FileReader, generation: int) -> list[int]:
    """The generations below ``generation`` that have a directory under ``root``, ascending."""
    found = (_GENERATION.match(name) for name in files.list_names(root.rstrip("/")))
    return sorted(k for m in found if m is not None and (k := int(m.group(1))) < generation)


def earlier_progress(root: str, files: FileReader, generation: int) -> EarlierProgress:
    """What earlier generations under ``root`` committed to G (see the module docstring).

    Per generation, the last completed batch (``commits/N``) against the
    generation's initial offsets: a partition whose end is past its start was
    read, so its output and its offset in G were committed.  Unreadable
    checkpoints are skipped: they can only make the record smaller.
    """
    offsets: Offsets = {}
    by: dict[TopicPartition, int] = {}
    for k in earlier_generations(root, files, generation):
        log = OffsetsLog(f"{root.rstrip('/')}/gen-{k}", files)
        try:
            completed = log.committed_batches()
            if not completed:
                continue
            end = log.end_offsets(completed[-1])
            start = log.start_offsets(0)
        except CheckpointFormatError:
            continue
        for tp, offset in end.items():
            if offset > max(start.get(tp, 0), 0) and offset >= offsets.get(tp, -1):
                offsets[tp], by[tp] = offset, k
    return EarlierProgress(offsets, by)


def check_checkpoint_kept(config: RunConfig, files: FileReader) -> None:
    """Raise :class:`CheckpointLost` when the checkpoint root lost every generation.

    Lost means: no ``gen-*`` under the root holds a checkpoint (Spark's
    ``metadata`` file, written when a query starts; an object store or a
    volume may keep empty directories of deleted files), the operator saw ``G`` hold
    progress (``config.committed_partitions``, so some generation ran batches under
    this root), and this run does not begin a generation the operator just started
    (``config.generation_reason``).  That is a deleted prefix in object storage, or
    a volume whose files were deleted; the operator cannot see either (it never
    holds the store's credentials) and learns it from this failure.  It then starts
    a new generation from ``G``, with the same guards as for a lost claim.  Without
    an operator (``eop run``), the configuration has no record of ``G`` and a run
    on an empty root starts the generation from ``G`` as a new one.
    """
    if config.generation_reason is not None or not config.committed_partitions:
        return
    root = config.checkpoint_root.rstrip("/")
    generations = [name for name in files.list_names(root) if _GENERATION.match(name)]
    if any(files.read_text(f"{root}/{name}/metadata") is not None for name in generations):
        return
    held = sum(len(p) for p in config.committed_partitions.values())
    raise CheckpointLost(
        f"checkpoint root {root} holds no checkpoint generation, but progress group "
        f"{config.progress_group} has held progress for {held} partitions "
        "(status.progress.heldPartitions): the checkpoint was lost (its objects or files were "
        f"deleted). A new checkpoint generation {config.generation + 1} from the progress group "
        "repairs it: the operator starts one (CheckpointLost); with eop run, run with "
        f"--generation {config.generation + 1}"
    )


def check_progress_kept(
    config: RunConfig,
    earlier: EarlierProgress,
    committed: Mapping[TopicPartition, int],
    partitions: Iterable[TopicPartition],
    names: ProgressNames | None = None,
) -> list[TopicPartition]:
    """Raise :class:`ProgressMissing` unless G holds every partition it held before.

    "Held before": an earlier generation's offsets log says it read the
    partition, or the operator saw ``G`` hold it (``config.committed_partitions``:
    the only record left when the checkpoint root was lost).  Returns the
    missing partitions (empty when nothing is missing, or when the spec opts in
    to start them at ``startingOffsets``).  ``names``: where ``G`` keeps its
    offsets (named in the message).
    """
    current = set(partitions)
    check_progress_not_behind(config, earlier, committed, current, names)
    missing = {
        tp: offset
        for tp, offset in sorted(earlier.offsets.items())
        if tp in current and tp not in committed
    }
    seen = {(t, p) for t, ps in (config.committed_partitions or {}).items() for p in ps}
    only_seen = sorted(tp for tp in seen & current if tp not in committed and tp not in missing)
    lost = sorted([*missing, *only_seen])
    if not lost or config.source.kafka.allow_missing_progress:
        return lost
    lost_names = ", ".join(f"{t}-{p}" for t, p in lost)
    where = (names or ProgressNames(config.progress_group)).where()
    sources = []
    if missing:
        generations = ", ".join(
            f"gen-{k}" for k in sorted({earlier.generation[tp] for tp in missing})
        )
        sources.append(f"{generations} committed before")
    if only_seen:
        sources.append("the operator saw it hold before (status.progress.heldPartitions)")
    restore = f"; earlier generations had read to {to_spark_json(missing)}" if missing else ""
    raise ProgressMissing(
        f"{describe_generation(config)}: {where} "
        f"has no committed offset for {lost_names}, which {' and '.join(sources)} (expired "
        "after the broker's offsets.retention.minutes, or deleted); starting at startingOffsets "
        "would repeat or skip output. Restore the offsets (kafka-consumer-groups --reset-offsets "
        f"--group {config.progress_group}{restore}) "
        "or set spec.source.kafka.allowMissingProgress: true to start them at startingOffsets"
    )


def check_progress_not_behind(
    config: RunConfig,
    earlier: EarlierProgress,
    committed: Mapping[TopicPartition, int],
    partitions: Iterable[TopicPartition],
    names: ProgressNames | None = None,
) -> None:
    """Raise :class:`ProgressMissing` when G holds a partition below where it was before.

    After an earlier generation completed a batch, G held at least the
    batch's end offsets; less now means G went back (a commit by hand, or a
    commit that raced a runner), and starting there would repeat output.  A
    stateless generation resets G on purpose (``config.reset_progress``) and
    is not asked.
    """
    if config.reset_progress:
        return
    current = set(partitions)
    behind = [
        (tp, committed[tp], offset)
        for tp, offset in sorted(earlier.offsets.items())
        if tp in current and tp in committed and committed[tp] < offset
    ]
    if not behind:
        return
    where = (names or ProgressNames(config.progress_group)).where()
    found = ", ".join(
        f"{t}-{p} at {g}, below the {offset} gen-{earlier.generation[(t, p)]} completed"
        for (t, p), g, offset in behind
    )
    restore = to_spark_json({tp: offset for tp, _, offset in behind})
    raise ProgressMissing(
        f"{describe_generation(config)}: {where} went back: it holds {found}; starting there "
        "would repeat output. Restore the offsets (kafka-consumer-groups --reset-offsets "
        f"--group {config.progress_group}; earlier generations had read to {restore}), or "
        "reprocess on purpose with upgrade.mode stateless"
    )


#: How a refusal names what started a generation (the operator's upgrade reasons).
_STARTED_BY = {
    "SpecChanged": "an upgrade",
    "RestartNonce": "a restart (restartNonce)",
    "RolledBack": "a rollback to the last stable spec",
    "FellBack": "a fallback after failed restarts",
    "CheckpointRecovery": "a checkpoint recovery",
    "CheckpointLost": "a lost checkpoint",
}


def describe_generation(config: RunConfig) -> str:
    """``new checkpoint generation k``, with what started it when the operator said."""
    reason = config.generation_reason
    started = f" (started by {_STARTED_BY.get(reason, reason)})" if reason else ""
    return f"new checkpoint generation {config.generation}{started}"
