"""The strategies on the queueing fleet (fleet.py): today's static WRR, round robin, power of two
choices with perfect knowledge, the Gateway API Inference Extension's default scorer, and the SDK.

Every strategy meets the same fleet and the same requests (one seed). The SDK runs as it ships:
each of many clients has its own ``HealthClient`` (over an ``httpx.MockTransport`` serving the
snapshot the collector's own ``build_snapshot`` makes from the scraped metrics) and its own
``route`` decisions (the sans-I/O ``_Attempts``); only time is virtual.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from bench.routing.fleet import BLOCK_TOKENS, EngineSpec, Fleet, Instance, Request
from kernel_insight.api.health import HealthRule, InstanceFacts, Snapshot, build_snapshot
from kernel_insight.api.health.serving import combine
from kernel_insight.sdk import HealthClient, LoadPolicy, RouteFailed, RoutePolicy, classify, prefix_key
from kernel_insight.sdk._route import _Attempts

MODEL = "llama-70b"
GB = 1_000_000_000
EPOCH_MS = 1_800_000_000_000  # virtual time 0, as wall-clock ms (what the snapshot's timestamps say)
MAX_ATTEMPTS = 4


@dataclass(frozen=True, slots=True)
class Setup:
    """One fleet and workload (docs/routing.md, "The queueing fleet", has the table)."""

    fast: int = 24  # 80 GB-class instances
    slow: int = 8  # 40 GB-class: half the KV cache, 1.5x the step time
    kv_tokens_fast: int = 64_000
    nccl_degrading: int = 3  # instances whose NCCL collectives start timing out
    clients: int = 32
    prefix_groups: int = 64
    warmup_ms: float = 10_000.0
    measure_ms: float = 60_000.0
    drain_ms: float = 30_000.0
    scrape_ms: float = 250.0  # Prometheus scrapes the engines this often ...
    push_ms: float = 250.0  # ... and remote_write delivers a scrape this much later
    rebuild_ms: float = 250.0  # the collector's snapshot rebuild (--interval 0.25)
    client_ttl_s: float = 0.25  # each SDK client revalidates this often
    gie_refresh_ms: float = 50.0  # the Inference Extension's metrics refresh (its default)
    faults: bool = True


def make_fleet(setup: Setup, seed: int) -> Fleet:
    rng = random.Random(seed)
    insts = [Instance(f"gpu-{i:02d}", EngineSpec(setup.kv_tokens_fast)) for i in range(setup.fast)]
    insts += [
        Instance(f"gpu-{setup.fast + i:02d}", EngineSpec(setup.kv_tokens_fast // 2, slow=1.5))
        for i in range(setup.slow)
    ]
    rng.shuffle(insts)
    fleet = Fleet(insts, random.Random(seed + 1))
    if setup.faults:
        for inst in rng.sample(insts, setup.nccl_degrading):
            fleet.nccl_bad[inst.id] = lambda t: min(0.9, 0.05 * 1.6 ** (t / 10_000.0))
    return fleet


def make_requests(setup: Setup, rate_rps: float, seed: int) -> list[Request]:
    """Poisson arrivals; prompts share one of ``prefix_groups`` prefixes (Zipf-like popularity:
    system prompts, few-shot examples, conversations) then run on; outputs are long-tailed."""
    rng = random.Random(seed)
    groups = [(g, rng.randint(25, 75) * BLOCK_TOKENS) for g in range(setup.prefix_groups)]
    popularity = [1.0 / (g + 1) ** 0.9 for g in range(setup.prefix_groups)]
    out: list[Request] = []
    t = 0.0
    end = setup.warmup_ms + setup.measure_ms
    rid = 0
    while True:
        t += rng.expovariate(rate_rps / 1000.0)
        if t >= end:
            return out
        gid, plen = rng.choices(groups, popularity)[0]
        own = rng.randint(50, 400)
        output = int(min(800, max(16, rng.lognormvariate(math.log(120), 0.8))))
        out.append(Request(rid, t, gid, plen, plen + own, output, client=rng.randrange(setup.clients)))
        rid += 1


def prompt_text(req: Request) -> str:
    """What a client hashes for its prefix key: the first characters are the shared prefix's."""
    return f"system prompt {req.prefix_id} " * 40


# ------------------------------------------------------------------------------ results


