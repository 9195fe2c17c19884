"""Pure decisions on a pipeline's progress: lag, worst partitions, input rate, stalls.

The health monitor reads, every check interval, the committed offsets of the
progress group ``G`` and the end offsets of the source partitions (a
:class:`Reading`).  From the series of readings this module says how far
behind the sink is, how fast input arrives, when ``G`` last advanced, and
whether the pipeline is stalled: input is waiting (lag > 0) and ``G`` has not
moved for the stall timeout while the driver was Ready.  No I/O and no clock
here: time comes in as arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from eop_spark.contract.offsets import TopicPartition

#: How many partitions the status lists (the ones with the largest lag).
WORST_PARTITIONS = 3
#: How many past readings the input rate is computed over.
RATE_SAMPLES = 10


@dataclass(frozen=True)
class PartitionOffsets:
    """One source partition: where ``G`` is and where the input ends."""

    topic: str
    partition: int
    #: G's committed offset; None when G has never committed this partition.
    committed: int | None
    #: The partition's end offset (last stable offset: committed input only).
    end: int
    #: Where the pipeline starts a partition G has not seen (from startingOffsets).
    start: int

    @property
    def lag(self) -> int:
        """Records of this partition without visible output yet."""
        position = self.start if self.committed is None else self.committed
        return max(0, self.end - position)


@dataclass(frozen=True)
class Reading:
    """What one check saw, at ``at`` (seconds since the epoch)."""

    at: float
    partitions: tuple[PartitionOffsets, ...]

    @property
    def lag(self) -> int:
        """Total records without visible output yet."""
        return sum(p.lag for p in self.partitions)

    def committed(self) -> dict[TopicPartition, int]:
        """G's committed offsets by partition (partitions it never committed are absent)."""
        return {
            (p.topic, p.partition): p.committed for p in self.partitions if p.committed is not None
        }

    def ends(self) -> dict[TopicPartition, int]:
        """End offsets by partition."""
        return {(p.topic, p.partition): p.end for p in self.partitions}


@dataclass(frozen=True)
class ProgressHistory:
    """What the checks so far remember: G's last offsets, when they last moved, recent ends."""

    committed: Mapping[TopicPartition, int]
    #: When G's offsets last moved, or when watching began if they never moved since.
    last_advance: float
    #: Whether ``last_advance`` is a real advance seen by a check (not only the first look).
    advance_seen: bool
    #: (time, end offsets) of the latest readings, oldest first.
    samples: tuple[tuple[float, Mapping[TopicPartition, int]], ...]


@dataclass(frozen=True)
class Health:
    """The verdict of one check."""

    lag: int
    worst: tuple[PartitionOffsets, ...]
    #: Input records per second over the recent readings; None before two readings.
    input_rate: float | None
    #: When G last advanced, as read; None when no check has seen it move yet.
    last_advance: float | None
    #: Seconds without progress while input waits and the driver is Ready (0 when not stalled).
    idle_seconds: float
    stalled: bool


def advanced(before: Mapping[TopicPartition, int], after: Mapping[TopicPartition, int]) -> bool:
    """Whether G moved: a partition committed further, or committed for the first time."""
    return any(offset > before.get(tp, -1) for tp, offset in after.items())


def remember(history: ProgressHistory | None, reading: Reading) -> ProgressHistory:
    """Fold one reading into the history (the first one starts it)."""
    committed = reading.committed()
    sample = (reading.at, reading.ends())
    if history is None:
        return ProgressHistory(committed, reading.at, False, (sample,))
    moved = advanced(history.committed, committed)
    return ProgressHistory(
        committed=committed,
        last_advance=reading.at if moved else history.last_advance,
        advance_seen=history.advance_seen or moved,
        samples=(*history.samples, sample)[-RATE_SAMPLES:],
    )


def input_rate(samples: Iterable[tuple[float, Mapping[TopicPartition, int]]]) -> float | None:
    """Records per second appended to the partitions seen in both the first and last sample.

    A shrinking end offset (topic recreated) counts as no input, never as negative.
    """
    series = list(samples)
    if len(series) < 2:
        return None
    (t0, first), (t1, last) = series[0], series[-1]
    if t1 <= t0:
        return None
    grown = sum(max(0, last[tp] - first[tp]) for tp in last.keys() & first.keys())
    return grown / (t1 - t0)


def worst_partitions(
    partitions: Iterable[PartitionOffsets], count: int = WORST_PARTITIONS
) -> tuple[PartitionOffsets, ...]:
    """The ``count`` partitions with the largest lag (ties by topic, partition); none at 0."""
    lagging = [p for p in partitions if p.lag > 0]
    return tuple(sorted(lagging, key=lambda p: (-p.lag, p.topic, p.partition))[:count])


def assess(
    history: ProgressHistory,
    reading: Reading,
    *,
    stall_timeout: float,
    ready_since: float | None,
) -> Health:
    """Lag, input rate and the stall verdict after ``reading`` was folded into ``history``.

    ``ready_since`` is when the driver became Ready (or was last restarted by
    the operator, whichever is later); None while it is not Ready.  A pipeline
    is stalled when input waits, the driver is Ready, and G has not moved for
    ``stall_timeout`` seconds counted from the later of its last advance and
    ``ready_since``: a driver that is starting, or was just restarted, always
    gets a full window.
    """
    lag = reading.lag
    idle = 0.0
    if lag > 0 and ready_since is not None:
        idle = max(0.0, reading.at - max(history.last_advance, ready_since))
    return Health(
        lag=lag,
        worst=worst_partitions(reading.partitions),
        input_rate=input_rate(history.samples),
        last_advance=history.last_advance if history.advance_seen else None,
        idle_seconds=idle,
        stalled=idle >= stall_timeout and idle > 0,
    )
