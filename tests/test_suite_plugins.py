"""The suite's own plugins: components stop after their last user, the clock's ceiling fails
a slow run. Each runs a small pytest session of its own (pytest's ``pytester``)."""

from __future__ import annotations

import json

import pytest

pytest_plugins = ["pytester"]

_COMPONENT = """
import json

import pytest

events = []

@pytest.fixture(scope="session")
def control_plane():
    events.append("control plane up")
    yield "cp"
    events.append("control plane down")

@pytest.fixture(scope="session")
def kafka_broker():
    return "broker"
"""


def test_a_component_stops_after_its_last_user_and_its_users_run_together(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(_COMPONENT)
    pytester.makepyfile(
        test_a="""
        from conftest import events
        def test_uses_it(control_plane):
            events.append("a uses it")
        """,
        test_b="""
        from conftest import events
        def test_uses_a_broker(kafka_broker):
            events.append("b")
        def test_the_record(kafka_broker):
            assert events == [
                "c", "control plane up", "a uses it", "d uses it", "control plane down", "b"
            ], events
        """,
        test_c="""
        from conftest import events
        def test_needs_nothing():
            events.append("c")
        """,
        test_d="""
        from conftest import events
        def test_uses_it_too(control_plane):
            events.append("d uses it")
        """,
    )
    result = pytester.runpytest("-p", "tests.plugins.lifetimes", "-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=5)


def test_the_clock_fails_a_run_past_its_ceiling(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile("import time\ndef test_slow():\n    time.sleep(0.2)\n")
    monkeypatch.setenv("EOP_SUITE_CEILING_MINUTES", "0.001")
    failed = pytester.runpytest("-p", "tests.plugins.suite_clock", "-p", "no:cacheprovider")
    assert failed.ret == pytest.ExitCode.TESTS_FAILED
    failed.stdout.fnmatch_lines(["*past its ceiling of 0 min*", "*suite total*"])
    monkeypatch.setenv("EOP_SUITE_CEILING_MINUTES", "5")
    passed = pytester.runpytest("-p", "tests.plugins.suite_clock", "-p", "no:cacheprovider")
    assert passed.ret == pytest.ExitCode.OK
    passed.stdout.fnmatch_lines(["*unit*1*", "*suite total*(ceiling 5 min)*"])


_BUSY = """
import subprocess, sys

def test_busy():
    # A process whose command line names the operator, busy for about a second of CPU.
    subprocess.run(
        [sys.executable, "-c", "import time\\nend = time.process_time() + 1.2\\n"
         "while time.process_time() < end: pass", "eop_operator"],
        check=True,
    )
"""


def test_the_clock_counts_cpu_by_kind_of_process_and_per_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, pytestconfig: pytest.Config
) -> None:
    pytester.makepyfile(_BUSY)
    monkeypatch.setenv("PYTHONPATH", str(pytestconfig.rootpath))
    clock = pytester.path / "clock.json"
    result = pytester.runpytest_subprocess(
        "-p", "tests.plugins.suite_cpu", "-p", "tests.plugins.suite_clock",
        "-p", "no:cacheprovider", "--suite-clock", str(clock),
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*CPU * core-minutes, by kind:*"])
    written = json.loads(clock.read_text())
    assert written["cpu"]["operator"] >= 0.8, written["cpu"]
    (test,) = [t for t in written["cpu_per_test"] if t.endswith("test_busy")]
    assert written["cpu_per_test"][test]["operator"] >= 0.8
