"""Cgroups of the local cluster's pods: made under a root of ours in every hierarchy, killed and
removed when the cluster (or one of its nodes) goes; the machine's own cgroups are never
touched and nothing is remounted.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from devenv.processes import kill_and_wait, sigkill_and_wait

__all__ = ["cgroup_dirs", "cgroup_mounts", "cgroup_pids", "prepare_cgroup_root", "remove_cgroups"]


def cgroup_mounts(types: tuple[str, ...] = ("cgroup",)) -> list[Path]:
    """Mount points of the cgroup hierarchies of ``types`` (``cgroup`` is v1: ``cpu``,
    ``memory``, ``name=systemd``...; ``cgroup2`` the unified one)."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[:1] and right.split()[0] in types:
            mounts.append(Path(left.split()[4]))
    return mounts


def prepare_cgroup_root(root: str) -> None:
    """Create ``root`` (and its parents) in every v1 hierarchy (the kubelet checks it exists)."""
    parts = root.strip("/").split("/")
    for mount in cgroup_mounts():
        parent = mount
        for part in parts:
            path = parent / part
            path.mkdir(exist_ok=True)
            # A new cpuset cgroup has no CPUs and memory nodes: inherit the parent's.
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (path / knob).exists() and not (path / knob).read_text().strip():
                    (path / knob).write_text((parent / knob).read_text())
            parent = path


def cgroup_dirs(root: str) -> list[Path]:
    """Every cgroup below ``root`` (itself included), deepest first.

    runc also mirrors them into the (otherwise unused) cgroup2 mount of this hybrid layout.
    """
    name = root.strip("/")
    dirs: list[Path] = []
    for mount in cgroup_mounts(("cgroup", "cgroup2")):
        top = mount / name
        if top.is_dir():
            dirs.extend(Path(p) for p, _, _ in os.walk(top))
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def cgroup_pids(root: str) -> set[int]:
    """The processes in ``root`` and below, in any hierarchy."""
    pids: set[int] = set()
    for d in cgroup_dirs(root):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
    return pids


def remove_cgroups(root: str, *, signal_first: bool = True) -> list[Path]:
    """Kill what still runs below ``root`` and remove its cgroups.

    With ``signal_first`` processes get SIGTERM and 2 s before SIGKILL, else SIGKILL at once.
    Returns the cgroups that could not be removed.
    """
    pids = sorted(cgroup_pids(root))
    if signal_first:
        kill_and_wait(pids, timeout=2.0)
    else:
        sigkill_and_wait(pids)
    left = []
    for d in cgroup_dirs(root):
        try:
            d.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            left.append(d)
    return left
