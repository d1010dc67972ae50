"""What a soak left behind: processes, the network namespace, loop mounts, shared-memory rings.

Every process the soak starts inherits :data:`MARK` (``KI_SOAK_RUN=<pid>-<ns>`` in its
environment, set before the first one starts), so one still running, under whatever parent,
is found in ``/proc/*/environ``; a child of the soak that exited and was never reaped (a
zombie: its environment is gone) is found by its parent pid.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

__all__ = ["MARK", "leftovers", "mark"]

MARK = "KI_SOAK_RUN"


def mark() -> str:
    """Set this run's mark in the environment every child inherits; the mark."""
    token = f"{os.getpid()}-{time.time_ns()}"
    os.environ[MARK] = token
    return token


def _processes(token: str) -> list[str]:
    me, needle = os.getpid(), f"{MARK}={token}".encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            stat = (entry / "stat").read_text()
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        except (OSError, ValueError):
            continue
        try:
            env = (entry / "environ").read_bytes() + b"\0"
        except OSError:  # a zombie's, or one that just ended
            env = b""
        if needle in env or int(ppid) == me:
            found.append(f"pid {entry.name} ({comm}, state {state}, parent {ppid})")
    return found


def leftovers(
    token: str,
    *,
    netns: str | None,
    host_if: str | None,
    mounts: list[Path],
    rings: str,
    wait_s: float = 10.0,
) -> list[str]:
    """What is still there: processes with the mark or unreaped children, the namespace and the
    host's veth end, mounts at ``mounts`` or loop devices on their images, shared memory whose
    name starts with ``rings``. Waits up to ``wait_s`` for processes being torn down."""
    deadline = time.monotonic() + wait_s
    procs = _processes(token)
    while procs and time.monotonic() < deadline:
        time.sleep(0.5)
        procs = _processes(token)
    left = procs
    if netns is not None:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
        if any(line.split()[0] == netns for line in names.splitlines() if line.strip()):
            left.append(f"network namespace {netns}")
    if host_if is not None and Path(f"/sys/class/net/{host_if}").exists():
        left.append(f"veth {host_if}")
    mounted = Path("/proc/mounts").read_text().split("\n")
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=False).stdout
    for m in mounts:
        if any(line.split()[1:2] == [str(m)] for line in mounted if line):
            left.append(f"mount {m}")
        if str(m.with_suffix(".img")) in loops:
            left.append(f"loop device on {m.with_suffix('.img')}")
    left += [f"/dev/shm/{e.name}" for e in Path("/dev/shm").iterdir() if e.name.startswith(rings)]
    return left
