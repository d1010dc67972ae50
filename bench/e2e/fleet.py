"""Real processes for the end-to-end ingest path: ``ki collector``, and per GPU a ring, a C producer and a ki-agent.

Used by ``make bench-e2e`` (bench/e2e/__main__.py) and the collector-outage test
(tests/agent/test_collector_outage.py). The producer is ``ringtool paced`` from
tests/ring/c/ringtool.c: KERNEL records at a given rate plus 16 NVML-like GPU_SAMPLE
metrics at 10 Hz on GPU 0.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from kernel_insight.agent.ring import Ring
from kernel_insight.collector.keys import KeyStore
from kernel_insight.run import free_port

__all__ = [
    "REPO",
    "Collector",
    "Node",
    "build_ringtool",
    "cpu_seconds",
    "free_port",
    "smaps_kb",
    "thread_cpu_seconds",
    "wait_until",
]

REPO = Path(__file__).resolve().parents[2]
RINGTOOL = REPO / "tests" / "ring" / "c" / "ringtool.c"
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{REPO / 'agent' / 'include'}"]


def build_ringtool(out_dir: Path) -> Path:
    """Compile the C ring producer (the ring tests' ringtool) into ``out_dir``."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler: run scripts/bootstrap.sh (build-essential)")
    out = out_dir / "ringtool"
    subprocess.run([cc, *CFLAGS, str(RINGTOOL), "-o", str(out), "-lrt"], check=True)
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (its threads included) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: An unnamed mapping at least this large is a reservation (pyarrow's mimalloc arena reserves
#: 1 GiB), kept apart from the other anonymous memory by ``smaps_kb``.
RESERVATION_BYTES = 256 << 20


def smaps_kb(pid: int) -> dict[str, tuple[int, int]]:
    """Resident kB and anonymous kB of each mapping of ``pid`` (summed by path; ``[anon]`` for
    unnamed mappings, ``[anon reservation]`` for those of ``RESERVATION_BYTES`` or more): where its
    resident memory is, at the moment of the call. Empty once the process has ended."""
    out: dict[str, tuple[int, int]] = {}
    cur = "[anon]"
    try:
        text = Path(f"/proc/{pid}/smaps").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        head = line.split()
        if "-" in head[0] and ":" not in head[0]:
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            unnamed = "[anon reservation]" if hi - lo >= RESERVATION_BYTES else "[anon]"
            cur = head[5] if len(head) > 5 else unnamed
            out.setdefault(cur, (0, 0))
        elif head[0] in ("Rss:", "Anonymous:"):
            rss, anon = out[cur]
            out[cur] = (rss + int(head[1]), anon) if head[0] == "Rss:" else (rss, anon + int(head[1]))
    return out


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """User + system CPU seconds of a process's live threads, summed by thread name (``comm``):
    the engine's own threads (merges, background pools) apart from Python's."""
    out: dict[str, float] = {}
    tck = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
        name = text.split("(", 1)[1].rsplit(")", 1)[0]
        fields = text.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tck
    return out


def wait_until(pred: object, timeout: float, what: str, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return
        time.sleep(step)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


class Collector:
    """``ki collector`` on an embedded store, local-dev (no read tokens), agent keys from a file.

    ``tokens``: a token file instead of local-dev, which binds 127.0.0.1 only: then ``host`` may
    be another address of this machine (the soak's veth to a network namespace)."""

    def __init__(
        self,
        data: Path,
        keys: Path,
        log: Path,
        port: int | None = None,
        interval_s: float = 5.0,
        *,
        host: str = "127.0.0.1",
        tokens: Path | None = None,
        extra: Sequence[str] = (),
    ) -> None:
        self.data, self.keys, self.log = data, keys, log
        self.extra = list(extra)  # more ``ki collector`` flags
        self.interval_s = interval_s
        self.port = port or free_port()
        self.host, self.tokens = host, tokens
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 60) -> None:
        auth = ["--tokens", str(self.tokens), "--host", self.host] if self.tokens else ["--local-dev"]
        args = [sys.executable, "-m", "kernel_insight.cli", "collector", "--store", str(self.data),
                "--keys", str(self.keys), "--auth-store", "file", *auth, "--port", str(self.port),
                "--interval", str(self.interval_s), *self.extra]  # fmt: skip
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"ki collector exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}"
                )
            try:
                return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout, "the collector to answer /healthz", 0.1)

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM (the collector writes what is queued first) and wait."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


