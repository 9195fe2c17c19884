"""Pure failover decisions: count driver restarts, classify terminations, back off.

The StatefulSet (and the kubelet) restart a driver that dies; the operator
counts those restarts within a window, reads why the driver stopped from its
termination message (``eop: error: [Reason] ...``, see ``eop_spark.contract.termination``)
and decides whether the pipeline is Degraded or needs a new checkpoint
generation.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass

from eop_operator.api.models import FailoverSpec, FailoverStatus
from eop_operator.reconcile.observe import PodObservation, Termination
from eop_spark.contract.errors import EXIT_CONFIG, EXIT_PROGRESS_MISSING, EXIT_STATE_LOST
from eop_spark.contract.termination import FailureReason, parse_failure_line

#: The reason of a driver pod that went with its node (``observe.lost_with_node``): not the
#: runner's, which never got to say anything. Restarting on another node helps.
NODE_LOST = "NodeLost"
#: How many driver pods' termination counts are remembered.
SEEN_PODS = 16
#: Reasons a new checkpoint generation (from the progress group) repairs.
CHECKPOINT_REASONS = frozenset(
    {
        FailureReason.INCOMPATIBLE_CHECKPOINT,
        FailureReason.CORRUPT_CHECKPOINT,
        FailureReason.CHECKPOINT_LOST,
    }
)
#: Reasons after which restarting the same driver may help (Kafka back, a passing fault).
RETRYABLE = frozenset({FailureReason.FAILED, FailureReason.ENVIRONMENT})
#: Reasons after which restarting the same driver cannot help: every other reason the
#: runner names (ConfigError, and any refusal it adds), so a new one is Degraded at once.
HOPELESS = frozenset(set(FailureReason) - RETRYABLE - CHECKPOINT_REASONS)


def stamp(now: datetime.datetime) -> str:
    """The status' time format (RFC 3339, seconds)."""
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_stamp(text: str) -> datetime.datetime:
    """Read a time written by :func:`stamp`."""
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)


#: Exit codes of a runner that stopped for good: its configuration must change first (a
#: new generation without the progress it needs, or one that would lose a query's state).
STOPPED_FOR_GOOD = frozenset({EXIT_CONFIG, EXIT_PROGRESS_MISSING, EXIT_STATE_LOST})


def _logged(line: str) -> str | None:
    """The ``msg`` of a JSON log line (``--log-format json``), if ``line`` is one."""
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return str(record["msg"]) if isinstance(record, dict) and "msg" in record else None


def classify(termination: Termination) -> tuple[str, str]:
    """The reason (a runner's :class:`FailureReason`, or :data:`NODE_LOST`) and message of a
    driver termination.

    A driver killed before it wrote its one line (SIGKILL after the grace
    period, the OOM killer) has the last lines of its log as the message
    (``FallbackToLogsOnError``): the JSON log record is read down to its text.
    """
    if termination.node_lost:
        return NODE_LOST, termination.message
    reason, message = parse_failure_line(termination.message)
    logged = _logged(message) if reason is None else None
    if logged is not None:
        message = f"exit {termination.exit_code} without a message; last logged: {logged}"
    if reason in (None, FailureReason.FAILED) and termination.exit_code in STOPPED_FOR_GOOD:
        reason = FailureReason.CONFIG_ERROR
    return reason or FailureReason.FAILED, message


@dataclass(frozen=True, kw_only=True)
class Failure:
    """A driver termination the operator has not counted before."""

    pod: str
    spec_hash: str | None
    #: A :class:`FailureReason` of the runner, or :data:`NODE_LOST`.
    reason: str
    message: str


@dataclass(frozen=True, kw_only=True)
class Counted:
    """The failover status after counting, and what was new."""

    status: FailoverStatus
    new: tuple[Failure, ...]


def count_failures(
    previous: FailoverStatus,
    pods: tuple[PodObservation, ...],
    *,
    now: datetime.datetime,
    spec: FailoverSpec,
) -> Counted:
    """Count the terminations of ``pods`` not seen before; keep those within the window.

    A pod's failures are its container restarts plus a termination happening now
    (or a Failed pod), tracked per pod uid (the last ``SEEN_PODS`` pods), so each
    is counted once however often, and however late, the operator looks.
    """
    window = spec.window.delta
    # Pods that are gone stay remembered for a while: a late watch event must not count twice.
    seen: dict[str, int] = dict(list(previous.seen.items())[-SEEN_PODS:])
    recent = [t for t in previous.recent if now - parse_stamp(t) <= window]
    ended: list[tuple[str, Failure, int]] = []
    for pod in pods:
        total = pod.failures
        before = previous.seen.get(pod.uid, 0)
        if total > before:
            seen.pop(pod.uid, None)  # most recent last
            seen[pod.uid] = total
        if total <= before or pod.termination is None:
            continue
        reason, message = classify(pod.termination)
        at = pod.termination.finished_at or stamp(now)
        failure = Failure(pod=pod.name, spec_hash=pod.spec_hash, reason=reason, message=message)
        ended.append((at, failure, total - before))
        recent.extend([stamp(now)] * (total - before))
    # Watch events of different pods arrive in any order: the last termination is
    # the one that ended last, not the one counted last.
    ended.sort(key=lambda item: item[0])
    status = previous.model_copy(
        update={
            "restarts": previous.restarts + sum(n for _, _, n in ended),
            "recent": recent,
            "seen": seen,
        }
    )
    if ended and (previous.last_time is None or ended[-1][0] >= previous.last_time):
        at, last, _ = ended[-1]
        status = status.model_copy(
            update={"last_reason": str(last.reason), "last_message": last.message, "last_time": at}
        )
    return Counted(status=status, new=tuple(failure for _, failure, _ in ended))


def crash_looping(status: FailoverStatus, spec: FailoverSpec) -> bool:
    """More restarts within the window than ``maxRestarts`` allows."""
    return len(status.recent) > spec.max_restarts


def backoff_seconds(status: FailoverStatus, spec: FailoverSpec) -> float:
    """Delay before the operator restarts a failed driver: doubles per recent restart."""
    initial = spec.backoff.seconds
    ceiling = spec.max_backoff.seconds
    exponent = max(0, len(status.recent) - 1)
    return float(min(ceiling, initial * 2 ** min(exponent, 30)))