@dataclass
class Result:
    strategy: str
    rate_rps: float
    ttft_ms: list[float] = field(default_factory=list)
    e2e_ms: list[float] = field(default_factory=list)
    requests: int = 0
    suitable: int = 0
    retries: int = 0
    gave_up: int = 0
    unfinished: int = 0
    prefix_hit: float = 0.0

    def quantile(self, q: float, values: Sequence[float] | None = None) -> float:
        vals = sorted(self.ttft_ms if values is None else values)
        censored = self.unfinished + self.gave_up
        n = len(vals) + censored
        if n == 0:
            return math.nan
        k = math.ceil(q * n) - 1
        return vals[k] if k < len(vals) else math.inf  # past the answered ones: unbounded

    @property
    def p99_ms(self) -> float:
        return self.quantile(0.99)

    @property
    def p50_ms(self) -> float:
        return self.quantile(0.5)

    @property
    def e2e_p99_ms(self) -> float:
        return self.quantile(0.99, self.e2e_ms)

    @property
    def suitable_pct(self) -> float:
        return 100.0 * self.suitable / max(1, self.requests)

    @property
    def retries_per_request(self) -> float:
        return self.retries / max(1, self.requests)


def collect(name: str, rate: float, setup: Setup, fleet: Fleet, reqs: list[Request]) -> Result:
    r = Result(name, rate)
    for q in reqs:
        if q.arrival_ms < setup.warmup_ms:
            continue
        r.requests += 1
        r.suitable += not q.failed_first
        r.retries += max(0, q.attempts - 1)
        if q.gave_up:
            r.gave_up += 1
        elif math.isnan(q.done_ms) or math.isnan(q.first_token_ms):
            r.unfinished += 1
        else:
            r.ttft_ms.append(q.first_token_ms - q.arrival_ms)
            r.e2e_ms.append(q.done_ms - q.arrival_ms)
    hits = sum(i.prefix_hits for i in fleet.instances)
    r.prefix_hit = hits / max(1.0, sum(i.prefix_queries for i in fleet.instances))
    return r


# ------------------------------------------------------------------------------ baselines


class Picker:
    """A router that decides from what it knows at ``now``; ``avoid``: instances this request failed on."""

    name = ""

    def pick(self, req: Request, now: float, avoid: set[str]) -> str:
        raise NotImplementedError

    def tick(self, now: float) -> None:
        """Called every 50 ms of virtual time (metric refreshes)."""


class Cyclic(Picker):
    """Round robin over a fixed order; static WRR is the same with weighted repeats in the order."""

    def __init__(self, name: str, order: list[str]) -> None:
        self.name, self.order, self.k = name, order, 0

    def pick(self, req: Request, now: float, avoid: set[str]) -> str:
        for _ in range(len(self.order)):
            inst = self.order[self.k % len(self.order)]
            self.k += 1
            if inst not in avoid:
                return inst
        return self.order[self.k % len(self.order)]


def wrr_order(fleet: Fleet, rng: random.Random) -> list[str]:
    """Today's static weighted round robin (the old baseline): weight = memory, 2 for 80 GB, 1 for 40 GB."""
    order = [i.id for k in range(2) for i in fleet.instances if k == 0 or i.spec.slow == 1.0]
    rng.shuffle(order)
    return order


class PowerOfTwo(Picker):
    """Two instances uniformly at random, the one with fewer requests (waiting + running) *now*:
    perfect, instant knowledge no real router has."""

    name = "p2c"

    def __init__(self, fleet: Fleet, rng: random.Random) -> None:
        self.fleet, self.rng = fleet, rng

    def pick(self, req: Request, now: float, avoid: set[str]) -> str:
        pool = [i for i in self.fleet.instances if i.id not in avoid] or self.fleet.instances
        a, b = self.rng.sample(pool, 2) if len(pool) > 1 else (pool[0], pool[0])
        return min((a, b), key=lambda i: len(i.waiting) + len(i.running)).id


