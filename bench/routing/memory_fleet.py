"""The memory fleet: the SDK's failure-aware routing against static weighted round robin on a fleet
without compute queues (docs/routing.md, "The memory fleet"); part of ``make bench-routing``.

A real ``ki collector`` (local-dev, 127.0.0.1) is fed the fleet's state by remote_write every
epoch (free and total memory, NCCL latency samples, placement and ``model`` labels as series
labels); the real SDK (``HealthClient`` + ``route``) reads the real snapshot. Requests run in
virtual time: the fleet decides each attempt's outcome (success, OOM, deadline, NCCL timeout)
and its latency, and the SDK's backoff sleeps are added to the request's virtual latency.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kernel_insight.collector.remote_write import encode_write_request
from kernel_insight.sdk import (
    HealthClient,
    Instance,
    ModelSpec,
    NoEligibleInstance,
    RouteFailed,
    RoutePolicy,
    route,
)

GB = 1_000_000_000
GiB = 1 << 30
MODEL = "llama-70b"
#: Llama-3-8B-like shape, bf16: 128 KiB of KV cache a token.
SPEC = ModelSpec("llama-70b", 8_000_000_000, 32, 4096, 32, 8, "bfloat16")
MAX_ATTEMPTS = 4
TIMEOUT_MS = 1000.0  # a deadline failure costs this
NCCL_TIMEOUT_MS = 2000.0
OOM_MS = 40.0  # allocation fails fast
#: What the SDK's caller asks for beyond the estimate: free memory is not all usable in one
#: allocation (fragmentation), and the snapshot is up to an epoch old.
HEADROOM = 1.15


@dataclass
class Gpu:
    id: str
    total: int
    rack: str
    host: str
    switch: str
    free: float = 0.0  # what NVML reports (what the snapshot says)
    frag: float = 1.0  # the share of free memory usable in one allocation
    nccl_bad: float = 0.0  # probability that a request hits an NCCL timeout (degrading links)
    p99_s: float = 0.001
    held: list[tuple[float, float]] = field(default_factory=list)  # (until_ms, bytes) of running requests

    def usable(self, now_ms: float) -> float:
        self.held = [(u, b) for u, b in self.held if u > now_ms]
        return max(0.0, self.free - sum(b for _, b in self.held)) * self.frag


def make_fleet(rng: random.Random, n: int) -> list[Gpu]:
    fleet = []
    for i in range(n):
        total = 80 * GB if rng.random() < 0.5 else 40 * GB
        rack = i // 8
        fleet.append(Gpu(f"gpu-{i:02d}", total, f"r{rack}", f"h{i // 2}", f"s{rack // 2}"))
    for g in rng.sample(fleet, 4):  # degrading NCCL links
        g.nccl_bad = 0.05
    return fleet


def evolve(fleet: list[Gpu], rng: random.Random, epoch: int) -> None:
    """New memory use (weights + other tenants' caches), fragmentation, NCCL degradation."""
    for g in fleet:
        weights = 16 * GB  # the served model's weights
        other = rng.uniform(0.4, 0.97) * (g.total - weights)
        g.free = g.total - weights - other
        g.frag = rng.uniform(0.8, 1.0) if rng.random() < 0.7 else rng.uniform(0.55, 0.8)
        if g.nccl_bad:
            g.nccl_bad = min(0.9, g.nccl_bad * 1.6)
            g.p99_s = 0.001 * (1 + 40 * g.nccl_bad)
        else:
            g.p99_s = rng.uniform(0.0008, 0.0013)


def push(client: httpx.Client, url: str, fleet: list[Gpu], now_ms: int) -> None:
    series = []
    for g in fleet:
        labels = {
            "instance": g.id,
            "gpu": "0",
            "model": MODEL,
            "rack": g.rack,
            "host": g.host,
            "switch": g.switch,
        }
        series.append(({**labels, "__name__": "gpu_memory_free_bytes"}, [(now_ms, g.free)]))
        series.append(({**labels, "__name__": "gpu_memory_total_bytes"}, [(now_ms, float(g.total))]))
        lat = [(now_ms - 10 * k, g.p99_s * (0.5 if k % 10 else 1.0)) for k in range(20)]
        series.append(({**labels, "__name__": "nccl_op_latency_seconds", "op": "allreduce"}, lat))
    r = client.post(
        url + "/api/v1/write",
        content=encode_write_request(series),
        headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"},
    )
    r.raise_for_status()


def requests_for(rng: random.Random, n: int) -> list[tuple[int, int, int]]:
    """(max_tokens, batch, prompt_tokens): mostly short chats, bursts of long generations."""
    out = []
    burst = 0
    for _ in range(n):
        if burst == 0 and rng.random() < 0.03:
            burst = rng.randint(10, 30)
        if burst:
            burst -= 1
            out.append((rng.choice((16_000, 32_000, 64_000)), rng.choice((1, 2, 4)), rng.randint(500, 4000)))
        else:
            out.append(
                (rng.choice((256, 512, 1024, 2048, 4096)), rng.choice((1, 2, 4, 8)), rng.randint(50, 2000))
            )
    return out


class Outcome(Exception):
    pass


class Oom(Outcome):
    def __init__(self) -> None:
        super().__init__("CUDA error: out of memory")


class Deadline(TimeoutError):
    pass


class NcclTimeout(Outcome):
    def __init__(self) -> None:
        super().__init__("NCCL watchdog: collective operation timed out")


class World:
    """Decides attempts in virtual time; keeps the figures of one strategy."""

    def __init__(self, fleet: dict[str, Gpu], seed: int) -> None:
        self.fleet = fleet
        self.rng = random.Random(seed)
        self.now_ms = 0.0
        self.elapsed = 0.0  # of the current request
        self.first = True
        self.suitable = 0
        self.servable = 0
        self.attempts = 0
        self.ooms = 0
        self.latencies: list[float] = []
        self.failed = 0
        self.retries = 0
        self.at_start = 0

    def attempt(self, gid: str, need: float, tokens: int) -> str:
        g = self.fleet[gid]
        ok = need <= g.usable(self.now_ms + self.elapsed)
        nccl = self.rng.random() < g.nccl_bad
        if self.first:
            self.suitable += ok and not nccl
            self.first = False
        self.attempts += 1
        if nccl:
            self.elapsed += NCCL_TIMEOUT_MS
            raise NcclTimeout()
        if not ok:
            self.ooms += 1
            self.elapsed += OOM_MS
            raise Oom()
        if self.rng.random() < 0.01:
            self.elapsed += TIMEOUT_MS
            raise Deadline("deadline exceeded")
        service = 30 + tokens * 0.01 * (1.3 if g.total < 60 * GB else 1.0)
        g.held.append((self.now_ms + self.elapsed + service, need))
        self.elapsed += service
        return gid

    def start(self, now_ms: float, need: float) -> None:
        """A new request; counted in ``servable`` when some instance could serve it now."""
        self.now_ms, self.elapsed, self.first = now_ms, 0.0, True
        self.at_start = self.attempts
        self.servable += any(need <= g.usable(now_ms) and g.nccl_bad < 0.5 for g in self.fleet.values())

    def sleep(self, s: float) -> None:
        self.elapsed += s * 1000

    def finish(self, ok: bool) -> None:
        self.latencies.append(self.elapsed)
        self.failed += not ok
        self.retries += max(0, self.attempts - self.at_start - 1)


def baseline(world: World, order: list[str], reqs: list[tuple[int, int, int]], arrivals: list[float]) -> None:
    """Static weighted round robin (weight = memory total), retry on the next one, backoff on every failure."""
    k = 0
    for (max_tokens, batch, prompt), t in zip(reqs, arrivals, strict=True):
        need = SPEC.required_free_bytes(max_tokens, batch, prompt)
        world.start(t, need)
        ok = False
        for attempt in range(MAX_ATTEMPTS):
            gid = order[k % len(order)]
            k += 1
            try:
                world.attempt(gid, need, max_tokens)
                ok = True
                break
            except (Outcome, TimeoutError):
                if attempt < MAX_ATTEMPTS - 1:
                    world.sleep(0.1 * 2**attempt)
        world.finish(ok)


def with_sdk(
    world: World, health: HealthClient, reqs: list[tuple[int, int, int]], arrivals: list[float], i0: int
) -> None:
    policy = RoutePolicy(max_attempts=MAX_ATTEMPTS)
    for i, ((max_tokens, batch, prompt), t) in enumerate(zip(reqs, arrivals, strict=True)):
        need = SPEC.required_free_bytes(max_tokens, batch, prompt)
        world.start(t, need)
        ok = False

        def call(inst: Instance, need: float = need, mt: int = max_tokens) -> str:
            return world.attempt(inst.id, need, mt)

        try:
            route(
                health,
                call,
                required_free_bytes=int(need * HEADROOM),
                model=MODEL,
                prefer={"rack": f"r{(i0 + i) % 5}"},
                policy=policy,
                sleep=world.sleep,
            )
            ok = True
        except (RouteFailed, NoEligibleInstance):
            pass
        world.finish(ok)


@contextlib.contextmanager
def collector(tmp: Path, interval_s: float = 0.3) -> Iterator[str]:
    """A local-dev ``ki collector`` on 127.0.0.1 over an embedded store in ``tmp``; yields its URL."""
    cmd = [sys.executable, "-m", "kernel_insight.cli", "collector", "--local-dev", "--port", "0",
           "--store", str(tmp / "data"), "--keys", str(tmp / "keys.json"), "--interval", str(interval_s)]  # fmt: skip
    err = (tmp / "collector.err").open("w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on" not in line:
            raise SystemExit(
                f"collector did not start: {line!r} {(tmp / 'collector.err').read_text()[-2000:]}"
            )
        url = line.split("listening on ", 1)[1].strip()
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit("collector did not answer /healthz")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        err.close()


def wait_for(health: HealthClient, fleet: list[Gpu]) -> None:
    """Until the snapshot shows this epoch's free memory for every instance."""
    want = {g.id: int(g.free) for g in fleet}
    deadline = time.monotonic() + 60
    while True:
        snap = health.snapshot()
        got = {i.id: i.gpu_memory_free_bytes for i in snap.instances}
        if all(got.get(k) is not None and abs(got[k] - v) <= 1 for k, v in want.items()):  # type: ignore[operator]
            return
        if time.monotonic() > deadline:
            raise SystemExit("the snapshot did not catch up with the fleet within 60 s")
        time.sleep(0.05)


def run(instances: int = 40, epochs: int = 8, requests: int = 400, seed: int = 18) -> dict[str, float]:
    """One run; the figures keyed as the BENCH line has them (``old_`` prefixed by the caller)."""
    args = argparse.Namespace(instances=instances, epochs=epochs, requests=requests, seed=seed)
    rng = random.Random(args.seed)
    fleet = make_fleet(rng, args.instances)
    by_id = {g.id: g for g in fleet}
    # The baseline's static order: each instance weight(= memory total / 40 GB) times, interleaved.
    order = [g.id for k in range(2) for g in fleet if g.total >= (k + 1) * 40 * GB]
    rng.shuffle(order)
    sdk_world, base_world = World(by_id, args.seed + 1), World(by_id, args.seed + 1)
    seeded = random.Random(args.seed + 2).random  # the SDK's weighted draws, reproducible
    with (
        tempfile.TemporaryDirectory(prefix="ki-bench-routing-") as tmp,
        collector(Path(tmp)) as url,
        httpx.Client(timeout=30) as writer,
        HealthClient(url, ttl=0.05, random=seeded) as health,
    ):
        t0 = time.time()
        for epoch in range(args.epochs):
            evolve(fleet, rng, epoch)
            push(writer, url, fleet, int(time.time() * 1000))
            wait_for(health, fleet)
            reqs = requests_for(rng, args.requests)
            start = epoch * 60_000.0
            arrivals = [start + k * 60_000.0 / args.requests for k in range(args.requests)]
            saved = {g.id: list(g.held) for g in fleet}
            with_sdk(sdk_world, health, reqs, arrivals, epoch * args.requests)
            for g in fleet:  # the baseline meets the same fleet, not the SDK's leftovers
                g.held = saved[g.id]
            baseline(base_world, order, reqs, arrivals)
            for g in fleet:
                g.held = []
        wall = time.time() - t0
    n = args.epochs * args.requests

    def figures(w: World) -> tuple[float, float, float, float, float]:
        lat = sorted(w.latencies)
        return (
            100.0 * w.suitable / max(1, w.servable),
            w.retries / n,
            statistics.median(lat),
            lat[int(0.99 * (len(lat) - 1))],
            100.0 * w.failed / n,
        )

    s, b = figures(sdk_world), figures(base_world)
    print(
        f"memory fleet: {args.instances} instances ({sum(g.total >= 80 * GB for g in fleet)} x 80 GB), "
        f"{args.epochs} epochs x {args.requests} requests, seed {args.seed}; wall {wall:.1f} s",
        file=sys.stderr,
    )
    return {
        "suitable_pct": round(s[0], 1),
        "baseline_suitable_pct": round(b[0], 1),
        "retries_per_request": round(s[1], 3),
        "baseline_retries": round(b[1], 3),
        "p99_ms": round(s[3]),
        "baseline_p99_ms": round(b[3]),
        "p50_ms": round(s[2]),
        "baseline_p50_ms": round(b[2]),
        "oom_per_request": round(sdk_world.ooms / n, 3),
        "baseline_oom_per_request": round(base_world.ooms / n, 3),
        "failed_pct": round(s[4], 2),
        "baseline_failed_pct": round(b[4], 2),
    }
