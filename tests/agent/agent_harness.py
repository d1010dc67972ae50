"""Helpers to run the real ki-agent against a ring and a scriptable HTTP receiver (not a test file)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import uvicorn
from fastapi import FastAPI, Request, Response
from starlette.concurrency import run_in_threadpool

from kernel_insight.agent.ring import Ring
from kernel_insight.api.app import listening_socket
from kernel_insight.collector import wire
from kernel_insight.collector.clickhouse.store import StorageError, StorageUnavailable
from kernel_insight.collector.ingest import ingest_router
from kernel_insight.collector.keys import AgentCredentials, KeyStore

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "agent" / "src"


def build(out: Path, target: str = "all", **make_vars: str) -> Path:
    """Compile with the agent's own Makefile; returns the output directory."""
    out.mkdir(parents=True, exist_ok=True)
    args = ["make", "-s", "-C", str(SRC), f"OUT={out}", target, *(f"{k}={v}" for k, v in make_vars.items())]
    subprocess.run(args, check=True, capture_output=True, text=True)
    return out


@dataclass
class Received:
    """What the receiver saw: decoded batches by id, duplicates, request count and timing."""

    batches: dict[wire.BatchId, wire.DecodedBatch] = field(default_factory=dict)
    order: list[wire.BatchId] = field(default_factory=list)
    requests: int = 0
    frames_per_request: list[int] = field(default_factory=list)
    duplicates: int = 0
    times: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def all_array_bytes(self) -> list[bytes]:
        """Every shipped record as its 64-byte image, in delivery order."""
        out: list[bytes] = []
        for bid in self.order:
            arr = self.batches[bid].to_array()
            raw = arr.tobytes()
            out.extend(raw[i : i + 64] for i in range(0, len(raw), 64))
        return out

    def last_counters(self) -> dict[int, int]:
        if not self.order:
            return {}
        last = max(self.order, key=lambda b: (b.epoch, b.seq))
        return self.batches[last].counters

    def names(self) -> dict[tuple[int, int], str]:
        out: dict[tuple[int, int], str] = {}
        for bid in self.order:
            out.update(self.batches[bid].strings)
        return out


Script = Callable[[int, bytes], tuple[int, dict[str, str]] | None]

#: What ``frame_script`` may make of one frame: the store refuses it for good, is away, or had it.
_SINK_VERDICTS = (422, 503, 409)