class InferenceExtension(Picker):
    """The Gateway API Inference Extension's default endpoint picker, re-implemented from its source
    (kubernetes-sigs/gateway-api-inference-extension v1.5.0, the last release holding the endpoint
    picker: pkg/epp/config/loader/defaults.go and the plugins it names): score = 2 x queue-scorer +
    2 x kv-cache-utilization-scorer + 3 x prefix-cache-scorer, max-score-picker (ties broken at
    random). Queue: (max - waiting) / (max - min) over the candidates (1 when all
    equal); KV: 1 - usage; prefix: the share of the prompt's 16-token blocks, up to 256, that its
    approximate index (an LRU of the blocks it routed to each server, as many as the server has KV
    blocks) says the server holds, counting the longest matched run. Metrics are refreshed every
    50 ms (``--refresh-metrics-interval``); one picker sees every request (a central router)."""

    name = "gie"
    QUEUE_W, KV_W, PREFIX_W = 2.0, 2.0, 3.0
    MAX_BLOCKS = 256

    def __init__(self, fleet: Fleet, rng: random.Random) -> None:
        self.fleet, self.rng = fleet, rng
        self.seen: dict[str, tuple[int, float]] = {i.id: (0, 0.0) for i in fleet.instances}
        self.lru: dict[str, OrderedDict[tuple[int, int], None]] = {
            i.id: OrderedDict() for i in fleet.instances
        }
        self.where: dict[tuple[int, int], set[str]] = {}

    def tick(self, now: float) -> None:
        for i in self.fleet.instances:
            i.advance(now)
            self.seen[i.id] = (len(i.waiting), i.kv_usage())

    def pick(self, req: Request, now: float, avoid: set[str]) -> str:
        cands = [i.id for i in self.fleet.instances if i.id not in avoid] or [
            i.id for i in self.fleet.instances
        ]
        blocks = req.blocks()[: self.MAX_BLOCKS]
        match: dict[str, int] = {}
        for b in blocks:  # the longest prefix of blocks each server holds
            servers = self.where.get(b)
            if not servers:
                break
            for s in servers:
                match[s] = match.get(s, 0) + 1
        queues = [self.seen[c][0] for c in cands]
        lo, hi = min(queues), max(queues)
        best: list[str] = []
        top = -math.inf
        for c in cands:
            waiting, kv = self.seen[c]
            q = 1.0 if hi == lo else (hi - waiting) / (hi - lo)
            p = match.get(c, 0) / len(blocks) if blocks else 0.0
            score = self.QUEUE_W * q + self.KV_W * (1.0 - kv) + self.PREFIX_W * p
            if score > top + 1e-12:
                top, best = score, [c]
            elif abs(score - top) <= 1e-12:
                best.append(c)
        chosen = best[self.rng.randrange(len(best))]
        self._record(chosen, blocks)
        return chosen

    def _record(self, server: str, blocks: list[tuple[int, int]]) -> None:
        lru = self.lru[server]
        capacity = self.fleet.by_id[server].spec.kv_tokens // BLOCK_TOKENS  # autoTune: the server's blocks
        for b in blocks:
            if b in lru:
                lru.move_to_end(b)
            else:
                lru[b] = None
                self.where.setdefault(b, set()).add(server)
            while len(lru) > capacity:
                old, _ = lru.popitem(last=False)
                holders = self.where.get(old)
                if holders is not None:
                    holders.discard(server)
                    if not holders:
                        del self.where[old]


def run_picker(setup: Setup, picker_for: Callable[[Fleet], Picker], rate: float, seed: int) -> Result:
    fleet = make_fleet(setup, seed)
    picker = picker_for(fleet)
    reqs = make_requests(setup, rate, seed + 7)

    def done(req: Request, now: float) -> None:
        pass

    avoid: dict[int, set[str]] = {}

    def failed(req: Request, inst_id: str, now: float) -> None:
        if req.attempts == 1:
            req.failed_first = True
        if req.attempts >= MAX_ATTEMPTS:
            req.gave_up = True
            return
        tried = avoid.setdefault(req.id, set())
        tried.add(inst_id)
        fleet.dispatch(picker.pick(req, now, tried), req, now, done, failed)  # at once, elsewhere

    def arrive(req: Request) -> Callable[[float], None]:
        return lambda now: fleet.dispatch(picker.pick(req, now, set()), req, now, done, failed)

    for q in reqs:
        fleet.at(q.arrival_ms, 2, arrive(q))
    fleet.run(setup.warmup_ms + setup.measure_ms + setup.drain_ms, picker.tick, 50.0)
    return collect(picker.name, rate, setup, fleet, reqs)


# ------------------------------------------------------------------------------ the SDK


class Collector:
    """What the collector would serve: the engines' metrics as of the last scrape, the NCCL
    latencies, rebuilt into a snapshot (the server's own ``build_snapshot``) every ``rebuild_ms``."""

    def __init__(self, fleet: Fleet, setup: Setup) -> None:
        self.fleet, self.setup = fleet, setup
        self.scraped: dict[str, tuple[dict[str, float], int]] = {}
        self.pending: list[tuple[float, dict[str, tuple[dict[str, float], int]]]] = []
        self.body = b""
        self.etag = ""
        self.snap: Snapshot | None = None
        self.rng = random.Random(5)
        self.p99 = {i.id: self.rng.uniform(0.0008, 0.0013) for i in fleet.instances}

    def scrape(self, now: float) -> None:
        """A scrape at ``now``, stored ``push_ms`` later (remote_write's batching and the write)."""
        taken = {}
        for i in self.fleet.instances:
            i.advance(now)
            taken[i.id] = (i.metrics(), int(EPOCH_MS + now))
        self.pending.append((now + self.setup.push_ms, taken))

    def rebuild(self, now: float) -> None:
        while self.pending and self.pending[0][0] <= now:
            self.scraped.update(self.pending.pop(0)[1])
        if not self.scraped:
            return
        facts = []
        for i in self.fleet.instances:
            metrics, at = self.scraped[i.id]
            bad = self.fleet.nccl_bad.get(i.id)
            p99 = self.p99[i.id] if bad is None else 0.001 * (1 + 40 * bad(now))
            total = 80 * GB if i.spec.slow == 1.0 else 40 * GB
            facts.append(
                InstanceFacts(
                    id=i.id,
                    last_seen_ms=at,
                    labels={"model": MODEL},
                    gpu_memory_free_bytes=0.1 * total,  # vLLM holds 90 % (gpu_memory_utilization)
                    gpu_memory_total_bytes=float(total),
                    nccl_latencies=[p99 * (0.5 if k % 10 else 1.0) for k in range(20)],
                    serving=combine((name, v, at) for name, v in metrics.items()),
                )
            )
        self.snap = build_snapshot(facts, HealthRule(), int(EPOCH_MS + now), self.snap)
        self.body, self.etag = self.snap.body, self.snap.etag

    def handler(self, request: httpx.Request) -> httpx.Response:
        if not self.body:  # nothing scraped yet: what the server says before its first snapshot
            return httpx.Response(
                503, json={"status": "error", "errorType": "unavailable", "error": "no snapshot"}
            )
        if request.headers.get("if-none-match") == self.etag:
            return httpx.Response(304, headers={"ETag": self.etag})
        return httpx.Response(200, content=self.body, headers={"ETag": self.etag})


