"""What a lifecycle step does once decided (``reconcile.step_plan``): table tests, time a value.

Each case is one step: the decision, the children the watches show, what the lifecycle
remembers of its applies, the clock; the plan says which children are applied, whether
the status is written first or only the apply is done, whether the step waits for the
StatefulSet controller, whether the driver is stopped, and when the next look is.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from eop_operator.api.models import (
    PipelineStatus,
    UpgradeMode,
    UpgradeStatus,
    UpgradeStep,
)
from eop_operator.api.status_patch import DecisionRecord
from eop_operator.reconcile.cadence import (
    CONTROLLER_SECONDS,
    HEAL_SECONDS,
    LOOK_SECONDS,
    SETTLED_SECONDS,
)
from eop_operator.reconcile.children import child_ref, version_of
from eop_operator.reconcile.decision import Action, Decision, Event
from eop_operator.reconcile.observe import ClaimState
from eop_operator.reconcile.step_plan import (
    Applied,
    Stall,
    StepInput,
    StepPlan,
    heals,
    plan_step,
)
from eop_operator.render import RenderedPipeline, RunConfig
from eop_operator.render.naming import RENDERED_HASH_ANNOTATION

HASH = "h1"
CONFIG = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "p-config"}, "data": {}}
DRIVER = {
    "apiVersion": "apps/v1",
    "kind": "StatefulSet",
    "metadata": {"name": "p-driver"},
    "spec": {"replicas": 1, "template": {}},
}
RENDERING = (CONFIG, DRIVER)
EVENT = Event(type="Normal", reason="Upgrading", message="to h2")
WAL = UpgradeStatus(
    to_hash="h2",
    mode=UpgradeMode.LAST_STATE,
    step=UpgradeStep.STOPPING,
    generation=0,
    reason="SpecChanged",
)
#: The clock of every case (event-loop seconds).
NOW = 1000.0


def _render(generation: int, reset: bool) -> RenderedPipeline:
    """The two children, as the renderer returns them: fresh copies, no hash stamped."""
    run_config: Any = RunConfig.__new__(RunConfig)  # never read by the planner
    return RenderedPipeline(
        run_config=run_config,
        spec_hash=HASH,
        objects=[copy.deepcopy(o) for o in RENDERING],
        needs_rpc_secret=generation == 7,
    )


def _stamped() -> list[dict[str, Any]]:
    """The children as the planner renders them (replicas 1, hash stamped)."""
    plan = plan_step(_input(Decision(action=Action.APPLY), live={}))
    return [copy.deepcopy(o) for o in plan.apply]


def _live(obj: dict[str, Any], version: str = "7", seen: bool = True) -> dict[str, Any]:
    """What the API server holds after an apply: identity, versions, a controller's word."""
    found = copy.deepcopy(obj)
    found["metadata"].update(uid="u", resourceVersion=version, generation=2)
    if obj["kind"] == "StatefulSet":
        found["status"] = {"observedGeneration": 2 if seen else 1}
    return found


@dataclass
class World:
    """The children live (by name), and what the lifecycle remembers of its applies."""

    live: dict[str, dict[str, Any]] = field(default_factory=dict)
    known: bool = True  # the lifecycle remembers the live versions as its own applies
    applied_at: float = -math.inf
    verify_at: float | None = None
    refused: tuple[str, ...] = ()


def _in_sync(**changes: Any) -> World:
    live = {o["metadata"]["name"]: _live(o) for o in _stamped()}
    return World(live=live, **changes)


def _unseen(applied_ago: float) -> World:
    """Applied ``applied_ago`` seconds ago; the StatefulSet's controller has not seen it yet."""
    live = {o["metadata"]["name"]: _live(o, seen=False) for o in _stamped()}
    return World(live=live, applied_at=NOW - applied_ago)


def _input(
    decision: Decision,
    *,
    live: dict[str, dict[str, Any]] | None = None,
    world: World | None = None,
    status: PipelineStatus | None = None,
    stored: dict[str, Any] | None = None,
    claim: ClaimState = ClaimState.UNKNOWN,
    steady: bool = True,
    recovers_in: float = math.inf,
    stall: Stall | None = None,
) -> StepInput:
    world = world or World(live=live or {})
    children = {child_ref(o): o for o in world.live.values()}
    versions = {ref: version_of(o) for ref, o in children.items()} if world.known else {}
    return StepInput(
        decision=decision,
        status=status or PipelineStatus(spec_hash=HASH),
        stored_status=stored or {"specHash": HASH},
        claim=claim,
        children=children,
        statefulset=world.live.get("p-driver"),
        render_at=_render,
        applied=Applied(
            versions=versions,
            at=world.applied_at,
            verify_at=world.verify_at,
            refused=world.refused,
        ),
        steady=steady,
        recovers_in=recovers_in,
        clock=NOW,
        stall=stall,
    )


