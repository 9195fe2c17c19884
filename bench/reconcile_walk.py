"""Where one lifecycle step of the operator goes: the files and functions it passes through.

``.venv/bin/python -m bench.reconcile_walk`` takes a new pipeline's first lifecycle step
(decide: create; plan; write the status; apply the children) against an API server that
answers every request, with a profiler on, and prints, for the operator's own code
(``eop_operator``; not the data plane's models, pydantic, kopf or the standard library):

* files: the distinct files whose functions ran;
* stops: the moves from one file to another, call by call;
* returns: the moves back into a file the walk had already left.

Run with another checkout's ``operator`` and ``spark_apps`` first on ``PYTHONPATH``, it
measures that tree: before and after a change, what a newcomer must read to follow one
step.  Pure Python, no component started; a second or so.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import sys
from collections import Counter
from itertools import pairwise
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from eop_operator.controller import lifecycle as lifecycle_module
from eop_operator.controller.context import Context, OperatorOptions
from eop_operator.controller.lifecycle import Lifecycle
from eop_operator.kube.observed import Observed, OwnWrites
from eop_operator.render import render_pipeline

#: The pipeline of the walk: the first example pipeline, nothing observed of it yet.
EXAMPLE = (
    Path(__file__).resolve().parent.parent / "spark_apps/eop_spark/examples/impressions-clean.yaml"
)
#: The package whose files count.
OWN = "eop_operator"


class _Answering:
    """An API server that accepts every request: an apply or a create answers the object
    with an identity, a read finds nothing, a list is empty."""

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        answer = copy.deepcopy(obj)
        answer["metadata"].update(uid=f"uid-{obj['kind']}", resourceVersion="1", generation=1)
        return answer

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return await self.apply(obj)

    async def get(self, *_: Any, **__: Any) -> None:
        return None

    async def list_objects(self, *_: Any, **__: Any) -> list[dict[str, Any]]:
        return []

    async def patch(self, api_version: str, kind: str, *args: Any, **__: Any) -> dict[str, Any]:
        return {"kind": kind, "metadata": {"namespace": args[0], "name": args[1]}}


def _own(path: str) -> str | None:
    """The path of ``path`` below its package root, if it is eop's own code."""
    parts = Path(path).parts
    return "/".join(parts[parts.index(OWN) + 1 :]) if OWN in parts else None


def walk() -> list[tuple[str, str]]:
    """The (file, function) of every call into the operator's code during the step."""
    calls: list[tuple[str, str]] = []

    def profile(frame: FrameType, event: str, _: Any) -> None:
        if event == "call":
            own = _own(frame.f_code.co_filename)
            if own is not None:
                calls.append((own, frame.f_code.co_name))

    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"].update(uid="uid-1", generation=1)
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    lifecycle = Lifecycle(Context.of(OperatorOptions(), _Answering()))  # type: ignore[arg-type]
    observed = Observed(pipelines={key: [body]}, children={}, own=OwnWrites())

    def render(pipeline: Any, identity: Any, generation: int, reset: bool) -> Any:
        return render_pipeline(
            pipeline, default_image="eop:bench", generation=generation, reset_progress=reset
        )

    async def step() -> None:
        steps, lifecycle_module.MAX_STEPS = lifecycle_module.MAX_STEPS, 1  # one step
        sys.setprofile(profile)
        try:
            await lifecycle.drive(observed, key, render)
        finally:
            sys.setprofile(None)
            lifecycle_module.MAX_STEPS = steps

    asyncio.run(step())
    return calls


def figures(calls: list[tuple[str, str]]) -> dict[str, Any]:
    """Files, stops and returns of a walk (see the module docstring)."""
    files = [f for f, _ in calls]
    path = [f for i, f in enumerate(files) if i == 0 or f != files[i - 1]]
    left: set[str] = set()
    returns = 0
    for before, after in pairwise(path):
        left.add(before)
        returns += after in left
    return {"files": len(set(files)), "stops": len(path) - 1, "returns": returns, "path": path}


def main(argv: list[str] | None = None) -> int:
    """Print the walk's figures (``--files``: and the calls per file)."""
    parser = argparse.ArgumentParser(prog="python -m bench.reconcile_walk", description=__doc__)
    parser.add_argument("--files", action="store_true", help="list the files and their calls")
    args = parser.parse_args(argv)
    calls = walk()
    found = figures(calls)
    print(
        f"one lifecycle step of a new pipeline: {found['files']} files of the operator, "
        f"{found['stops']} stops (moves between files), {found['returns']} returns to a "
        f"file already left, {len(calls)} calls"
    )
    if args.files:
        for file, count in sorted(Counter(f for f, _ in calls).items()):
            print(f"  {count:6d}  {file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
