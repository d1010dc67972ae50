"""Helpers to run the real ``ki collector`` and ``ki-agent`` as processes on loopback (not a test file)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_collector(tmp: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """``ki collector`` (data, keys and tokens under ``tmp``) on an ephemeral port; the process and its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernel_insight.cli", "collector", "--store", str(tmp / "data"),
         "--keys", str(tmp / "keys.json"), "--tokens", str(tmp / "tokens.json"), "--port", "0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    line = proc.stdout.readline()  # type: ignore[union-attr]
    assert line.startswith("ki: listening on http://127.0.0.1:"), line + proc.stderr.read()  # type: ignore[union-attr]
    return proc, line.split("listening on ")[1].strip()


def start_agent(tmp: Path, binary: Path, ring: str, url: str, *extra: str) -> subprocess.Popen[bytes]:
    """``ki-agent`` draining ``ring`` into ``url`` (key file ``tmp/agent.key``, spool ``tmp/spool``),
    shipping every record (``--histograms 0``: the callers count records end to end)."""
    with (tmp / "agent.log").open("a") as log:
        return subprocess.Popen(
            [str(binary), "--ring", ring, "--collector", url, "--key-file", str(tmp / "agent.key"),
             "--spool-dir", str(tmp / "spool"), "--histograms=0", *extra],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


def stop_collector(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
    proc.communicate(timeout=60)
