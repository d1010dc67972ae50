"""A real ``ki collector`` process on 127.0.0.1 (port 0), with an enrolled agent and API tokens."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kernel_insight.api import TokenStore
from kernel_insight.collector.keys import AgentCredentials, KeyStore

__all__ = ["RunningCollector", "rss_bytes", "running_collector"]


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
    args = [sys.executable, "-m", "kernel_insight.cli", "collector", "--store", str(tmp / "data")]
    args += [
        "--keys",
        str(keys.path),
        "--tokens",
        str(tokens.path),
        "--port",
        "0",
        "--interval",
        str(interval_s),
    ]
    with err.open("w") as err_file:
        proc = subprocess.Popen([*args, *extra], stdout=subprocess.PIPE, stderr=err_file, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on" in line, f"{line!r} {err.read_text()[-2000:]}"
        url = line.split("listening on ", 1)[1].strip()
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
