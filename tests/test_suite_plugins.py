"""The suite's own plugins: components stop after their last user, the clock's ceiling fails
a slow run. Each runs a small pytest session of its own (pytest's ``pytester``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import lanes

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


_CLUSTERS = """
import pytest

events = []

@pytest.fixture(scope="session")
def local_cluster():
    events.append("one-node cluster up")
    yield "one node"
    events.append("one-node cluster down")

@pytest.fixture(scope="session")
def nodes_e2e():
    events.append("multi-node cluster up")
    return "three nodes"
"""


def test_the_one_node_cluster_stops_before_the_multi_node_stage(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(_CLUSTERS)
    pytester.makepyfile(
        test_nodes="""
        from conftest import events
        def test_on_three_nodes(nodes_e2e):
            assert events == [
                "one-node cluster up", "on one node", "one-node cluster down",
                "multi-node cluster up",
            ], events
        """,
        test_one="""
        from conftest import events
        def test_on_one_node(local_cluster):
            events.append("on one node")
        """,
    )
    result = pytester.runpytest("-p", "tests.plugins.lifetimes", "-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=2)


_MARKED_COMPONENT = """
import pytest

events = []

def pytest_configure(config):
    config.addinivalue_line("markers", "field_broker: on the Kafka 3.x broker")

@pytest.fixture(scope="session")
def field_broker():
    events.append("field broker up")
    yield "broker"
    events.append("field broker down")

@pytest.fixture
def pipeline(request):
    if request.node.get_closest_marker("field_broker"):
        return request.getfixturevalue("field_broker")
    return "session broker"
"""


def test_a_component_a_parameter_gets_by_marker_is_a_broker_and_stops_after_it(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(_MARKED_COMPONENT)
    pytester.makepyfile(
        test_a="""
        import pytest
        from conftest import events
        @pytest.mark.parametrize("n", [1, pytest.param(2, marks=pytest.mark.field_broker)])
        def test_chaos(n, pipeline):
            events.append(f"chaos {n} on {pipeline}")
        def test_the_record():
            assert events == [
                "needs nothing",
                "chaos 1 on session broker",
                "field broker up",
                "chaos 2 on broker",
                "field broker down",
            ], events
        """,
        test_b="""
        from conftest import events
        def test_needs_nothing():
            events.append("needs nothing")
        """,
    )
    result = pytester.runpytest("-p", "tests.plugins.lifetimes", "-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=4)


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
    # A process whose command line names the operator, busy for 1.5 s of CPU (the sampler,
    # every 0.2 s here, may miss its last sample).
    subprocess.run(
        [sys.executable, "-c", "import time\\nend = time.process_time() + 1.5\\n"
         "while time.process_time() < end: pass", "eop_operator"],
        check=True,
    )
"""


def test_the_clock_counts_cpu_by_kind_of_process_and_per_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, pytestconfig: pytest.Config
) -> None:
    pytester.makepyfile(_BUSY)
    monkeypatch.setenv("PYTHONPATH", str(pytestconfig.rootpath))
    monkeypatch.setenv("EOP_SUITE_CPU_INTERVAL", "0.2")
    clock = pytester.path / "clock.json"
    result = pytester.runpytest_subprocess(
        "-p", "tests.plugins.suite_cpu", "-p", "tests.plugins.suite_clock",
        "-p", "no:cacheprovider", "--suite-clock", str(clock),
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*CPU * core-minutes, by kind:*"])
    written = json.loads(clock.read_text())
    assert written["cpu"]["operator"] >= 1.2, written["cpu"]
    (test,) = [t for t in written["cpu_per_test"] if t.endswith("test_busy")]
    assert written["cpu_per_test"][test]["operator"] >= 1.2


_LANED = """
import os, time
import pytest

@pytest.fixture(scope="session")
def control_plane():
    return "cp"

def test_on_the_control_plane(control_plane):
    open(f"cluster-{os.getpid()}", "w").write(str(time.time()))
    time.sleep(float(os.environ.get("OVERLAP_S", "0")))
    assert os.environ.get("FAIL_CLUSTER") != "1"
"""

_DATA = """
import os, time

def test_on_its_own():
    open(f"data-{os.getpid()}", "w").write(str(time.time()))
    time.sleep(float(os.environ.get("OVERLAP_S", "0")))
"""

_FAULTS = """
import os, time
import pytest

pytestmark = pytest.mark.slow

def test_for_minutes():
    open(f"faults-{os.getpid()}", "w").write(str(time.time()))
    time.sleep(float(os.environ.get("OVERLAP_S", "0")))
"""

#: The plugins a lanes' run needs: ``--lane`` and ``--suite-clock``.
_LANES_CONFTEST = 'pytest_plugins = ["tests.plugins.lifetimes", "tests.plugins.suite_clock"]'


def test_lanes_run_side_by_side_each_its_modules_and_a_failure_in_one_fails_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, pytestconfig: pytest.Config
) -> None:

    pytester.makeconftest(_LANES_CONFTEST)
    pytester.makeini("[pytest]\nmarkers =\n    slow: long")
    pytester.makepyfile(test_cluster_side=_LANED, test_data_side=_DATA, test_faults_side=_FAULTS)
    monkeypatch.setenv("PYTHONPATH", str(pytestconfig.rootpath))
    monkeypatch.setenv("OVERLAP_S", "1.5")  # each lane's test lasts long enough to overlap
    assert lanes.main(["-v"], root=pytester.path) == 0
    out = pytester.path / ".eop" / "suite"
    expected = {
        "cluster": "test_cluster_side.py::test_on_the_control_plane",
        "faults": "test_faults_side.py::test_for_minutes",
        "data": "test_data_side.py::test_on_its_own",
    }
    for lane, test in expected.items():
        log = (out / f"{lane}.log").read_text()
        assert f"{test} PASSED" in log
        assert not [t for t in expected.values() if t != test and t.split("::")[0] in log]
        # Each test's phases are on record, lane by lane.
        assert set(json.loads((out / f"{lane}.json").read_text())["tests"]) == {test}
    # One process each, and at the same time: each started before the others ended.
    starts = [float(p.read_text()) for lane in expected for p in pytester.path.glob(f"{lane}-*")]
    assert len(starts) == 3
    assert max(starts) - min(starts) < 1.5

    monkeypatch.delenv("OVERLAP_S")
    monkeypatch.setenv("FAIL_CLUSTER", "1")
    assert lanes.main(["-q"], root=pytester.path) == pytest.ExitCode.TESTS_FAILED
    # A selection in one lane only leaves the other with nothing to run: no failure.
    monkeypatch.delenv("FAIL_CLUSTER")
    assert lanes.main(["-q", "test_data_side.py"], root=pytester.path) == 0


