"""make bench-agent: ki-agent for 60 s at 100k KERNEL records/s against the real collector.

``make bench-catchup`` (``--catchup``): N agents under load, the collector stopped for 30 s
and restarted; how much faster the backlog drains than it grew (issue 11: at least 5x).

Measures the agent from /proc: VmRSS, VmHWM, CPU time, and wire bytes per
record (frame bytes the collector received / records stored). Targets
(issue 3): VmHWM <= 5 MB (stretch 2 MB), CPU <= 5% of one core, <= 6 bytes
per KERNEL record, no memory growth from the first to the last 10 s.
Ends with one ``BENCH agent ...`` line.

Three processes besides the agent: this orchestrator, a producer (Python,
writing the ring) and the collector (create_app + ingest router + embedded
store), so the agent's figures are its own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from types import FrameType

import httpx

from kernel_insight.run import free_port

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
KERNELS = ["gemm_bf16_128x256", "flash_attn_fwd", "rms_norm", "rotary_emb", "nccl_allreduce_ring", "softmax"]


def _producer(ring_name: str, seconds: float, rate: int) -> None:
    """Write KERNEL records at `rate`/s in 10 ms steps: a few names, ~10 us apart, lognormal durations."""
    from kernel_insight.agent.ring import Ring

    ring = Ring.attach(ring_name)
    ids = [ring.intern(k) for k in KERNELS]
    rng = random.Random(1)
    step = rate // 100
    written = dropped = 0
    start = time.monotonic()
    tick = 0
    while time.monotonic() - start < seconds:
        now = time.time_ns()
        for i in range(step):
            t = now + i * (10_000_000 // step)
            if (
                ring.kernel(
                    ids[rng.randrange(len(ids))], 0, t, t + int(rng.lognormvariate(11, 0.6)), 7, written
                )
                == 0
            ):
                written += 1
            else:
                dropped += 1
        tick += 1
        delay = start + tick * 0.01 - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    print(json.dumps({"written": written, "dropped": dropped}), flush=True)


def _collector(data: str, keys: str, port: int, stats_path: str) -> None:
    """The real collector, with a sink wrapper that counts frame bytes and records."""
    import uvicorn

    from kernel_insight.collector.app import create_app
    from kernel_insight.collector.clickhouse.store import EmbeddedStore
    from kernel_insight.collector.ingest import ingest_router
    from kernel_insight.collector.keys import KeyStore
    from kernel_insight.collector.sink import StoreSink
    from kernel_insight.collector.wire import HEADER_SIZE, DecodedBatch

    store = EmbeddedStore(data)
    inner = StoreSink(store)
    totals = {"frame_bytes": 0, "records": 0, "batches": 0}
    lock = threading.Lock()

    class CountingSink:
        """StoreSink, counting what it stored; keeps ``submit`` so a request's frames share a group commit."""

        def submit(self, batch: DecodedBatch) -> Future[bool]:
            future = inner.submit(batch)

            def count(f: Future[bool]) -> None:
                if f.exception() is None and f.result():
                    with lock:
                        totals["frame_bytes"] += HEADER_SIZE + batch.header.payload_len
                        totals["records"] += batch.record_count
                        totals["batches"] += 1
                        Path(stats_path).write_text(json.dumps(totals))

            future.add_done_callback(count)
            return future

        def __call__(self, batch: DecodedBatch) -> bool:
            return self.submit(batch).result()

    app = create_app(store, routers=[ingest_router(KeyStore(Path(keys)), CountingSink())])
    try:
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    finally:
        store.close()


def _proc_status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
            out[key] = int(value.split()[0])
    return out


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _agent_binary() -> Path:
    from kernel_insight.agent.launcher import agent_binary

    return agent_binary()


