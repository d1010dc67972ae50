"""The one launcher of a real ``ki collector`` process for the tests (127.0.0.1, port 0), and the
``ki-agent`` beside it.

``start_collector`` is bench/collector_process.py's launcher (the benchmarks' too) over files under
a test's ``tmp``: a process and its URL. ``running_collector`` adds an enrolled agent and API
tokens, waits for ``/healthz`` and stops the process after.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.collector_process import start_collector as launch
from kernel_insight.api import TokenStore
from kernel_insight.collector.keys import AgentCredentials, KeyStore
from support.stored import metric_samples, metric_series

__all__ = [
    "RunningCollector",
    "rss_bytes",
    "running_collector",
    "start_agent",
    "start_collector",
    "stop_collector",
    "stored_kernel_histograms",
    "wait_for_log",
]


def start_collector(tmp: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """``ki collector`` (data, keys and tokens under ``tmp``, its log in ``tmp/collector.err``) on
    an ephemeral port; the process and its URL."""
    return launch(
        "--store", str(tmp / "data"), "--keys", str(tmp / "keys.json"), "--tokens", str(tmp / "tokens.json"),
        *extra, log=tmp / "collector.err",
    )  # fmt: skip


@dataclass
class RunningCollector:
    url: str
    proc: subprocess.Popen[str]
    stderr: Path
    read_token: str
    ingest_token: str
    agent: AgentCredentials
    keys: KeyStore
    admin_token: str = ""

    def remote_write(self, series: list[tuple[dict[str, str], list[tuple[int, float]]]]) -> None:
        """POST ``series`` ((labels with __name__, [(ms, value)])) to /api/v1/write with the ingest token."""
        import httpx

        from kernel_insight.collector.remote_write import encode_write_request

        r = httpx.post(
            self.url + "/api/v1/write",
            content=encode_write_request(series),
            headers={
                "Authorization": f"Bearer {self.ingest_token}",
                "Content-Type": "application/x-protobuf",
                "Content-Encoding": "snappy",
                "X-Prometheus-Remote-Write-Version": "0.1.0",
            },
            timeout=30,
        )
        assert r.status_code == 204, r.text

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.url.split("://", 1)[1].partition(":")
        return host, int(port)


def rss_bytes(pid: int) -> int:
    """Resident memory of a process now (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@contextlib.contextmanager
def running_collector(
    tmp: Path,
    *extra: str,
    start_timeout_s: float = 120,
    probe_cert: tuple[str, str] | None = None,
    interval_s: float = 0.5,
) -> Iterator[RunningCollector]:
    """``ki collector`` over an embedded store in ``tmp``; stderr goes to ``tmp/collector.err``.

    ``probe_cert`` (certificate, key) is what the start-up probe presents to a collector that
    requires client certificates; ``interval_s`` is the health snapshot's rebuild interval.
    """
    tokens = TokenStore(tmp / "tokens.json")
    read = tokens.create("reader", ["read"]).token
    ingest = tokens.create("writer", ["ingest"]).token
    admin = tokens.create("admin", ["admin"]).token
    keys = KeyStore(tmp / "keys.json")
    agent = keys.add_agent("host/gpu0")
    err = tmp / "collector.err"
    proc, url = launch(
        "--store", str(tmp / "data"), "--keys", str(keys.path), "--tokens", str(tokens.path),
        "--interval", str(interval_s), *extra, log=err,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + start_timeout_s
        while not _up(url, probe_cert):
            assert proc.poll() is None, err.read_text()[-3000:]
            assert time.monotonic() < deadline, "the collector did not answer /healthz"
            time.sleep(0.05)
        yield RunningCollector(url, proc, err, read, ingest, agent, keys, admin)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def _up(url: str, cert: tuple[str, str] | None) -> bool:
    import ssl

    import httpx

    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # a TLS test checks trust; this: "is it up"
    if cert is not None:
        ctx.load_cert_chain(*cert)
    try:
        return httpx.get(f"{url}/healthz", timeout=2, verify=ctx).status_code == 200
    except httpx.HTTPError:
        return False


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
    """SIGTERM (the collector writes what is queued first) and wait for it."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()  # reaped on the way out too: the caller's failure is the report
        proc.communicate()
        raise


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
    from kernel_insight.collector.clickhouse.store import EmbeddedStore

    store = EmbeddedStore(data)
    try:
        series = metric_series(store, "kernel_duration_seconds")
        kernels = {dict(s.labels).get("kernel", "") for s in series}
        counts = [max(h.count for h in s.histograms) for s in series if s.histograms]
        aggregated = max(v for _, v in metric_samples(store, "ki_agent_kernels_aggregated_total"))
    finally:
        store.close()
    return sorted(kernels), sum(counts), aggregated
