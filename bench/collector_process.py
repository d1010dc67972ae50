"""``ki collector`` as its own process on 127.0.0.1 and an ephemeral port, for the benchmarks that serve over HTTP."""

from __future__ import annotations

import subprocess
import sys

__all__ = ["start_collector"]

_LISTENING = "ki: listening on "


def start_collector(*args: str) -> tuple[subprocess.Popen[str], str]:
    """Start ``ki collector --port 0 ARGS...``; its process and base URL once it listens (SystemExit if it does not)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernel_insight.cli", "collector", "--port", "0", *args],
        stdout=subprocess.PIPE,  # its log goes to our stderr: a pipe nobody reads would stall it
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith(_LISTENING):
        proc.kill()
        raise SystemExit(f"ki collector did not start: {line!r}")
    return proc, line.removeprefix(_LISTENING)