class NcclTimeout(Exception):
    def __init__(self) -> None:
        super().__init__("NCCL watchdog: collective operation timed out")


def run_sdk(
    setup: Setup, rate: float, seed: int, *, affinity: bool = True, policy: LoadPolicy | None = None
) -> Result:
    fleet = make_fleet(setup, seed)
    reqs = make_requests(setup, rate, seed + 7)
    server = Collector(fleet, setup)
    now_ms = [0.0]
    transport = httpx.MockTransport(server.handler)
    clients = [
        HealthClient(
            "http://collector",
            ttl=setup.client_ttl_s,
            transport=transport,
            clock=lambda: now_ms[0] / 1000.0,
            wall_clock=lambda: (EPOCH_MS + now_ms[0]) / 1000.0,
            random=random.Random(seed * 1000 + c).random,
            load_policy=policy,
        )
        for c in range(setup.clients)
    ]
    route_policy = RoutePolicy(max_attempts=MAX_ATTEMPTS)
    next_scrape, next_rebuild = [0.0], [0.0]

    def tick(now: float) -> None:
        now_ms[0] = now
        if now >= next_scrape[0]:
            server.scrape(now)
            next_scrape[0] += setup.scrape_ms
        if now >= next_rebuild[0]:
            server.rebuild(now)
            next_rebuild[0] += setup.rebuild_ms

    def attempt(req: Request, state: _Attempts, now: float) -> None:
        now_ms[0] = now
        health = clients[req.client]
        key = prefix_key(prompt_text(req)) if affinity else None
        try:
            inst = health.select_instance(state.required, MODEL, avoid=state.avoid, prefix_key=key)
        except Exception:  # NoEligibleInstance: nothing left to try
            req.gave_up = True
            return
        ticket = health.begin(inst.id)

        def done(r: Request, t: float) -> None:
            health.end(inst.id, ticket)

        def failed(r: Request, inst_id: str, t: float) -> None:
            now_ms[0] = t
            health.end(inst.id, ticket)
            if r.attempts == 1:
                r.failed_first = True
            try:
                delay = state.settle(
                    inst, None, NcclTimeout(), (t - now) / 1000, classify, health.exclude, None
                )
            except RouteFailed:
                r.gave_up = True
                return
            fleet.at(t + max(0.0, delay) * 1000.0, 2, lambda t2: attempt(r, state, t2))

        fleet.dispatch(inst.id, req, now, done, failed)

    for q in reqs:
        fleet.at(q.arrival_ms, 2, lambda now, q=q: attempt(q, _Attempts(route_policy, 0), now))
    fleet.run(setup.warmup_ms + setup.measure_ms + setup.drain_ms, tick, 50.0)
    for c in clients:
        c.close()
    return collect("sdk" if affinity else "sdk-noaffinity", rate, setup, fleet, reqs)


STRATEGIES: dict[str, Callable[[Setup, float, int], Result]] = {
    "wrr": lambda s, r, seed: run_picker(
        s, lambda f: Cyclic("wrr", wrr_order(f, random.Random(seed))), r, seed
    ),
    "rr": lambda s, r, seed: run_picker(s, lambda f: Cyclic("rr", [i.id for i in f.instances]), r, seed),
    "p2c": lambda s, r, seed: run_picker(s, lambda f: PowerOfTwo(f, random.Random(seed + 3)), r, seed),
    "gie": lambda s, r, seed: run_picker(
        s, lambda f: InferenceExtension(f, random.Random(seed + 4)), r, seed
    ),
    "sdk": run_sdk,
}
