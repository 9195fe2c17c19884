"""What ``eop verify`` found: the tally of discrepancies and the report a person reads.

Pure: the comparison (:mod:`eop_spark.verify.recount`) hands over one
:class:`Group` per distinct (key, value) whose expected and found counts
differ; :class:`Tally` counts them and keeps the first examples of each kind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from eop_spark.contract.errors import EXIT_DISCREPANCIES, EXIT_OK
from eop_spark.contract.offsets import TopicPartition

#: Examples of each kind of discrepancy a report shows.
EXAMPLES = 5
#: The longest key or value a report prints (longer ones end with "...").
SHOWN_BYTES = 200


@dataclass(frozen=True)
class Group:
    """All records of one (key, value): how many the recount expects, how many the sink has.

    ``expected_at``: source coordinates (``topic-partition@offset``) of the
    input records that made it, when the transform keeps provenance;
    ``found_at``: sink coordinates of the records found.  A few of each.
    """

    key: bytes | None
    value: bytes | None
    expected: int
    found: int
    expected_at: Sequence[str] = ()
    found_at: Sequence[str] = ()

    def discrepancies(self) -> tuple[int, int, int]:
        """(duplicates, missing, unexpected) this group adds.

        Found more often than expected: the extra copies are duplicates, or
        unexpected when the recount expects none of this (key, value) at all
        (an aggregate with a wrong value is one missing and one unexpected).
        """
        if self.found > self.expected:
            extra = self.found - self.expected
            return (extra, 0, 0) if self.expected > 0 else (0, 0, extra)
        return 0, self.expected - self.found, 0


@dataclass
class Tally:
    """Discrepancy counts and :data:`EXAMPLES` groups of each kind (the first the comparison
    hands over: in no particular order)."""

    duplicates: int = 0
    missing: int = 0
    unexpected: int = 0
    examples: dict[str, list[Group]] = field(
        default_factory=lambda: {"duplicates": [], "missing": [], "unexpected": []}
    )

    def add(self, group: Group) -> None:
        """Count one group (groups whose counts agree add nothing)."""
        counts = dict(
            zip(("duplicates", "missing", "unexpected"), group.discrepancies(), strict=True)
        )
        for kind, count in counts.items():
            if count:
                setattr(self, kind, getattr(self, kind) + count)
                if len(self.examples[kind]) < EXAMPLES:
                    self.examples[kind].append(group)

    @classmethod
    def of(cls, groups: Iterable[Group]) -> Tally:
        """The tally of ``groups``."""
        tally = cls()
        for group in groups:
            tally.add(group)
        return tally

    @property
    def clean(self) -> bool:
        """Whether the sink holds exactly the recomputed output."""
        return self.duplicates == self.missing == self.unexpected == 0


@dataclass(frozen=True)
class Range:
    """Offsets ``[start, end)`` per partition of a topic range, and what chose them."""

    start: Mapping[TopicPartition, int]
    end: Mapping[TopicPartition, int]
    why: str

    def records(self) -> int:
        """Offsets in the range (an upper bound of records: markers and aborts take some)."""
        return sum(max(0, self.end[tp] - self.start.get(tp, 0)) for tp in self.end)


@dataclass(frozen=True)
class Report:
    """One verification: the pipeline, its ranges, the totals and the tally."""

    pipeline: str
    source: Range
    sink_topic: str
    sink: Range
    records_in: int
    expected_out: int
    found: int
    tally: Tally
    #: What the recount expects of the sink (record-wise, or windows closed).
    recount: str = "record-wise"
    #: Seconds the check took (starting its Spark session included, when it started one).
    elapsed_s: float = 0.0

    @property
    def exit_code(self) -> int:
        """0 when clean, :data:`EXIT_DISCREPANCIES` otherwise."""
        return EXIT_OK if self.tally.clean else EXIT_DISCREPANCIES

    def render(self) -> str:
        """The report as text: totals first, then examples of each discrepancy."""
        tally = self.tally
        lines = [
            f"eop verify {self.pipeline}",
            f"input   {_range_line(self.source)}",
            f"        ({self.source.why})",
            f"sink    {self.sink_topic}: {_range_line(self.sink)}, read_committed",
            f"recount {self.recount}",
            "",
            f"  records in      {self.records_in:>12,}",
            f"  expected out    {self.expected_out:>12,}",
            f"  found in sink   {self.found:>12,}",
            f"  duplicates      {tally.duplicates:>12,}",
            f"  missing         {tally.missing:>12,}",
            f"  unexpected      {tally.unexpected:>12,}",
            "",
            f"checked in {self.elapsed_s:.1f} s "
            f"({(self.records_in + self.found) / max(self.elapsed_s, 1e-3):,.0f} records/s read)",
        ]
        for kind, groups in tally.examples.items():
            if groups:
                lines += ["", f"{kind}, {len(groups)} of {getattr(tally, kind):,}:"]
                lines += [f"  {describe(group)}" for group in groups]
        lines.append("")
        if tally.clean:
            lines.append("OK: the sink holds exactly the output recomputed from the input range")
        else:
            lines.append(
                f"DISCREPANCIES: the sink differs from the recomputed output "
                f"(exit {EXIT_DISCREPANCIES})"
            )
        return "\n".join(lines)


def _range_line(where: Range) -> str:
    parts = [
        f"{topic}-{partition} [{where.start.get((topic, partition), 0)}, {end})"
        for (topic, partition), end in sorted(where.end.items())
    ]
    return ", ".join(parts) if parts else "(no partition)"


def describe(group: Group) -> str:
    """One line for a group: key, value, counts, and where its records are."""
    line = (
        f"key={shown(group.key)} value={shown(group.value)}: "
        f"expected {group.expected}, found {group.found}"
    )
    if group.found_at:
        line += f" at {', '.join(group.found_at)}"
    if group.expected_at:
        line += f"; from input {', '.join(group.expected_at)}"
    return line


def shown(data: bytes | None) -> str:
    """A key or value as a person reads it: quoted text, else hex; ``null`` for none."""
    if data is None:
        return "null"
    try:
        text = repr(data.decode())
    except UnicodeDecodeError:
        text = "0x" + data.hex()
    return text if len(text) <= SHOWN_BYTES else text[: SHOWN_BYTES - 3] + "..."
