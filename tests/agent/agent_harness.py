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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from kernel_insight.agent.ring import Ring
from kernel_insight.collector import wire
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


class Receiver:
    """A collector stand-in: decodes and deduplicates like the real one; `script` may override answers."""

    def __init__(self, keys: KeyStore, tls: ssl.SSLContext | None = None) -> None:
        self.keys = keys
        self.tls = tls
        self.got = Received()
        self.script: Script | None = None
        self.frame_script: Callable[[int, bytes], int | None] | None = None
        self.close_each = False
        self.idle_timeout: float | None = None
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                if receiver.idle_timeout is not None:
                    self.connection.settimeout(receiver.idle_timeout)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status, headers = receiver.handle(self.path, body, self.headers.get("Content-Type", ""))
                payload = b"{}"
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                if receiver.close_each:
                    self.send_header("Connection", "close")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.handler = Handler
        self.server = self._make_server(0)
        self.port = self.server.server_address[1]
        self._serve()

    def _make_server(self, port: int) -> ThreadingHTTPServer:
        server = ThreadingHTTPServer(("127.0.0.1", port), self.handler)
        if self.tls is not None:
            server.socket = self.tls.wrap_socket(server.socket, server_side=True)
        return server

    def _serve(self) -> None:
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Stop listening: the agent now gets connection refused."""
        self.server.shutdown()
        self.server.server_close()

    def restart(self) -> None:
        """Listen again on the same port."""
        self.server = self._make_server(self.port)
        self._serve()

    @property
    def url(self) -> str:
        if self.tls is not None:
            return f"https://localhost:{self.port}"
        return f"http://127.0.0.1:{self.port}"

    def handle(
        self, path: str, body: bytes, content_type: str = wire.CONTENT_TYPE
    ) -> tuple[int, dict[str, str]]:
        with self.lock:
            self.got.requests += 1
            self.got.times.append(time.monotonic())
            n = self.got.requests
        if path != wire.INGEST_PATH:
            return 404, {}
        if self.script is not None:
            override = self.script(n, body)
            if override is not None:
                return override
        if content_type == wire.FRAMES_CONTENT_TYPE:
            try:
                frames = wire.split_frames(body)
            except wire.WireError as exc:
                self.got.errors.append(str(exc))
                return 400, {}
            self.got.frames_per_request.append(len(frames))
            statuses = [self.handle_frame(n, bytes(f))[0] for f in frames]
            return 200, {wire.BATCH_STATUS_HEADER: ", ".join(map(str, statuses))}
        self.got.frames_per_request.append(1)
        return self.handle_frame(n, body)

    def handle_frame(self, n: int, body: bytes) -> tuple[int, dict[str, str]]:
        """One frame, as the real router settles it; `frame_script` may override its status."""
        if self.frame_script is not None:
            override = self.frame_script(n, body)
            if override is not None:
                return override, {}
        try:
            batch = wire.decode_batch(body, lambda h: self.keys.key_for(h.agent_id, h.key_id))
        except wire.AuthenticationFailed:
            return 401, {}
        except wire.WireError as exc:
            self.got.errors.append(str(exc))
            return 400, {}
        except Exception as exc:  # UnknownAgent / RevokedAgent
            return 403, {"X-Reason": type(exc).__name__}
        with self.lock:
            if batch.batch_id in self.got.batches:
                self.got.duplicates += 1
                return 409, {}
            self.got.batches[batch.batch_id] = batch
            self.got.order.append(batch.batch_id)
        return 200, {}

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.stop()


@dataclass
class AgentProc:
    proc: subprocess.Popen[str]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
            self.proc.wait(30)


def wait_for(pred: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


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