_LONG = """
import time

def test_long():
    open("started", "w").close()
    time.sleep(60)

def test_after():
    pass
"""


#: The lanes' stop escalation for a lane that ignores SIGINT: the suite's own, a tenth as long.
QUICK_ESCALATION = tuple((after / 10, signum) for after, signum in lanes.ESCALATION)


def _stop_lanes(
    pytester: pytest.Pytester,
    pytestconfig: pytest.Config,
    escalation: tuple[tuple[float, int], ...] = lanes.ESCALATION,
) -> float:
    """Run the lanes as a background job of a non-interactive shell would (SIGINT ignored),
    with ``escalation``, SIGTERM them once the test ``started``; the seconds until they all
    ended (failed)."""
    env = {**os.environ, "PYTHONPATH": str(pytestconfig.rootpath)}
    root = str(pytester.path)
    steps = ", ".join(f"({after}, {int(signum)})" for after, signum in escalation)
    main = (
        f"from tests import lanes; lanes.ESCALATION = ({steps},); "
        f"raise SystemExit(lanes.main(['-q'], root=Path({root!r})))"
    )
    run = subprocess.Popen(
        [sys.executable, "-c", "from pathlib import Path\n" + main],
        cwd=pytester.path,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        deadline = time.monotonic() + 60
        while not (pytester.path / "started").exists():
            assert time.monotonic() < deadline, "the test never started"
            time.sleep(0.1)
        stopped = time.monotonic()
        run.send_signal(signal.SIGTERM)
        assert run.wait(60) != 0  # failed
        return time.monotonic() - stopped
    finally:
        run.kill()


def test_interrupting_the_lanes_stops_both_even_as_a_background_job(
    pytester: pytest.Pytester, pytestconfig: pytest.Config
) -> None:
    """A background job of a non-interactive shell (CI's) starts with SIGINT ignored; the
    lanes' pytest processes must still stop at the SIGINT (or SIGTERM) the lanes pass on."""
    pytester.makeconftest(_LANES_CONFTEST)
    pytester.makepyfile(test_long=_LONG)
    assert _stop_lanes(pytester, pytestconfig) < lanes.ESCALATION[-1][0]
    log = (pytester.path / ".eop" / "suite" / "data.log").read_text()
    assert "KeyboardInterrupt" in log  # pytest itself stopped, at the SIGINT, and said so
    assert "test_after" not in log


_DEAF = """
import signal, time

def test_deaf():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    open("started", "w").close()
    time.sleep(120)
"""


def test_a_lane_that_does_not_stop_at_sigint_is_terminated_after_a_grace(
    pytester: pytest.Pytester, pytestconfig: pytest.Config
) -> None:
    """A stop always ends the run: a lane that ignores the SIGINT gets SIGTERM after
    ``ESCALATION``'s first grace (and SIGKILL after the second)."""
    pytester.makeconftest(_LANES_CONFTEST)
    pytester.makepyfile(test_deaf=_DEAF)
    took = _stop_lanes(pytester, pytestconfig, QUICK_ESCALATION)
    first, second = (after for after, _ in QUICK_ESCALATION)
    assert first <= took < second + 10
