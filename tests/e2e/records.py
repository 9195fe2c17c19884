"""Records for the e2e pipelines: written in bursts while a test disrupts, checked exactly once."""

from __future__ import annotations

import threading
import time
from collections import Counter

from devenv.kafka import KafkaBroker
from tests.e2e.test_cluster import _produce


class BurstProducer(threading.Thread):
    """Writes ``records`` to ``topic`` in ``bursts`` bursts, ``pause`` seconds apart, while the
    test goes on; an error is kept in ``error`` for the test to report."""

    def __init__(
        self,
        broker: KafkaBroker,
        topic: str,
        records: list[tuple[str, str]],
        *,
        bursts: int,
        pause: float,
    ) -> None:
        """Prepare; nothing is written until :meth:`start`."""
        super().__init__(name=f"e2e-producer-{topic}", daemon=True)
        self.broker, self.topic, self.pause = broker, topic, pause
        self.records = records
        self.size = max(1, -(-len(records) // bursts))
        self.error: BaseException | None = None

    def run(self) -> None:
        """Write the bursts."""
        try:
            for start in range(0, len(self.records), self.size):
                _produce(self.broker, self.topic, self.records[start : start + self.size])
                time.sleep(self.pause)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def finish(self, timeout: float) -> None:
        """Wait until every burst is written; fail with the producer's error if it had one."""
        self.join(timeout)
        assert not self.is_alive(), f"the producer of {self.topic} still writes after {timeout}s"
        assert self.error is None, f"the producer of {self.topic} failed: {self.error!r}"


def exactly_once_failure(
    seen: list[tuple[str, str]], expected: list[tuple[str, str]]
) -> str | None:
    """What is wrong with ``seen`` (a read_committed reading) against ``expected``, or None
    when every expected record is there exactly once and nothing else is."""
    counts = Counter(seen)
    duplicates = {r: n for r, n in counts.items() if n > 1}
    missing = set(expected) - set(counts)
    unexpected = set(counts) - set(expected)
    if not (duplicates or missing or unexpected):
        return None
    return (
        f"sink not exactly-once: {len(missing)} missing (e.g. {sorted(missing)[:3]}), "
        f"{len(duplicates)} duplicated (e.g. {sorted(duplicates.items())[:3]}), "
        f"{len(unexpected)} unexpected"
    )