def run(seconds: float, rate: int, agent_args: list[str]) -> dict[str, float]:
    from kernel_insight.agent.ring import Ring
    from kernel_insight.collector.keys import KeyStore

    tmp = Path(tempfile.mkdtemp(prefix="ki-bench-agent-"))
    ring_name = f"/ki_bench_agent.{os.getpid()}"
    with contextlib.suppress(OSError):
        Ring.unlink(ring_name)
    ring = Ring.create(ring_name, capacity=1 << 16)
    keys = KeyStore(tmp / "keys.json")
    keys.add_agent("bench").write_key_file(tmp / "agent.key")
    port = free_port()
    stats_path = tmp / "collector.json"
    me = [sys.executable, "-m", "bench.agent"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        collector = subprocess.Popen(
            [*me, "--collector-child", str(tmp / "data"), str(tmp / "keys.json"), str(port), str(stats_path)],
            cwd=REPO,
        )
        procs.append(collector)
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("collector did not start")
            time.sleep(0.2)
        agent = subprocess.Popen(
            [str(_agent_binary()), "--ring", ring_name, "--collector", f"http://127.0.0.1:{port}",
             "--key-file", str(tmp / "agent.key"), "--spool-dir", str(tmp / "spool"),
             "--histograms=0", *agent_args],  # record shipping is measured: every record
        )  # fmt: skip
        procs.append(agent)
        time.sleep(0.5)
        producer = subprocess.Popen(
            [*me, "--producer-child", ring_name, str(seconds), str(rate)], cwd=REPO, stdout=subprocess.PIPE
        )
        procs.append(producer)
        samples: list[tuple[float, int]] = []
        cpu0, t0 = _cpu_seconds(agent.pid), time.monotonic()
        while producer.poll() is None:
            samples.append((time.monotonic() - t0, _proc_status(agent.pid)["VmRSS"]))
            time.sleep(1.0)
        cpu1, t1 = _cpu_seconds(agent.pid), time.monotonic()
        status = _proc_status(agent.pid)
        out, _ = producer.communicate()
        produced = json.loads(out.decode().strip().splitlines()[-1])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError, ValueError):
                if json.loads(stats_path.read_text())["records"] >= produced["written"]:
                    break
            time.sleep(0.5)
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
        totals = json.loads(stats_path.read_text())
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(30)
        ring.close()
        with contextlib.suppress(OSError):
            Ring.unlink(ring_name)
    first = [r for t, r in samples if t < 10]
    last = [r for t, r in samples if t >= (t1 - t0) - 10]
    return {
        "rss_kb": status["VmRSS"],
        "hwm_kb": status["VmHWM"],
        "rss_anon_kb": status.get("RssAnon", 0),
        "rss_file_kb": status.get("RssFile", 0),
        "rss_shmem_kb": status.get("RssShmem", 0),
        "cpu_pct": 100.0 * (cpu1 - cpu0) / (t1 - t0),
        "wire_bytes_per_record": totals["frame_bytes"] / max(1, totals["records"]),
        "records": totals["records"],
        "written": produced["written"],
        "ring_dropped": produced["dropped"],
        "batches": totals["batches"],
        # Peak against peak: the first sample is taken while the agent is still starting up.
        "rss_growth_kb": max(last, default=0) - max(first, default=0),
        "rss_first10_max_kb": max(first, default=0),
        "rss_last10_max_kb": max(last, default=0),
        "rss_series_kb": [r for _, r in samples],
        "stored_in_time": totals["records"] >= produced["written"],
        "seconds": t1 - t0,
    }


def _spool_records(spool: Path) -> int:
    from kernel_insight.collector import wire

    total = 0
    for f in spool.glob("*.kib"):
        with contextlib.suppress(OSError, wire.WireError):
            total += wire.parse_header(f.read_bytes()[:-24]).record_count  # minus the spool trailer
    return total


