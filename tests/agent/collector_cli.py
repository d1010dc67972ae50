"""Helpers to run the real ``ki collector`` and ``ki-agent`` as processes on loopback (not a test file)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
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


def wait_for_log(log: Path, pattern: str, after: int, timeout_s: float) -> int:
    """Wait until the agent's log matches ``pattern`` past offset ``after``; the offset past the match."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text()
        m = re.compile(pattern).search(text, after)
        if m:
            return m.end()
        time.sleep(0.2)
    raise AssertionError(f"agent log never said /{pattern}/:\n{log.read_text()[-3000:]}")


def stored_kernel_histograms(data: Path) -> tuple[list[str], int, float]:
    """What a collector's embedded store under ``data`` holds of an agent's kernel histograms: the
    kernel names, the sum over series of each one's last count, and the agent's last
    kernels_aggregated counter (equal to that sum when every folded kernel was stored once)."""
    from kernel_insight.collector.store import EmbeddedStore

    store = EmbeddedStore(data)
    try:
        kernels = store.query(
            "SELECT DISTINCT labels['kernel'] AS k FROM ki.series WHERE metric = 'kernel_duration_seconds'"
        ).to_pylist()
        counts = store.query(
            "SELECT fingerprint, max(count) AS c FROM ki.histograms WHERE metric = 'kernel_duration_seconds'"
            " GROUP BY fingerprint"
        ).to_pylist()
        aggregated = store.query(
            "SELECT max(value) AS v FROM ki.samples WHERE metric = 'ki_agent_kernels_aggregated_total'"
        ).to_pylist()[0]["v"]
    finally:
        store.close()
    return sorted(r["k"] for r in kernels), sum(r["c"] for r in counts), aggregated