class Receiver:
    """The collector's real ingest router (collector/ingest.py) over a recording sink, under uvicorn.

    Statuses, frames, deduplication and sender checks are the collector's own; only storage is
    a stand-in that keeps the decoded batches in ``got``. ``script(n, body)`` may answer the
    n-th request itself (status, headers), before the router sees it; ``frame_script(n, frame)``
    may have the store refuse one frame for good (422), be away (503) or have it already (409).
    """

    def __init__(self, keys: KeyStore, tls: ssl.SSLContext | None = None) -> None:
        self.keys = keys
        self.tls = tls
        self.got = Received()
        self.script: Script | None = None
        self.frame_script: Callable[[int, bytes], int | None] | None = None
        self.close_each = False
        self._idle_timeout: float | None = None
        self.lock = threading.Lock()
        self._verdicts: dict[wire.BatchId, int] = {}
        self.app = FastAPI()
        self.app.include_router(ingest_router(keys, self._store))
        self.app.middleware("http")(self._front)
        sock = listening_socket("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        self._start(sock)

    def _store(self, batch: wire.DecodedBatch) -> bool:
        """The sink: keep the batch (False when it was kept before), or the verdict frame_script chose."""
        with self.lock:
            verdict = self._verdicts.pop(batch.batch_id, None)
            if verdict == 422:
                raise StorageError("refused by the test's frame_script")
            if verdict == 503:
                raise StorageUnavailable("away, says the test's frame_script", retry_after_s=1)
            if verdict == 409 or batch.batch_id in self.got.batches:
                return False
            self.got.batches[batch.batch_id] = batch
            self.got.order.append(batch.batch_id)
        return True

    async def _front(self, request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        """Count the request, let ``script`` answer it, note frame verdicts, then record what the router said."""
        body = await request.body()
        with self.lock:
            self.got.requests += 1
            self.got.times.append(time.monotonic())
            n = self.got.requests
        answer = await self._scripted(n, body, request.headers.get("content-type", ""))
        if answer is None:
            response = await call_next(request)
            content = b"".join([chunk async for chunk in response.body_iterator])  # type: ignore[attr-defined]
            answer = Response(content, response.status_code, dict(response.headers))
            self._record(request.url.path, answer, content)
        if self.close_each:
            answer.headers["Connection"] = "close"
        return answer

    async def _scripted(self, n: int, body: bytes, content_type: str) -> Response | None:
        if self.script is not None:
            override = await run_in_threadpool(self.script, n, body)
            if override is not None:
                return Response(b"{}", override[0], override[1])
        if self.frame_script is not None:
            many = content_type.split(";")[0].strip().lower() == wire.FRAMES_CONTENT_TYPE
            with contextlib.suppress(wire.WireError):
                for frame in wire.split_frames(body) if many else [body]:
                    verdict = self.frame_script(n, bytes(frame))
                    if verdict is not None:
                        if verdict not in _SINK_VERDICTS:
                            raise ValueError(f"frame_script may answer {_SINK_VERDICTS}, not {verdict}")
                        with self.lock:
                            self._verdicts[wire.parse_header(frame).batch_id] = verdict
        return None

    def _record(self, path: str, response: Response, content: bytes) -> None:
        if path != wire.INGEST_PATH:
            return
        header = response.headers.get(wire.BATCH_STATUS_HEADER)
        statuses = [int(x) for x in header.split(",")] if header else [response.status_code]
        results = orjson.loads(content).get("results") if header else [orjson.loads(content)]
        with self.lock:
            self.got.frames_per_request.append(len(statuses))
            self.got.duplicates += statuses.count(409)
            self.got.errors += [
                r.get("detail", "") for r, st in zip(results, statuses, strict=True) if st == 400
            ]

    @property
    def idle_timeout(self) -> float | None:
        """Seconds a kept-alive connection may sit idle before the server drops it (None: uvicorn's 5)."""
        return self._idle_timeout

    @idle_timeout.setter
    def idle_timeout(self, seconds: float | None) -> None:
        self._idle_timeout = seconds
        self.server.config.timeout_keep_alive = 5 if seconds is None else seconds  # type: ignore[assignment]

    def _start(self, sock: socket.socket) -> None:
        keep_alive = 5 if self._idle_timeout is None else self._idle_timeout
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            lifespan="off",
            timeout_keep_alive=keep_alive,  # type: ignore[arg-type]
        )
        config.load()
        config.ssl = self.tls
        self.server = uvicorn.Server(config)
        self.sock = sock
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert self.thread.is_alive(), "uvicorn exited"
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        """Stop listening: the agent now gets connection refused."""
        self.server.should_exit = True
        self.thread.join(timeout=20)
        self.sock.close()

    def restart(self) -> None:
        """Listen again on the same port (with the idle timeout set now)."""
        self._start(listening_socket("127.0.0.1", self.port))

    @property
    def url(self) -> str:
        if self.tls is not None:
            return f"https://localhost:{self.port}"
        return f"http://127.0.0.1:{self.port}"

    def handle(
        self, path: str, body: bytes, content_type: str = wire.CONTENT_TYPE
    ) -> tuple[int, dict[str, str]]:
        """Send one request to this receiver now (from a script too: it runs off the server's loop)."""
        answer = httpx.post(
            self.url + path, content=body, headers={"Content-Type": content_type}, verify=False, timeout=30
        )
        return answer.status_code, dict(answer.headers)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.stop()


@dataclass
class AgentProc:
    proc: subprocess.Popen[str]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()

    def prioritize(self, nice: int = -10) -> bool:
        """Run the agent ahead of the machine's other work where that is allowed (root): for tests of
        the agent's own timing (drains paced by the producers' rate), so that what they judge is
        the agent's pacing, not whether a loaded machine scheduled it. False where not allowed."""
        try:
            os.setpriority(os.PRIO_PROCESS, self.proc.pid, nice)
        except PermissionError:
            return False
        return True

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


class Setup:
    """One ring, one key store, one enrolled agent, spool dir; starts agents and receivers."""

    def __init__(
        self,
        tmp: Path,
        binary: Path,
        ring_name: str,
        capacity: int = 1 << 14,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.tmp = tmp
        self.binary = binary
        self.ring_name = ring_name
        with contextlib.suppress(OSError):
            Ring.unlink(ring_name)
        self.ring = Ring.create(ring_name, capacity=capacity)
        self.keys = KeyStore(tmp / "keys.json")
        self.creds: AgentCredentials = self.keys.add_agent("test")
        self.key_file = tmp / "agent.key"
        self.creds.write_key_file(self.key_file)
        self.spool = tmp / "spool"
        self.receiver = Receiver(self.keys, tls)
        self.agents: list[AgentProc] = []

    def start(self, *extra: str, url: str | None = None, env: dict[str, str] | None = None) -> AgentProc:
        log_path = self.tmp / f"agent-{len(self.agents)}.log"
        args = [
            str(self.binary),
            "--ring", self.ring_name,
            "--collector", url or self.receiver.url,
            "--key-file", str(self.key_file),
            "--spool-dir", str(self.spool),
            "--drain-interval-ms", "20",
            "--backoff-min-ms", "20",
            "--backoff-max-ms", "200",
            "--shutdown-timeout-s", "3",
            "--histograms=0",  # these tests follow every record; tests/agent/test_agent_histograms.py samples
            *extra,
        ]  # fmt: skip
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("KI_AGENT_")}
        full_env.update(env or {})
        full_env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1")
        with log_path.open("w") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=full_env, text=True)
        agent = AgentProc(proc, log_path)
        self.agents.append(agent)
        return agent

    def close(self) -> None:
        for a in self.agents:
            if a.proc.poll() is None:
                a.proc.kill()
                a.proc.wait()
        self.receiver.close()
        self.ring.close()
        with contextlib.suppress(OSError):
            Ring.unlink(self.ring_name)


