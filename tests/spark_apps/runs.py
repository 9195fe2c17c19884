"""Whole runs in tests: kill one repeatedly, finish one, check its output is exactly once.

The runner processes themselves are driven by :mod:`devenv.runners` (shared with
the benchmark).
"""

from __future__ import annotations

import itertools
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from devenv.runners import Pipeline, Runner, produce


class Input:
    """A scenario's input, produced as its runners consume it: only as much as the kills need.

    :meth:`top_up` keeps :data:`BATCHES_AHEAD` batches of ``per_batch`` records beyond G
    on the source topic. :func:`kill_repeatedly` tops up before each runner, and a runner
    never lives past :data:`BATCHES_PER_KILL` batches, so none runs out of input however
    fast the machine is (one that did would wait for a batch forever), and the last runner
    has at most those batches (and one more) left to do.
    """

    def __init__(
        self, pipeline: Pipeline, records: Iterator[tuple[str, str, int]], per_batch: int
    ) -> None:
        self.pipeline = pipeline
        self.per_batch = per_batch
        self._records = records
        #: Every record produced, in order.
        self.produced: list[tuple[str, str, int]] = []

    def backlog(self) -> int:
        """Records on the source topic beyond G.

        G as committed so far: a killed runner's open transaction never commits (the next
        runner aborts it), and one killed while committing adds at most a batch.
        """
        end = self.pipeline.end_offsets()
        done = self.pipeline.progress(stable=False)
        return sum(offset - done.get(tp, 0) for tp, offset in end.items())

    def top_up(self) -> None:
        """Produce records until :data:`BATCHES_AHEAD` batches lie beyond G."""
        missing = BATCHES_AHEAD * self.per_batch - self.backlog()
        if missing > 0:
            self.add(list(itertools.islice(self._records, missing)))

    def add(self, records: list[tuple[str, str, int]]) -> None:
        """Produce ``records`` (after every record produced before them)."""
        produce(self.pipeline.broker, self.pipeline.source_topic, records)
        self.produced.extend(records)


def kill_repeatedly(
    pipeline: Pipeline,
    config: Mapping[str, Any],
    kills: int,
    rng: random.Random,
    source: Input,
    *,
    generation: Callable[[int], int | None] = lambda _: None,
) -> list[Runner]:
    """Start the runner and SIGKILL it ``kills`` times at random moments.

    Most kills land 0-2.5 s after a batch was logged, i.e. while the next
    batch is reading, producing or committing; every third lands at a random
    time after start (planning, recovery, taking over the ids).  ``source`` is
    topped up before each start (:class:`Input`).
    """
    runners = []
    for round_ in range(kills):
        source.top_up()
        runner = pipeline.start(config, generation=generation(round_))
        runners.append(runner)
        if round_ % 3 == 2:
            _live_until(runner, time.monotonic() + rng.uniform(3, 25), BATCHES_PER_KILL)
        else:
            runner.wait_for("a batch", lambda r=runner: len(r.batches()) > 0, 240)
            _live_until(runner, time.monotonic() + rng.uniform(0, 2.5), BATCHES_PER_KILL)
        assert runner.alive, f"runner died on its own before kill {round_}\n{runner.tail()}"
        runner.kill()
    return runners


#: The most batches a runner logs before :func:`kill_repeatedly` kills it.
BATCHES_PER_KILL = 3
#: Batches of input :meth:`Input.top_up` keeps beyond G: more than a runner may take.
BATCHES_AHEAD = BATCHES_PER_KILL + 2


def _live_until(runner: Runner, deadline: float, batches: int) -> None:
    """Let ``runner`` run until ``deadline``, or until it has logged ``batches`` batches."""
    while time.monotonic() < deadline and runner.alive and len(runner.batches()) < batches:
        time.sleep(0.05)


def finish(
    pipeline: Pipeline,
    config: Mapping[str, Any],
    *,
    generation: int | None = None,
    timeout: float = 600,
) -> Runner:
    """Run until G reaches the source end, then stop it with SIGTERM (exit 0)."""
    runner = pipeline.start(config, generation=generation)
    runner.wait_for(
        "the query to start",
        lambda: any(m.startswith("commit mode") for m in runner.messages()),
        timeout,
    )
    runner.wait_for("G to reach the source end offsets", pipeline.caught_up, timeout)
    runner.terminate()
    assert runner.wait(180) == 0, runner.tail()
    return runner


def assert_exactly_once(
    output: Iterable[tuple[bytes | None, bytes | None]], expected_keys: Iterable[str]
) -> None:
    """Every expected key is in the output exactly once, and nothing else is."""
    seen = Counter(k.decode() if k is not None else None for k, _ in output)
    duplicates = {k: n for k, n in seen.items() if n > 1}
    expected = set(expected_keys)
    missing = expected - set(seen)
    unexpected = set(seen) - expected
    assert not duplicates, f"{len(duplicates)} keys repeated, e.g. {list(duplicates.items())[:5]}"
    assert not missing, f"{len(missing)} keys missing, e.g. {sorted(missing)[:5]}"
    assert not unexpected, f"{len(unexpected)} unexpected keys, e.g. {sorted(unexpected)[:5]}"