def _names(plan: StepPlan) -> list[str]:
    return [o["metadata"]["name"] for o in plan.apply]


WAIT = Decision(action=Action.WAIT)
STOP = Decision(action=Action.STOP, record=DecisionRecord(upgrade=WAL), events=(EVENT,))


def _plan_edited(name: str, **changes: Any) -> StepPlan:
    """A waiting step that finds ``name`` written by someone else since its last apply."""
    world = _in_sync(**changes)
    step = _input(WAIT, world=world)
    live = dict(world.live)
    live[name] = copy.deepcopy(live[name])
    live[name]["metadata"]["resourceVersion"] = "8"
    children = {child_ref(o): o for o in live.values()}
    return plan_step(replace(step, children=children, statefulset=live["p-driver"]))


@pytest.mark.parametrize(
    ("case", "step", "expected"),
    [
        (
            "a first apply: every child, replicas as decided, status written first",
            _input(Decision(action=Action.APPLY, record=DecisionRecord(spec_hash="h2")), live={}),
            {"apply": ["p-config", "p-driver"], "write_status": True, "apply_only": False},
        ),
        (
            "an apply that changes nothing in status: apply only, status at the next step",
            _input(Decision(action=Action.APPLY), live={}),
            {"apply": ["p-config", "p-driver"], "write_status": False, "apply_only": True},
        ),
        (
            "an apply with events to post: status and events first",
            _input(Decision(action=Action.APPLY, events=(EVENT,)), live={}),
            {"apply": ["p-config", "p-driver"], "write_status": True, "apply_only": False},
        ),
        (
            "an apply while something is refused: the status must say so first",
            _input(Decision(action=Action.APPLY), world=World(refused=("quota",))),
            {"apply": ["p-config", "p-driver"], "write_status": True},
        ),
        (
            "children in sync: nothing applied, a settled look",
            _input(WAIT, world=_in_sync(applied_at=NOW - 100)),
            {"apply": [], "write_status": True, "look_again": SETTLED_SECONDS},
        ),
        (
            "a driver not running: looked at more often",
            _input(WAIT, world=_in_sync(applied_at=NOW - 100), steady=False),
            {"apply": [], "look_again": LOOK_SECONDS},
        ),
        (
            "a restarted driver: looked at when it counts as running again",
            _input(WAIT, world=_in_sync(applied_at=NOW - 100), recovers_in=3.0),
            {"look_again": 3.0},
        ),
        (
            "a decision asking for a look sooner",
            _input(Decision(action=Action.WAIT, requeue_after=2.0), world=_in_sync()),
            {"look_again": 2.0},
        ),
        (
            "a child deleted by hand is healed at once, apply only",
            _input(WAIT, live={"p-driver": _live(_stamped()[1])}),
            {"apply": ["p-config"], "apply_only": True},
        ),
        (
            "a deleted child healed a moment ago: not again before HEAL_SECONDS",
            _input(WAIT, world=World(live={"p-driver": _live(_stamped()[1])}, applied_at=NOW - 4)),
            {"apply": [], "look_again": HEAL_SECONDS - 4, "heal_in": HEAL_SECONDS - 4},
        ),
        (
            "the periodic apply of every child, in sync or not",
            _input(WAIT, world=_in_sync(applied_at=NOW - 4, verify_at=NOW - 1)),
            {"apply": ["p-config", "p-driver"], "apply_only": True},
        ),
        (
            "the periodic apply is not due yet: looked at when it is",
            _input(WAIT, world=_in_sync(applied_at=NOW - 100, verify_at=NOW + 5)),
            {"apply": [], "look_again": 5.0},
        ),
        (
            "nothing heals while a restart waits for its slot",
            _input(Decision(action=Action.WAIT, hold=True), live={}),
            {"apply": []},
        ),
        (
            "nothing heals before anything ran",
            _input(WAIT, live={}, status=PipelineStatus()),
            {"apply": []},
        ),
        (
            "nothing heals while the claim is being deleted",
            _input(WAIT, live={}, claim=ClaimState.DELETING),
            {"apply": []},
        ),
        (
            "nothing heals while an old driver stops (its StatefulSet keeps zero replicas)",
            _input(WAIT, live={}, status=PipelineStatus(spec_hash=HASH, upgrade=WAL)),
            {"apply": []},
        ),
        (
            "a stop: status and events first, then the StatefulSet scaled to zero",
            _input(STOP, world=_in_sync()),
            {"apply": [], "write_status": True, "stop_driver": True},
        ),
        (
            "a stop with no StatefulSet left: nothing to scale",
            _input(STOP, live={"p-config": _live(_stamped()[0])}),
            {"stop_driver": False},
        ),
        (
            "a StatefulSet its controller has not seen: its word awaited, no status yet",
            _input(WAIT, world=_unseen(applied_ago=0.5)),
            {"write_status": False, "await_controller": CONTROLLER_SECONDS - 0.5},
        ),
        (
            "... but not for longer than CONTROLLER_SECONDS after the apply",
            _input(WAIT, world=_unseen(applied_ago=3)),
            {"write_status": True, "await_controller": None},
        ),
        (
            "the RPC key's Secret is needed for a rendering with executors",
            _input(Decision(action=Action.APPLY, generation=7), live={}),
            {"needs_rpc_key": True},
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_step_plan(case: str, step: StepInput, expected: dict[str, Any]) -> None:
    plan = plan_step(step)
    got = {key: (_names(plan) if key == "apply" else getattr(plan, key)) for key in expected}
    assert got == expected, case


def test_children_in_sync_the_lifecycle_did_not_know_are_remembered_not_applied() -> None:
    world = _in_sync(known=False, applied_at=NOW - 100)
    plan = plan_step(_input(WAIT, world=world))
    assert plan.apply == ()
    assert set(plan.verified) == {child_ref(o) for o in world.live.values()}


def test_a_child_edited_by_someone_else_is_healed_and_throttled_like_a_deleted_one() -> None:
    assert _names(_plan_edited("p-config", applied_at=NOW - 100)) == ["p-config"]
    throttled = _plan_edited("p-config", applied_at=NOW - 1)
    assert throttled.apply == () and throttled.heal_in == HEAL_SECONDS - 1


def test_the_driver_is_applied_with_the_decided_replicas_and_each_child_stamped() -> None:
    plan = plan_step(_input(Decision(action=Action.APPLY, replicas=0), live={}))
    driver = next(o for o in plan.apply if o["kind"] == "StatefulSet")
    assert driver["spec"]["replicas"] == 0
    assert all(RENDERED_HASH_ANNOTATION in o["metadata"]["annotations"] for o in plan.apply)


def test_heals_reads_the_wal_the_decision_records_over_the_stored_one() -> None:
    starting = WAL.model_copy(update={"step": UpgradeStep.STARTING})
    stopping = PipelineStatus(spec_hash=HASH, upgrade=WAL)
    record = DecisionRecord(upgrade=starting)
    assert heals(Decision(action=Action.WAIT, record=record), stopping, ClaimState.UNKNOWN)
    assert not heals(WAIT, stopping, ClaimState.UNKNOWN)
    assert heals(WAIT, PipelineStatus(spec_hash=HASH), ClaimState.UNKNOWN)


STALL = Stall(idle_seconds=41.6, lag=5, pod="p-driver-0")


def test_a_stalled_driver_is_restarted_by_the_step_with_an_event_naming_why() -> None:
    plan = plan_step(_input(WAIT, world=_in_sync(applied_at=NOW - 100), stall=STALL))
    assert plan.restart_stalled is not None
    assert plan.restart_stalled.pod == "p-driver-0"
    event = plan.restart_stalled.event
    assert (event.type, event.reason) == ("Warning", "RestartStalled")
    assert event.message == (
        "the progress group has not advanced for 42s with 5 records waiting; "
        "restarting driver pod p-driver-0"
    )
    assert plan_step(_input(WAIT, world=_in_sync(applied_at=NOW - 100))).restart_stalled is None


@pytest.mark.parametrize(
    ("case", "decision", "status"),
    [
        ("an upgrade in flight, as stored", WAIT, PipelineStatus(spec_hash=HASH, upgrade=WAL)),
        ("an upgrade the decision begins", STOP, PipelineStatus(spec_hash=HASH)),
        (
            "an upgrade the decision records while it waits",
            Decision(action=Action.WAIT, record=DecisionRecord(upgrade=WAL)),
            PipelineStatus(spec_hash=HASH),
        ),
        ("the step applies the driver", Decision(action=Action.APPLY), PipelineStatus()),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_no_stall_restart_while_the_lifecycle_acts_on_the_driver(
    case: str, decision: Decision, status: PipelineStatus
) -> None:
    step = _input(decision, world=_in_sync(applied_at=NOW - 100), status=status, stall=STALL)
    assert plan_step(step).restart_stalled is None, case