def run_catchup(agents: int, rate: int, outage_s: float, warm_s: float = 5.0) -> dict[str, float]:
    """N agents at `rate` records/s each; the collector is stopped for outage_s, then restarted.

    Growth is timed from the stop to the restarted collector answering /healthz; drain from
    then until every agent's spool is back to its steady one or two batches.
    """
    from kernel_insight.agent.ring import Ring
    from kernel_insight.collector.clickhouse.store import EmbeddedStore
    from kernel_insight.collector.keys import KeyStore

    tmp = Path(tempfile.mkdtemp(prefix="ki-bench-catchup-"))
    names = [f"/ki_bench_catchup.{os.getpid()}.{i}" for i in range(agents)]
    rings = []
    for name in names:
        with contextlib.suppress(OSError):
            Ring.unlink(name)
        rings.append(Ring.create(name, capacity=1 << 16))
    keys = KeyStore(tmp / "keys.json")
    port = free_port()
    me = [sys.executable, "-m", "bench.agent"]
    collector_args = [
        *me,
        "--collector-child",
        str(tmp / "data"),
        str(tmp / "keys.json"),
        str(port),
        str(tmp / "c.json"),
    ]
    procs: list[subprocess.Popen[bytes]] = []
    producers: list[subprocess.Popen[bytes]] = []
    spools = [tmp / f"spool{i}" for i in range(agents)]

    def start_collector() -> subprocess.Popen[bytes]:
        c = subprocess.Popen(collector_args, cwd=REPO)
        procs.append(c)
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    return c
            if time.monotonic() > deadline:
                raise RuntimeError("collector did not start")
            time.sleep(0.1)

    try:
        collector = start_collector()
        for i in range(agents):
            keys.add_agent(f"gpu{i}").write_key_file(tmp / f"agent{i}.key")
            procs.append(
                subprocess.Popen(
                    [str(_agent_binary()), "--ring", names[i], "--collector", f"http://127.0.0.1:{port}",
                     "--key-file", str(tmp / f"agent{i}.key"), "--spool-dir", str(spools[i]),
                     "--backoff-max-ms", "1000", "--shutdown-timeout-s", "60", "--histograms=0"],
                    stderr=subprocess.DEVNULL,
                )
            )  # fmt: skip
        produce_s = warm_s + outage_s + 60
        for name in names:
            producers.append(
                subprocess.Popen(
                    [*me, "--producer-child", name, str(produce_s), str(rate)],
                    cwd=REPO,
                    stdout=subprocess.PIPE,
                )
            )
        time.sleep(warm_s)
        collector.terminate()
        collector.wait(60)
        stopped = time.monotonic()
        time.sleep(outage_s)
        collector = start_collector()
        back = time.monotonic()
        backlog = sum(_spool_records(s) for s in spools)
        while any(len(list(s.glob("*.kib"))) > 2 for s in spools):
            if time.monotonic() - back > 120:
                raise RuntimeError("the backlog did not drain in 120 s")
            time.sleep(0.05)
        drained = time.monotonic()
        written = dropped = 0
        for p in producers:
            out, _ = p.communicate()
            produced = json.loads(out.decode().strip().splitlines()[-1])
            written += produced["written"]
            dropped += produced["dropped"]
        for a in procs[1 : 1 + agents]:
            a.send_signal(signal.SIGTERM)
            a.wait(90)
        collector.terminate()
        collector.wait(60)
    finally:
        for p in [*producers, *procs]:
            if p.poll() is None:
                p.kill()
                p.wait()
        for r, name in zip(rings, names, strict=True):
            r.close()
            with contextlib.suppress(OSError):
                Ring.unlink(name)
    store = EmbeddedStore(tmp / "data")
    try:
        stored = store.query("SELECT count() AS n FROM ki.kernel_spans").to_pylist()[0]["n"]
    finally:
        store.close()
    grow_s, drain_s = back - stopped, drained - back
    return {
        "agents": agents,
        "records_per_s": agents * rate,
        "outage_s": outage_s,
        "backlog_records": backlog,
        "grow_s": grow_s,
        "drain_s": drain_s,
        "drain_x": grow_s / drain_s,
        "written": written,
        "ring_dropped": dropped,
        "lost": written - stored,
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.agent", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=int, default=100_000, help="KERNEL records per second")
    parser.add_argument(
        "--agent-arg", action="append", default=[], help="extra ki-agent argument (repeatable)"
    )
    parser.add_argument(
        "--catchup", action="store_true", help="collector outage: how fast the agents' backlog drains"
    )
    parser.add_argument("--agents", type=int, default=2, help="agents (with --catchup)")
    parser.add_argument(
        "--outage", type=float, default=30.0, help="seconds the collector is away (--catchup)"
    )
    parser.add_argument(
        "--producer-child", nargs=3, metavar=("RING", "SECONDS", "RATE"), help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--collector-child", nargs=4, metavar=("DATA", "KEYS", "PORT", "STATS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.producer_child:
        ring_name, secs, rate = args.producer_child
        _producer(ring_name, float(secs), int(rate))
        return 0
    if args.collector_child:
        data, keys, port, stats = args.collector_child
        stop = threading.Event()

        def on_term(signum: int, frame: FrameType | None) -> None:
            stop.set()
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, on_term)
        _collector(data, keys, int(port), stats)
        return 0
    if args.catchup:
        c = run_catchup(args.agents, args.rate, args.outage)
        print(json.dumps(c))
        print(
            f"BENCH catchup agents={c['agents']} records_per_s={c['records_per_s']} outage_s={c['outage_s']} "
            f"backlog_records={c['backlog_records']} grow_s={c['grow_s']:.1f} drain_s={c['drain_s']:.1f} "
            f"drain_x={c['drain_x']:.1f} lost={c['lost']} ring_dropped={c['ring_dropped']}"
        )
        return 0
    r = run(args.seconds, args.rate, args.agent_arg)
    print(json.dumps(r))
    fmt = {k: (round(v, 2) if isinstance(v, float) and math.isfinite(v) else v) for k, v in r.items()}
    print(
        f"BENCH agent rss_kb={fmt['rss_kb']} hwm_kb={fmt['hwm_kb']} cpu_pct={fmt['cpu_pct']} "
        f"wire_bytes_per_record={fmt['wire_bytes_per_record']} records={fmt['records']} "
        f"rss_growth_kb={fmt['rss_growth_kb']} ring_dropped={fmt['ring_dropped']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
