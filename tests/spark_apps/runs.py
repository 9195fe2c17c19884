"""Whole runs in tests: kill one repeatedly, finish one, check its output is exactly once.

The runner processes themselves are driven by :mod:`devenv.runners` (shared with
the benchmark).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from devenv.runners import Pipeline, Runner


def kill_repeatedly(
    pipeline: Pipeline,
    config: Mapping[str, Any],
    kills: int,
    rng: random.Random,
    *,
    generation: Callable[[int], int | None] = lambda _: None,
) -> list[Runner]:
    """Start the runner and SIGKILL it ``kills`` times at random moments.

    Most kills land 0-2.5 s after a batch was logged, i.e. while the next
    batch is reading, producing or committing; every third lands at a random
    time after start (planning, recovery, taking over the ids).  A runner
    never lives past :data:`BATCHES_PER_KILL` batches, so the input lasts for
    every kill however fast the machine is (a runner that found no input left
    would wait for a batch forever): tests give the input at least
    ``kills * BATCHES_PER_KILL + 1`` batches.
    """
    runners = []
    for round_ in range(kills):
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
