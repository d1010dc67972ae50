"""``make bench-fleet-gpus``: a GPU fleet of Kernel Insight's own agents into one ``ki collector``,
the shipped rules evaluated and the health snapshot polled (issue 34's GPU fleet).

1. **Record** real agent traffic once: a real ``ki-agent`` (its defaults: native histograms,
   kept spans, zstd, ChaCha20-Poly1305; one agent per GPU, as deployed) drains a ring fed by two
   C producers: ``kernel_producer`` (bench/histogram: ``--gpu-kernel-rate`` long-tailed kernels/s over
   the 100 real kernel names of ``kernel_names.txt``) and ``ringtool paced`` at rate 0 (16
   NVML-like GPU_SAMPLE metrics at 10 Hz). The agent sends to a recording endpoint on loopback
   that answers 200 and keeps every frame with its arrival time; each frame is then opened with
   the key the agent was enrolled with (``wire.open_frame``): the plaintext bodies and headers.
2. **Replay** ``--gpus`` agents' worth of it at the wire level, from one asyncio process
   (``python -m bench.fleet.gpus send``, apart from the measuring process so neither's GIL
   bends the other's timings): every agent enrolled with its own key (``KeyStore.add_agents``),
   its own keep-alive connection, the recorded batches at their recorded cadence (an agent with
   histograms on seals about once a second, ``span_seal_ms``), their timestamps (header
   ``t_min``/``t_max``, the first ``ts_ns`` of every record column and the histograms' export
   time) shifted to now, re-compressed (zstd level 1, the agent's) and sealed under the agent's
   key with the recorded sequence numbers in an epoch of its own. When the recording runs out the
   agent starts over in a new epoch, as a restarted agent would (first exports cumulative, every
   name sent again). Agents start spread over one recording length (``--gpu-record-seconds``), which
   is the warm-up; then ``--gpu-seconds`` are measured.
3. **Measure**, against ``ki collector --rules 'deploy/rules/*.yml'`` on a store pre-filled
   with ``--gpu-instances`` instances of 8 GPUs (bench/api's ``populate``: 10,000
   live senders do not fit this 2-core machine, so the snapshot's instances are the
   populated ones plus the live agents): ingest lag per batch (the collector's answer time minus the
   batch's ``t_max``, what ``ki_ingest_lag_seconds`` measures at receipt, here once stored),
   answers other than 200, how late the sender fell behind its schedule, whether every rule
   group of deploy/rules evaluated on time (``/api/v1/rules``: ``evaluationTime`` under its
   interval, and no evaluation missed), the health snapshot's GET latency over one keep-alive
   connection (full 200 answers, asked with ``Accept-Encoding: gzip`` as httpx and the SDK ask, timed
   until the last byte is in, every ``--gpu-snapshot-every`` seconds; the first GET, which builds it,
   is timed apart before the agents start), the collector's CPU and
   peak RSS.

A fleet of N GPUs *holds* when every batch was answered 200, the lag p99 stayed under 2 s and
the rules ran on time. Ends with ``BENCH fleet gpus_held=<largest N held> snapshot_p99_ms=<p99 at
that N> ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import gzip
import json
import os
import pickle
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx

from bench.api.__main__ import GPUS, KeepAliveConn, populate
from bench.collector_process import start_collector
from bench.e2e.fleet import REPO, build_ringtool, wait_until
from bench.histogram.producer import build_producer
from bench.kql.servers import process_cpu_s
from kernel_insight.agent.ring import Ring
from kernel_insight.collector import wire
from kernel_insight.collector.keys import AgentCredentials, KeyStore

__all__ = [
    "Recording",
    "add_arguments",
    "bench_keys",
    "main",
    "record",
    "shift_pieces",
    "shifted_body",
    "sweep",
]

AGENT = REPO / "agent" / "bin" / "ki-agent"
KERNEL_NAMES = REPO / "bench" / "histogram" / "kernel_names.txt"
RULES = str(REPO / "deploy" / "rules" / "*.yml")
LAG_LIMIT_S = 2.0
ZSTD_LEVEL = 1  # the agent's default zstd_level
FIRST_SNAPSHOT_TIMEOUT_S = 600.0  # the snapshot is built on demand at the first GET
ANSWER_TIMEOUT_S = 30.0  # the longest wait for one answer (the agent's io_timeout_ms is 5 s)


# ---- timestamps inside a plaintext body ---------------------------------------------------


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if not v:
            out.append(b)
            return bytes(out)
        out.append(b | 0x80)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        if not b & 0x80:
            return v, pos
        shift += 7


#: A body cut where its absolute timestamps are: bytes kept as they are, and for each section
#: holding a timestamp ``(tag, prefix, ts_ns, rest, suffix, column)``: the section is ``prefix``,
#: the timestamp, ``rest``, then ``suffix``; ``column`` says ``varint(ts) + rest`` is a
#: length-prefixed column (a RECORDS section's ``ts_ns``, its first value a delta from 0).
Piece = bytes | tuple[int, bytes, int, bytes, bytes, bool]

_TS_COLUMN = 5  # pos, producer, flags, device, id, ts_ns: docs/wire.md, RECORDS


def shift_pieces(body: bytes) -> list[Piece]:
    """Cut a plaintext body (docs/wire.md) at its absolute timestamps: every RECORDS section's
    first ``ts_ns`` (the rest are deltas, ``end_ns`` is relative to it) and the HISTOGRAMS
    export time. COUNTERS hold durations only; a CAPTURES section (windows on the agent's clock)
    is refused, a recording has none."""
    out: list[Piece] = [body[:1]]
    pos = 1
    while pos < len(body):
        tag = body[pos]
        length, start = _read_varint(body, pos + 1)
        end = start + length
        data = body[start:end]
        if tag >= wire.SECTION_RECORDS:
            p = _read_varint(data, 0)[1]  # n
            for _ in range(_TS_COLUMN):
                clen, p = _read_varint(data, p)
                p += clen
            clen, cstart = _read_varint(data, p)
            zz, after = _read_varint(data, cstart)
            ts = (zz >> 1) ^ -(zz & 1)
            out.append((tag, data[:p], ts, data[after : cstart + clen], data[cstart + clen :], True))
        elif tag == wire.SECTION_HISTOGRAMS:
            after_k = _read_varint(data, 0)[1]
            ts, after = _read_varint(data, after_k)
            out.append((tag, data[:after_k], ts, b"", data[after:], False))
        elif tag == wire.SECTION_CAPTURES:
            raise ValueError("a recorded batch carries a CAPTURES section: record without capture windows")
        else:
            out.append(body[pos:end])
        pos = end
    return out


def shifted_body(pieces: list[Piece], shift_ns: int) -> bytes:
    """The body ``pieces`` were cut from, every absolute timestamp moved by ``shift_ns``."""
    out = bytearray()
    for p in pieces:
        if isinstance(p, bytes):
            out += p
            continue
        tag, prefix, ts, rest, suffix, column = p
        t = ts + shift_ns
        if column:
            col = _varint((t << 1) ^ (t >> 63)) + rest
            data = prefix + _varint(len(col)) + col + suffix
        else:
            data = prefix + _varint(t) + suffix
        out.append(tag)
        out += _varint(len(data))
        out += data
    return bytes(out)


# ---- recording ------------------------------------------------------------------------------


@dataclass
class Batch:
    """One recorded batch: when it arrived (wall s), its header's fields, its plaintext cut up."""

    at_s: float
    seq: int
    t_min_ns: int
    t_max_ns: int
    record_count: int
    pieces: list[Piece]
    frame_bytes: int


@dataclass
class Recording:
    batches: list[Batch]
    start_s: float  #: the agent's start (wall): the replay's time origin
    seconds: float  #: one pass of the recording
    kernel_rate: int

    @property
    def bytes_per_s(self) -> float:
        return sum(b.frame_bytes for b in self.batches) / self.seconds


class _Tap(BaseHTTPRequestHandler):
    """Answers an agent's POST /v1/ingest as a collector that stores everything, keeping the bytes."""

    protocol_version = "HTTP/1.1"
    frames: ClassVar[list[tuple[float, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        now = time.time()
        frames = wire.split_frames(body)
        self.frames.extend((now, bytes(f)) for f in frames)
        self.send_response(200)
        if self.headers.get("Content-Type") == wire.FRAMES_CONTENT_TYPE:
            self.send_header(wire.BATCH_STATUS_HEADER, ", ".join("200" for _ in frames))
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        pass


def record(tmp: Path, seconds: float, kernel_rate: int) -> Recording:
    """Run producer -> ring -> real ki-agent -> the tap for ``seconds``; the plaintext batches."""
    if not AGENT.exists():
        raise SystemExit(f"{AGENT} missing: run make build")
    ringtool, producer = build_ringtool(tmp), build_producer(tmp)
    creds = KeyStore(tmp / "rec-keys.json").add_agent("recorded-gpu")
    creds.write_key_file(tmp / "rec.key")
    _Tap.frames = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Tap)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ring_name = f"/ki_bench_gpus.{os.getpid()}"
    with contextlib.suppress(OSError):
        Ring.unlink(ring_name)
    ring = Ring.create(ring_name)
    log = (tmp / "rec-agent.log").open("w")
    start = time.time()
    agent = subprocess.Popen(
        [str(AGENT), "--ring", ring_name, "--collector", f"http://127.0.0.1:{server.server_port}",
         "--key-file", str(tmp / "rec.key"), "--spool-dir", str(tmp / "rec-spool"),
         "--log-level", "warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    procs = [
        subprocess.Popen([str(ringtool), "paced", ring_name, "0", str(seconds)], stdout=subprocess.DEVNULL),
        subprocess.Popen(
            [str(producer), ring_name, str(int(kernel_rate * seconds)), "100", str(kernel_rate), "1", "-",
             str(KERNEL_NAMES)],
            stdout=subprocess.DEVNULL,
        ),
    ]  # fmt: skip
    try:
        for p in procs:
            if p.wait(timeout=seconds * 4 + 60) != 0:
                raise SystemExit(f"producer {p.args!r} failed ({p.returncode})")
        agent.send_signal(signal.SIGTERM)  # its last export goes with its last batch
        agent.wait(timeout=60)
    finally:
        for p in (*procs, agent):
            if p.poll() is None:
                p.kill()
                p.wait()
        server.shutdown()
        ring.close()
        with contextlib.suppress(OSError):
            Ring.unlink(ring_name)
        log.close()
    batches = []
    for at, frame in _Tap.frames:
        h = wire.parse_header(frame)
        body = wire.open_frame(frame, h, creds.key)
        batches.append(
            Batch(at, h.seq, h.t_min_ns, h.t_max_ns, h.record_count, shift_pieces(body), len(frame))
        )
    batches.sort(key=lambda b: b.seq)
    if len(batches) < 3:
        raise SystemExit(
            f"the agent sent {len(batches)} batches: {(tmp / 'rec-agent.log').read_text()[-2000:]}"
        )
    span = max(b.at_s for b in batches) - start + 1.0  # a pass ends a second after its last batch
    return Recording(batches, start, span, kernel_rate)


# ---- the replaying sender (its own process) ---------------------------------------------------


@dataclass
class SendPlan:
    url: str
    recording: Recording
    agents: list[AgentCredentials]
    start_s: float  #: wall time the first agent starts
    measure_from_s: float
    end_s: float


@dataclass
class SendResult:
    batches: int = 0
    bytes: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    lags_s: list[float] = field(default_factory=list)  #: measured batches: answer time - t_max
    answer_s: list[float] = field(default_factory=list)  #: measured batches: request sent -> answered
    max_late_s: float = 0.0  #: how far behind its schedule the sender fell (measured batches)
    errors: list[str] = field(default_factory=list)
    send_cpu_s: float = 0.0


async def _agent(plan: SendPlan, i: int, res: SendResult) -> None:
    rec, creds = plan.recording, plan.agents[i]
    hostport = plan.url.removeprefix("http://")
    host, port = hostport.split(":")
    offset = rec.seconds * i / len(plan.agents)  # agents spread over one pass
    headers = {"Content-Type": wire.CONTENT_TYPE}
    conn: KeepAliveConn | None = None
    epoch = int(plan.start_s)
    base = plan.start_s + offset
    while True:
        shift_ns = int((base - rec.start_s) * 1e9)
        for b in rec.batches:
            due = base + (b.at_s - rec.start_s)
            if due >= plan.end_s:
                if conn is not None:
                    conn.writer.close()
                return
            delay = due - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            t_max = b.t_max_ns + shift_ns
            frame = wire.seal_body(
                shifted_body(b.pieces, shift_ns), agent_id=creds.agent_id, key_id=creds.key_id, key=creds.key,
                epoch=epoch, seq=b.seq, t_min_ns=b.t_min_ns + shift_ns, t_max_ns=t_max,
                record_count=b.record_count, level=ZSTD_LEVEL,
            )  # fmt: skip
            sent = time.time()
            try:
                if conn is None:
                    conn = KeepAliveConn(*await asyncio.open_connection(host, int(port)))
                status, _, _ = await asyncio.wait_for(
                    conn.request("POST", hostport, wire.INGEST_PATH, headers, frame), ANSWER_TIMEOUT_S
                )
            except (OSError, asyncio.IncompleteReadError, ValueError, TimeoutError) as exc:
                status = 0
                if len(res.errors) < 5:
                    res.errors.append(f"agent {i}: {exc!r}")
                if conn is not None:
                    conn.writer.close()
                conn = None
            done = time.time()
            res.statuses[status] = res.statuses.get(status, 0) + 1
            res.batches += 1
            res.bytes += len(frame)
            if sent >= plan.measure_from_s:
                res.lags_s.append(done - t_max / 1e9)
                res.answer_s.append(done - sent)
                res.max_late_s = max(res.max_late_s, sent - due)
        base += rec.seconds
        epoch += 1  # a new run of the agent: a fresh nonce space


def _send(plan_path: Path, out_path: Path) -> None:
    plan: SendPlan = pickle.loads(plan_path.read_bytes())
    res = SendResult()

    async def run() -> None:
        await asyncio.gather(*(_agent(plan, i, res) for i in range(len(plan.agents))))

    c0 = time.process_time()
    asyncio.run(run())
    res.send_cpu_s = time.process_time() - c0
    out_path.write_text(json.dumps(asdict(res)))


# ---- one fleet size -------------------------------------------------------------------------


@dataclass
class FleetResult:
    gpus: int
    instances: int
    seconds: float
    batches_per_s: float = 0.0
    kb_per_s: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)
    lag_p50_s: float = 0.0
    lag_p99_s: float = 0.0
    answer_p99_s: float = 0.0  #: the collector's answer time alone (request sent -> answered)
    recorded_lag_s: float = 0.0  #: the recorded agent's own lag (arrival - t_max), median
    max_late_s: float = 0.0
    rule_groups: int = 0
    rules_on_time: bool = False
    rule_eval_max_s: float = 0.0  #: the slowest group evaluation seen
    rule_overdue_max_s: float = 0.0  #: most seconds past a group's interval without an evaluation
    snapshot_instances: int = 0
    first_snapshot_s: float = 0.0  #: the first GET, built on demand before the agents start
    snapshot_p50_ms: float = 0.0
    snapshot_p99_ms: float = 0.0
    snapshot_kib: float = 0.0
    collector_cpu_pct: float = 0.0
    collector_rss_peak_mb: float = 0.0
    sender_cpu_pct: float = 0.0
    errors: list[str] = field(default_factory=list)
    holds: bool = False


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _iso_s(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class _Watcher(threading.Thread):
    """Rules every 5 s (evaluation time and age per group) and the collector's RSS every second."""

    def __init__(self, url: str, pid: int, started_s: float, measure_from_s: float) -> None:
        super().__init__(name="gpu-fleet-watch", daemon=True)
        self.url, self.pid, self.started_s, self.measure_from_s = url, pid, started_s, measure_from_s
        self.stop = threading.Event()
        self.rss_peak_kb = 0
        self.groups = 0
        self.eval_max_s = 0.0
        self.overdue_max_s = 0.0
        self.late_groups: set[str] = set()
        self.errors: list[str] = []

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as c:
            tick = 0
            while not self.stop.wait(1.0):
                with contextlib.suppress(OSError):
                    self.rss_peak_kb = max(self.rss_peak_kb, _rss_kb(self.pid))
                tick += 1
                if tick % 5 or time.time() < self.measure_from_s:
                    continue
                try:
                    groups = c.get("/api/v1/rules").json()["data"]["groups"]
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    self.errors.append(f"rules: {exc!r}")
                    continue
                now = time.time()
                self.groups = len(groups)
                for g in groups:
                    self.eval_max_s = max(self.eval_max_s, g["evaluationTime"])
                    # a group not evaluated yet counts from the collector's start
                    overdue = now - max(_iso_s(g["lastEvaluation"]), self.started_s) - g["interval"]
                    self.overdue_max_s = max(self.overdue_max_s, overdue)
                    # a missed round: older than one interval plus the poll's own 5 s
                    if g["evaluationTime"] >= g["interval"] or overdue > 5.0:
                        self.late_groups.add(g["name"])


async def _snapshot_latencies(url: str, until_s: float, every_s: float) -> tuple[list[float], int, int]:
    hostport = url.removeprefix("http://")
    host, port = hostport.split(":")
    conn = KeepAliveConn(*await asyncio.open_connection(host, int(port)))
    times: list[float] = []
    size = instances = 0
    headers: dict[str, str] = {}
    while time.time() < until_s:
        t0 = time.perf_counter()
        status, headers, body = await asyncio.wait_for(
            conn.request("GET", hostport, "/v1/health/snapshot", {"Accept-Encoding": "gzip"}),
            ANSWER_TIMEOUT_S * 4,
        )
        times.append((time.perf_counter() - t0) * 1000)
        if status != 200:
            raise SystemExit(f"snapshot answered {status}: {body[:200]!r}")
        size = len(body)
        await asyncio.sleep(every_s)
    if headers.get("content-encoding") == "gzip":
        body = gzip.decompress(body)
    instances = len(json.loads(body)["instances"])
    conn.writer.close()
    return times, size, instances


def _say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def _q(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100)[q - 1]


def run_fleet(
    gpus: int, rec: Recording, populated: Path, root: Path, args: argparse.Namespace
) -> FleetResult:
    """One collector, ``gpus`` replayed agents, rules and snapshot measured for ``args.gpu_seconds``."""
    store = root / f"store-{gpus}"
    subprocess.run(["cp", "-a", str(populated), str(store)], check=True)
    keys = KeyStore(root / f"keys-{gpus}.json").add_agents([f"gpu-{i:05d}" for i in range(gpus)])
    started = time.time()
    proc, url = start_collector(
        "--store", str(store), "--keys", str(root / f"keys-{gpus}.json"), "--auth-store", "file",
        "--local-dev", "--rules", RULES, "--interval", "5",
        "--histogram-base-mb", str(args.gpu_histogram_base_mb),
    )  # fmt: skip
    result = FleetResult(gpus, args.gpu_instances, args.gpu_seconds)
    try:
        t0 = time.perf_counter()
        with httpx.Client(base_url=url, timeout=FIRST_SNAPSHOT_TIMEOUT_S) as c:
            c.get("/v1/health/snapshot").raise_for_status()  # the first one is built on demand
        result.first_snapshot_s = time.perf_counter() - t0
        _say(f"first snapshot in {result.first_snapshot_s:.1f} s")
        start = time.time() + 2.0
        measure_from = start + rec.seconds
        end = measure_from + args.gpu_seconds
        plan_path, out_path = root / f"plan-{gpus}.pkl", root / f"sent-{gpus}.json"
        plan_path.write_bytes(pickle.dumps(SendPlan(url, rec, keys, start, measure_from, end)))
        sender = subprocess.Popen(
            [sys.executable, "-m", "bench.fleet.gpus", "send", str(plan_path), str(out_path)], cwd=REPO
        )
        watcher = _Watcher(url, proc.pid, started, measure_from)
        watcher.start()
        _say(f"collector up, {gpus} agents starting over {rec.seconds:.0f} s")
        wait_until(
            lambda: time.time() >= measure_from or sender.poll() is not None, rec.seconds + 60, "warm-up"
        )
        _say("measuring")
        cpu0, t0 = process_cpu_s(proc.pid), time.time()
        times, size, instances = asyncio.run(_snapshot_latencies(url, end, args.gpu_snapshot_every))
        _say(f"{len(times)} snapshots taken")
        if sender.wait(timeout=300) != 0:
            raise SystemExit(f"the sender failed ({sender.returncode})")
        result.collector_cpu_pct = (process_cpu_s(proc.pid) - cpu0) / (time.time() - t0) * 100
        watcher.stop.set()
        watcher.join()
        sent = SendResult(**json.loads(out_path.read_text()))
        sent.statuses = {int(k): v for k, v in sent.statuses.items()}  # JSON keys are text
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with contextlib.suppress(FileNotFoundError):
            subprocess.run(["rm", "-rf", str(store)], check=True)
    total_s = end - start
    result.batches_per_s = sent.batches / total_s
    result.kb_per_s = sent.bytes / total_s / 1000
    result.statuses = {str(k): v for k, v in sorted(sent.statuses.items())}
    result.lag_p50_s, result.lag_p99_s = _q(sent.lags_s, 50), _q(sent.lags_s, 99)
    result.max_late_s = sent.max_late_s
    result.answer_p99_s = _q(sent.answer_s, 99)
    result.recorded_lag_s = statistics.median(b.at_s - b.t_max_ns / 1e9 for b in rec.batches)
    result.rule_groups = watcher.groups
    result.rules_on_time = watcher.groups > 0 and not watcher.late_groups and not watcher.errors
    result.rule_eval_max_s, result.rule_overdue_max_s = watcher.eval_max_s, watcher.overdue_max_s
    result.snapshot_instances = instances
    result.snapshot_p50_ms, result.snapshot_p99_ms = _q(times, 50), _q(times, 99)
    result.snapshot_kib = size / 1024
    result.collector_rss_peak_mb = watcher.rss_peak_kb / 1024
    result.sender_cpu_pct = sent.send_cpu_s / total_s * 100
    result.errors = (
        sent.errors + watcher.errors + sorted(f"rule group late: {g}" for g in watcher.late_groups)
    )
    ok = set(sent.statuses) <= {200}
    result.holds = ok and bool(sent.lags_s) and result.lag_p99_s < LAG_LIMIT_S and result.rules_on_time
    return result


def _line(r: FleetResult) -> str:
    return (
        f"{r.gpus} GPUs: {r.batches_per_s:.0f} batches/s ({r.kb_per_s:.0f} kB/s), answers {r.statuses}, "
        f"lag p50 {r.lag_p50_s:.3f} s p99 {r.lag_p99_s:.3f} s (recorded agent's own {r.recorded_lag_s:.3f} s), "
        f"answer p99 {r.answer_p99_s:.3f} s, sender late by up to {r.max_late_s:.2f} s; "
        f"first snapshot {r.first_snapshot_s:.1f} s; rules: {r.rule_groups} groups, slowest evaluation {r.rule_eval_max_s:.2f} s, overdue up to "
        f"{r.rule_overdue_max_s:.1f} s, on time: {r.rules_on_time}; snapshot of {r.snapshot_instances} "
        f"instances ({r.snapshot_kib:.0f} KiB on the wire) p50 {r.snapshot_p50_ms:.2f} ms p99 {r.snapshot_p99_ms:.2f} ms; "
        f"collector {r.collector_cpu_pct:.0f}% of a core, RSS peak {r.collector_rss_peak_mb:.0f} MB; "
        f"sender {r.sender_cpu_pct:.0f}%; holds: {r.holds}"
        + (f"; errors: {r.errors[:5]}" if r.errors else "")
    )


def bench_keys(results: list[FleetResult]) -> str:
    """The GPU fleet's keys of the ``BENCH fleet`` line: the largest N held and its snapshot p99."""
    held = [r for r in results if r.holds]
    best = max(held, key=lambda r: r.gpus) if held else None
    snap = best.snapshot_p99_ms if best else max((r.snapshot_p99_ms for r in results), default=0.0)
    return f"gpus_held={best.gpus if best else 0} snapshot_p99_ms={snap:.2f}"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The GPU fleet's options (``--gpus``, ``--gpu-*``): this module's and ``make bench-fleet``'s."""
    ap.add_argument(
        "--gpus", default="500,1000,2000", help="GPU fleet sizes (agents, one GPU each); '' skips it"
    )
    ap.add_argument(
        "--gpu-instances", type=int, default=10_000, help="instances populated for the health snapshot"
    )
    ap.add_argument("--gpu-seconds", type=float, default=120.0, help="measured seconds per fleet size")
    ap.add_argument(
        "--gpu-record-seconds", type=float, default=60.0, help="recorded agent run (also the warm-up)"
    )
    ap.add_argument("--gpu-kernel-rate", type=int, default=100_000, help="kernels/s of the recorded GPU")
    ap.add_argument("--gpu-snapshot-every", type=float, default=1.0, help="seconds between snapshot GETs")
    ap.add_argument(
        "--gpu-histogram-base-mb", type=int, default=1024, help="the collector's increment-base bound"
    )
    ap.add_argument(
        "--gpu-stop-at-first-miss", action="store_true", help="stop the sweep at the first N not held"
    )


def sweep(args: argparse.Namespace) -> list[FleetResult]:
    """Record once, populate once, then each of ``args.gpus`` in turn; prints a line per size."""
    sizes = [int(n) for n in args.gpus.split(",") if n.strip()]
    if not sizes:
        return []
    results = []
    with tempfile.TemporaryDirectory(prefix="ki-bench-gpus-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        rec = record(root, args.gpu_record_seconds, args.gpu_kernel_rate)
        print(
            f"recorded {len(rec.batches)} batches over {rec.seconds:.0f} s of one GPU at {rec.kernel_rate} "
            f"kernels/s: {rec.bytes_per_s:.0f} B/s on the wire ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
        populated = root / "populated"
        t0 = time.perf_counter()
        populate(populated, args.gpu_instances, int(time.time() * 1000))
        print(
            f"populated {args.gpu_instances} instances x {GPUS} GPUs in {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
        for n in sizes:
            r = run_fleet(n, rec, populated, root, args)
            results.append(r)
            print(_line(r), f"(load {os.getloadavg()[0]:.1f})", flush=True)
            if args.gpu_stop_at_first_miss and not r.holds:
                break
    return results


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "send":
        _send(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    # a SIGTERM (make interrupted, timeout) unwinds like ^C, so the collector and sender are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(prog="python -m bench.fleet.gpus", description=__doc__)
    add_arguments(ap)
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    results = sweep(args)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    print(f"cpus {os.cpu_count()}, load {os.getloadavg()}; collector, sender and poller share them")
    print(f"BENCH fleet {bench_keys(results)}")


if __name__ == "__main__":
    main()