class Node:
    """One GPU: its ring, the C producer writing it, and the ki-agent draining it into its own spool."""

    def __init__(
        self,
        tmp: Path,
        index: int,
        keys: KeyStore,
        agent_bin: Path,
        ringtool: Path,
        capacity: int = 1 << 18,
    ) -> None:
        self.dir = tmp / f"node{index}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ring_name = f"/ki_e2e.{os.getpid()}.{index}"
        with contextlib.suppress(OSError):
            Ring.unlink(self.ring_name)
        self.ring = Ring.create(self.ring_name, capacity=capacity, producer=False)
        creds = keys.add_agent(f"gpu-node-{index}")
        self.agent_id = creds.agent_id.hex()
        self.key_file = self.dir / "agent.key"
        creds.write_key_file(self.key_file)
        self.spool = self.dir / "spool"
        self.agent_bin, self.ringtool = agent_bin, ringtool
        self.agent: subprocess.Popen[bytes] | None = None
        self.producer: subprocess.Popen[str] | None = None

    def start_agent(
        self, collector_url: str, *extra: str, histograms: bool = False, netns: str | None = None
    ) -> None:
        """Start ki-agent; ``histograms=False`` (the default here) ships every record, so record
        delivery can be followed one by one; True is the agent's own default (kept spans only).
        ``netns``: run it in that network namespace (``ip netns exec``, which execs the agent)."""
        wrap = ["ip", "netns", "exec", netns] if netns else []
        args = [*wrap, str(self.agent_bin), "--ring", self.ring_name, "--collector", collector_url,
                "--key-file", str(self.key_file), "--spool-dir", str(self.spool),
                "--backoff-min-ms", "50", "--backoff-max-ms", "500", "--shutdown-timeout-s", "30",
                f"--histograms={int(histograms)}", *extra]  # fmt: skip
        with (self.dir / "agent.log").open("a") as log:
            self.agent = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def start_producer(self, rate: int, seconds: float) -> None:
        self.producer = subprocess.Popen(
            [str(self.ringtool), "paced", self.ring_name, str(rate), str(seconds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def produced(self, timeout: float = 120) -> tuple[int, int, int]:
        """(kernel records written, records dropped by a full ring, samples written), once the producer ends."""
        assert self.producer is not None
        out, _ = self.producer.communicate(timeout=timeout)
        m = re.search(r"^(\d+) (\d+) (\d+)$", out.strip(), re.M)
        if self.producer.returncode != 0 or m is None:
            raise RuntimeError(f"producer failed ({self.producer.returncode}): {out[-500:]}")
        return int(m.group(1)), int(m.group(2)), int(m.group(3))

    def backlog(self) -> int:
        """Sealed batches waiting in the spool (not yet acknowledged by the collector)."""
        try:
            return sum(1 for e in os.scandir(self.spool) if e.name.endswith(".kib"))
        except FileNotFoundError:
            return 0

    def ring_fill(self) -> int:
        return int(self.ring.stats()["fill"])

    def stop_agent(self, timeout: float = 60) -> int:
        if self.agent is None:
            return 0
        if self.agent.poll() is None:
            self.agent.send_signal(signal.SIGTERM)
        try:
            return self.agent.wait(timeout)
        except subprocess.TimeoutExpired:
            self.agent.kill()
            return self.agent.wait()

    def close(self) -> None:
        for p in (self.producer, self.agent):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        self.ring.close()
        with contextlib.suppress(OSError):
            Ring.unlink(self.ring_name)