class Collector:
    """The real collector (collector_proc.py: create_app + ingest router + embedded store) as a process."""

    def __init__(self, data: Path, keys: Path, port: int, log: Path) -> None:
        self.args = [
            sys.executable,
            str(REPO / "tests" / "agent" / "collector_proc.py"),
            str(data),
            str(keys),
            str(port),
        ]
        self.port = port
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        import httpx

        with self.log.open("a") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)

        def healthy() -> bool:
            try:
                return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, 60, "collector health")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # reaped on the way out too: the caller's failure is the report
                self.proc.wait()
                raise


def wait_for(pred: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class PacedProducer(threading.Thread):
    """Writes KERNEL records into a ring at ``rate``/s in 10 ms steps, as a probe does: never
    waits, a full ring drops (counted in ``dropped``); correlation numbers from ``base`` on are unique.
    ``set_rate`` changes the rate from then on (what was due before stays written).

    ``catch_up`` False: the rate is a ceiling at every moment, as a probe's is (kernels end at the
    GPU's pace): when this thread was not scheduled for longer than ``MAX_LAG_S`` (a loaded
    machine), what fell due meanwhile is not written, instead of in one burst far above the rate.
    True (the default): every record due is written, ``rate`` per second on average."""

    MAX_LAG_S = 0.05

    def __init__(self, ring: Ring, rate: int, base: int = 0, catch_up: bool = True) -> None:
        super().__init__(daemon=True)
        self.ring = ring
        self.rate = rate
        self.base = base
        self.catch_up = catch_up
        self.written = 0
        self.dropped = 0
        self.skipped = 0  # due while the thread was not scheduled (catch_up False)
        self.stop_flag = threading.Event()
        self.names = [ring.intern(f"kernel_{i}") for i in range(4)]
        self._lock = threading.Lock()
        self._pace = (time.monotonic(), 0, rate)  # since when, how many written then, at what rate

    def set_rate(self, rate: int) -> None:
        with self._lock:
            self._pace = (time.monotonic(), self.written, rate)
            self.rate = rate

    def run(self) -> None:
        self._pace = (time.monotonic(), 0, self.rate)
        while not self.stop_flag.is_set():
            with self._lock:
                since, before, rate = self._pace
                now_s = time.monotonic()
                due = before + int((now_s - since) * rate)
                if not self.catch_up and due - self.written > rate * self.MAX_LAG_S:
                    self.skipped += due - self.written
                    self._pace = (now_s, self.written, rate)
                    due = self.written
            now = time.time_ns()
            while self.written < due:
                n = self.written
                rc = self.ring.kernel(self.names[n % 4], 0, now, now + 5000, 1, self.base + n)
                if rc != 0:
                    self.dropped += 1
                self.written += 1
            time.sleep(0.01)


@contextlib.contextmanager
def setup(
    tmp: Path, binary: Path, name: str, capacity: int = 1 << 14, tls: ssl.SSLContext | None = None
) -> Iterator[Setup]:
    s = Setup(tmp, binary, name, capacity, tls)
    try:
        yield s
    finally:
        s.close()


def self_signed(tmp: Path) -> tuple[Path, ssl.SSLContext]:
    """A certificate for localhost / 127.0.0.1 (its own CA) and a server context using it."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert_path, key_path)
    return cert_path, ctx
