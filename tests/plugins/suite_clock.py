"""pytest plugin: where the suite's time goes, and a ceiling on its total.

At the end of every run it prints, per tier (the folder under ``tests/`` a test lives in,
with the ``slow`` chaos runs apart), the tests run and the seconds they took, against the
tier's budget in its lane (:data:`BUDGET_MINUTES`, also in docs/development.md); and the
fixtures that cost the most to set up: the real components (a broker, a control plane, a
cluster), whose start counts against the first test that asks for them. ``--suite-clock FILE``
also writes every test's setup, call and teardown seconds and every fixture's setup seconds as JSON.

A run slower than ``EOP_SUITE_CEILING_MINUTES`` minutes (default :data:`CEILING_MINUTES`
when ``CI`` is set, none otherwise) fails, after every test has run: a new slow tier is
noticed the day it lands, long before CI's own limit stops a run half way.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.suite_cpu import sampler

#: Minutes of pytest's own time past which a CI run fails: about half again the suite's
#: time, so a slow new tier fails the day it lands, long before CI's own stop at 90 minutes
#: (set-up included) would cut a run half way.
CEILING_MINUTES = 60.0

#: Each lane's tiers' budgets in minutes of a warm run on 2 cores (docs/development.md): for
#: each lane (:data:`tests.plugins.lifetimes.LANES`) the minutes its tests of that tier may
#: take, adding up to no more than the suite's 35 minutes. A run of more than one lane (plain
#: ``pytest``) prints each tier's budgets summed over the lanes.
BUDGET_MINUTES = {
    "cluster": {
        "unit": 0.5,
        "integration": 11.0,
        "charts": 1.0,
        "ecosystem": 1.5,
        "e2e": 13.0,
        "e2e (nodes)": 7.5,
    },
    "faults": {"spark_apps (slow)": 25.0, "integration": 2.5, "spark_apps": 0.5},
    "data": {
        "unit": 1.0,
        "spark_apps": 9.5,
        "spark_apps (slow)": 20.0,
        "integration": 1.0,
        "ecosystem": 0.5,
        "demo": 0.5,
        "readme": 1.0,
    },
}


def budgets(lane: str | None) -> dict[str, float]:
    """The budget of each tier in minutes: ``lane``'s own, or summed over every lane."""
    if lane is not None:
        return BUDGET_MINUTES[lane]
    summed: dict[str, float] = defaultdict(float)
    for tiers in BUDGET_MINUTES.values():
        for tier, minutes in tiers.items():
            summed[tier] += minutes
    return summed


_STASH_KEY = pytest.StashKey[dict[str, Any]]()


def tier_of(item: pytest.Item) -> str:
    """The tier a test counts against: its folder under ``tests/``, the slow and multi-node
    tests apart, and tests that need no real component as ``unit``."""
    path, tests = Path(str(item.path)), Path(str(item.config.rootpath)) / "tests"
    parts = path.relative_to(tests).parts if path.is_relative_to(tests) else (path.name,)
    folder = parts[0] if len(parts) > 1 else "readme"
    markers = {m.name for m in item.iter_markers()}
    real = {"kafka", "spark", "kube", "e2e", "nodes", "ecosystem", "s3"}
    if folder in ("operator", "spark_apps", "charts", "devenv", "readme") and not markers & real:
        return "unit"
    if "nodes" in markers:
        return "e2e (nodes)"
    if folder == "spark_apps" and "slow" in markers:
        return "spark_apps (slow)"
    return folder


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--suite-clock FILE``: write every test's and fixture's seconds to FILE as JSON."""
    parser.addoption(
        "--suite-clock",
        metavar="FILE",
        default=None,
        help="write each test's setup/call/teardown seconds and each fixture's setup seconds",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Start the clock."""
    config.stash[_STASH_KEY] = {
        "started": time.monotonic(),
        "tests": {},
        "fixtures": defaultdict(float),
    }


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None, Any, Any]:
    """Add the seconds each fixture's setup took to its total."""
    began = time.monotonic()
    try:
        return (yield)
    finally:
        clock = request.config.stash[_STASH_KEY]
        clock["fixtures"][f"{fixturedef.argname} ({fixturedef.scope})"] += time.monotonic() - began


