"""``ki collector`` as its own process on 127.0.0.1 and an ephemeral port: the one launcher the
benchmarks that serve over HTTP and the tests (tests/support/collector.py) start it with."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

__all__ = ["start_collector"]

_LISTENING = "ki: listening on "


def start_collector(*args: str, log: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    """Start ``ki collector --port 0 ARGS...``; its process and base URL once it listens.

    Its log (stderr) goes to the file ``log`` when given, else to this process's stderr (a pipe
    nobody reads would stall it). RuntimeError, with the log's end, when it says anything else
    first (it exited: a bad flag, a store it cannot open)."""
    err = log.open("w") if log is not None else None
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernel_insight.cli", "collector", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    finally:
        if err is not None:
            err.close()
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith(_LISTENING):
        proc.kill()
        proc.wait()
        tail = log.read_text()[-3000:] if log is not None else ""
        raise RuntimeError(f"ki collector did not start: {line!r}\n{tail}")
    return proc, line.removeprefix(_LISTENING)
