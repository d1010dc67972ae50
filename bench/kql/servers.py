"""The servers bench-kql compares, each a real process on loopback queried over one keep-alive connection.

``ki collector`` (kql), Prometheus 2.x (Debian ``prometheus``), Prometheus 3.5 (Debian unstable's,
unpacked by ``scripts/fetch_peers.sh`` into ``build/peers``: :func:`peer_binary`) and
VictoriaMetrics (Debian ``victoria-metrics``, when installed). Every one is asked through the
Prometheus HTTP API by the same :class:`HttpQuerier`, so the figures compare like with like.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import httpx
import numpy as np

from kernel_insight.kql.values import Matrix, Series
from kernel_insight.run import free_port

__all__ = [
    "Answer",
    "Collector",
    "HttpQuerier",
    "Prometheus",
    "Server",
    "VictoriaMetrics",
    "free_port",
    "matrix_of",
    "peer_binary",
    "process_cpu_s",
]

#: Where ``scripts/fetch_peers.sh`` unpacks Debian unstable's servers (``<name>/usr/bin/<name>``).
PEERS_DIR = Path(__file__).resolve().parents[2] / "build" / "peers"


def peer_binary(name: str) -> Path | None:
    """The newer peer server ``name`` (``prometheus``: 3.5) that ``scripts/fetch_peers.sh``
    unpacked, or None when it has not been run."""
    path = PEERS_DIR / name / "usr" / "bin" / name
    return path if os.access(path, os.X_OK) else None


def process_cpu_s(pid: int) -> float:
    """CPU seconds a process and all its threads have run so far (``/proc/<pid>/task/*/schedstat``:
    nanoseconds, where ``/proc/<pid>/stat`` counts 10 ms ticks); threads that ended are not counted."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # the thread ended meanwhile
    return total / 1e9


def matrix_of(data: dict[str, Any]) -> Matrix:
    """A query's ``data`` (vector, matrix or scalar) as a Matrix sorted by labels, for comparing."""
    kind, result = data["resultType"], data["result"]
    if kind == "scalar":
        result = [{"metric": {}, "value": result}]
        kind = "vector"
    series = []
    for item in result:
        points = item["values"] if kind == "matrix" else [item["value"]]
        labels = tuple(sorted(item["metric"].items()))
        ts = np.array([round(float(t) * 1000) for t, _ in points], dtype=np.int64)
        vs = np.array([float(v) for _, v in points], dtype=np.float64)
        series.append(Series(labels, ts, vs))
    series.sort(key=lambda s: s.labels)
    return Matrix(tuple(series))


@dataclasses.dataclass(frozen=True)
class Answer:
    """One HTTP query: its result (None when refused), the error text, and the client-side wall time."""

    matrix: Matrix | None
    error: str
    seconds: float


class HttpQuerier:
    """One keep-alive connection to a server's Prometheus API (as Grafana and the SDK hold one)."""

    def __init__(self, base: str, token: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.Client(base_url=base, headers=headers, timeout=600.0)

    def query(self, query: str, start_ms: int, end_ms: int, step_ms: int) -> Answer:
        """A range query, or an instant query at ``end_ms`` when ``step_ms`` is 0."""
        if step_ms:
            path = "/api/v1/query_range"
            params = {
                "query": query,
                "start": f"{start_ms / 1000:.3f}",
                "end": f"{end_ms / 1000:.3f}",
                "step": f"{step_ms / 1000:.3f}",
            }
        else:
            path, params = "/api/v1/query", {"query": query, "time": f"{end_ms / 1000:.3f}"}
        began = time.perf_counter()
        r = self.client.get(path, params=params)
        body = r.content
        wall = time.perf_counter() - began
        doc = r.json() if body else {}
        if r.status_code != 200 or doc.get("status") != "success":
            return Answer(None, f"{r.status_code} {doc.get('error', body[:200])}", wall)
        return Answer(matrix_of(doc["data"]), "", wall)

    def close(self) -> None:
        self.client.close()


class Server:
    """A child process on loopback with a log file; stopped (terminate, then kill) by :meth:`stop`."""

    name = "server"
    proc: subprocess.Popen[bytes]
    base: str
    _log: IO[str]

    def _start(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self._log = log.open("w")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, path: str, timeout_s: float = 180.0, token: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self._log.name}")
            try:
                if httpx.get(self.base + path, headers=headers, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready in {timeout_s:.0f} s; see {self._log.name}")

    def querier(self) -> HttpQuerier:
        return HttpQuerier(self.base)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class Prometheus(Server):
    """Prometheus over promtool-made blocks, limits raised so that it answers every query: Debian's
    2.x, or another build (``binary``: 3.5 from :func:`peer_binary`)."""

    name = "prometheus"

    def __init__(self, data_dir: Path, log: Path, binary: str | Path = "prometheus") -> None:
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        cfg = data_dir.parent / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
        self._start(
            [
                str(binary),
                f"--storage.tsdb.path={data_dir}",
                f"--web.listen-address=127.0.0.1:{port}",
                f"--config.file={cfg}",
                "--storage.tsdb.retention.time=100y",
                "--query.max-samples=500000000",
                "--query.timeout=5m",
            ],
            log,
        )
        self.wait_ready("/-/ready")


class VictoriaMetrics(Server):
    """VictoriaMetrics single-node; its response cache is off, so every query is computed as the others are."""

    name = "victoria-metrics"

    def __init__(self, data_dir: Path, log: Path) -> None:
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        self._start(
            [
                "victoria-metrics",
                f"-storageDataPath={data_dir}",
                f"-httpListenAddr=127.0.0.1:{port}",
                "-retentionPeriod=100y",
                "-search.disableCache",
                "-search.maxSamplesPerQuery=1000000000",
            ],
            log,
        )
        self.wait_ready("/health")

    def load(self, chunks: Iterable[bytes]) -> None:
        """Import Prometheus text (millisecond timestamps), then flush so that queries see it."""
        with httpx.Client(base_url=self.base, timeout=600) as c:
            for chunk in chunks:
                c.post("/api/v1/import/prometheus", content=chunk).raise_for_status()
            c.get("/internal/force_flush").raise_for_status()


class Collector(Server):
    """``ki collector`` over a data directory, with bearer tokens checked as in production."""

    name = "ki collector"

    def __init__(self, store: Path, root: Path, log: Path, *extra: str) -> None:
        """``extra``: more ``ki collector`` arguments (e.g. ``--query-timeout``)."""
        ki = str(Path(sys.executable).with_name("ki"))
        tokens, keys = root / "tokens.json", root / "keys.json"
        out = subprocess.run(
            [ki, "tokens", "create", "--store", str(tokens), "--scope", "read", "--name", "bench", "--json"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        import json

        self.token = str(json.loads(out)["token"])
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self._start(
            [
                ki,
                "collector",
                "--store",
                str(store),
                "--port",
                str(port),
                "--tokens",
                str(tokens),
                "--keys",
                str(keys),
                *extra,
            ],
            log,
            env,
        )
        self.wait_ready("/api/v1/status/buildinfo", token=self.token)

    def querier(self) -> HttpQuerier:
        return HttpQuerier(self.base, self.token)