def _record(config: pytest.Config, report: pytest.TestReport, tier: str) -> None:
    clock = config.stash[_STASH_KEY]
    entry = clock["tests"].setdefault(report.nodeid, {"tier": tier, "outcome": "passed"})
    entry[report.when] = report.duration
    if report.failed:
        entry["outcome"] = "failed"
    elif report.skipped and report.when != "teardown":
        entry["outcome"] = "skipped"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Record each phase of each test, with its tier."""
    report = yield
    _record(item.config, report, tier_of(item))
    return report


def _tiers(tests: dict[str, dict[str, Any]]) -> Iterator[tuple[str, int, float]]:
    seconds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for entry in tests.values():
        tier = entry["tier"] or "?"
        counts[tier] += 1
        seconds[tier] += sum(entry.get(w, 0.0) for w in ("setup", "call", "teardown"))
    for tier in sorted(seconds, key=seconds.__getitem__, reverse=True):
        yield tier, counts[tier], seconds[tier]


def ceiling_minutes() -> float | None:
    """The ceiling in force: ``EOP_SUITE_CEILING_MINUTES``, else 60 on CI, else none."""
    value = os.environ.get("EOP_SUITE_CEILING_MINUTES")
    if value:
        return float(value)
    return CEILING_MINUTES if os.environ.get("CI") else None


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Print the tiers against their budgets, the costliest fixtures and the total."""
    clock = config.stash[_STASH_KEY]
    tests: dict[str, dict[str, Any]] = clock["tests"]
    if not tests:
        return
    total = time.monotonic() - clock["started"]
    write = terminalreporter.write_line
    terminalreporter.section("suite clock")
    write(f"{'tier':<20} {'tests':>6} {'minutes':>8} {'budget':>7}")
    budget_of = budgets(config.getoption("--lane", None))
    for tier, count, seconds in _tiers(tests):
        budget = budget_of.get(tier)
        shown = f"{budget:7.1f}" if budget is not None else "      -"
        write(f"{tier:<20} {count:>6} {seconds / 60:8.1f} {shown}")
    fixtures = sorted(clock["fixtures"].items(), key=lambda kv: kv[1], reverse=True)
    write(
        "costliest fixture set-ups (seconds, all instances): "
        + ", ".join(f"{name} {seconds:.0f}" for name, seconds in fixtures[:10] if seconds >= 1)
    )
    cpu = sampler(config)
    if cpu is not None and cpu.total:
        capacity = total * (os.cpu_count() or 1)
        kinds = sorted(cpu.total.items(), key=lambda kv: kv[1], reverse=True)
        write(
            f"CPU {sum(cpu.total.values()) / 60:.1f} of {capacity / 60:.1f} core-minutes, by kind: "
            + ", ".join(f"{kind} {seconds / 60:.1f}" for kind, seconds in kinds if seconds >= 30)
        )
    ceiling = ceiling_minutes()
    write(
        f"suite total {total / 60:.1f} min"
        + (f" (ceiling {ceiling:.0f} min)" if ceiling is not None else "")
    )
    path = config.getoption("--suite-clock")
    if path:
        Path(path).write_text(
            json.dumps(
                {
                    "total": total,
                    "tests": tests,
                    "fixtures": clock["fixtures"],
                    "cpu": dict(cpu.total) if cpu else {},
                    "cpu_per_test": cpu.per_test if cpu else {},
                },
                indent=1,
            )
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail a run that took longer than the ceiling (every test has run by now)."""
    ceiling = ceiling_minutes()
    if ceiling is None or not session.config.stash.get(_STASH_KEY, None):
        return
    minutes = (time.monotonic() - session.config.stash[_STASH_KEY]["started"]) / 60
    if minutes > ceiling and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"FAILED: the suite took {minutes:.1f} min, past its ceiling of {ceiling:.0f} "
                "min (EOP_SUITE_CEILING_MINUTES; budgets per tier in docs/development.md)",
                red=True,
            )
