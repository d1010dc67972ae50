"""A simulated serving fleet with compute queues, in virtual time (docs/routing.md, "The queueing fleet").

Each instance is a continuous-batching engine in the manner of vLLM: a FCFS waiting queue;
admission while the batch has a free slot and the KV cache has room for the prompt; a prefill
that stalls the batch for the prompt's uncached tokens; decode steps whose time grows with the
batch; a KV cache that grows a token per running request per step, preempts the newest request
when full (recomputed later), and keeps finished requests' shared prefixes until their room is
needed (LRU). Time advances in fluid segments between events (an arrival, a completion, a full
cache), not step by step: the batch is constant inside a segment, so every running request has
made the same progress, held in one counter.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

#: Tokens per KV block (vLLM's default): the unit of the prefix index of the Inference Extension.
BLOCK_TOKENS = 16


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """An instance's engine: batch slots, KV cache and speed (``slow`` multiplies every time)."""

    kv_tokens: int
    max_seqs: int = 48
    step_base_ms: float = 10.0  # a decode step of an empty batch
    step_per_seq_ms: float = 0.35  # and per running request
    prefill_ms_per_token: float = 0.04
    slow: float = 1.0

    def step_ms(self, batch: int) -> float:
        return (self.step_base_ms + self.step_per_seq_ms * batch) * self.slow


@dataclass(slots=True)
class Request:
    """One request as the fleet sees it; the latencies are filled in as it runs."""

    id: int
    arrival_ms: float
    prefix_id: int  # requests of one prefix group share its first ``prefix_tokens`` tokens
    prefix_tokens: int
    prompt_tokens: int  # prefix included
    output_tokens: int
    client: int = 0
    first_token_ms: float = math.nan
    done_ms: float = math.nan
    attempts: int = 0
    failed_first: bool = False
    gave_up: bool = False
    retries: int = 0

    def blocks(self) -> list[tuple[int, int]]:
        """The prompt's KV block keys, chained as a prefix cache keys them: the shared prefix's
        blocks first (the same for the group), then the request's own."""
        shared = self.prefix_tokens // BLOCK_TOKENS
        total = self.prompt_tokens // BLOCK_TOKENS
        return [(-1 - self.prefix_id, k) for k in range(shared)] + [
            (self.id, k) for k in range(shared, total)
        ]


@dataclass(slots=True)
class _Running:
    req: Request
    start_prog: float  # the instance's progress counter when it joined the batch
    remaining: int  # output tokens to generate from start_prog
    private: int  # KV tokens of its own at start_prog (prompt beyond the shared prefix, tokens so far)
    prefix_id: int | None  # the shared prefix it holds a reference to
    seq: int


class Instance:
    """One engine. The fleet calls :meth:`submit`; :meth:`next_event` says when it needs a call."""

    def __init__(self, id: str, spec: EngineSpec) -> None:
        self.id = id
        self.spec = spec
        self.t = 0.0  # the state below is as of this time
        self.stall_until = 0.0  # prefill work queued ends then; decode pauses until then
        self.prog = 0.0  # decode tokens each running request has made since the start
        self.running: dict[int, _Running] = {}
        self.finish: list[tuple[float, int]] = []  # (prog at which it finishes, seq) of running
        self.waiting: list[tuple[Request, int]] = []  # (request, output tokens already made)
        self.sum_private = 0.0  # sum of (private - start_prog) over running: private KV = this + B x prog
        self.prefix_refs: dict[int, tuple[int, int]] = {}  # prefix id -> (references, tokens)
        self.cache: OrderedDict[int, int] = OrderedDict()  # unreferenced prefixes: id -> tokens (LRU)
        self.cached_tokens = 0
        self.ref_tokens = 0
        self.seq = itertools.count()
        self.version = 0
        self.prefix_hits = 0.0  # prompt tokens found cached (vllm:prefix_cache_hits_total)
        self.prefix_queries = 0.0
        self.preemptions = 0

    # -------------------------------------------------------------- figures (what metrics show)

    def kv_active(self) -> float:
        return self.sum_private + len(self.running) * self.prog + self.ref_tokens

    def kv_usage(self) -> float:
        return min(1.0, self.kv_active() / self.spec.kv_tokens)

    def metrics(self) -> dict[str, float]:
        """What the engine's /metrics would say now, by vLLM's names."""
        return {
            "vllm:num_requests_waiting": float(len(self.waiting)),
            "vllm:num_requests_running": float(len(self.running)),
            "vllm:kv_cache_usage_perc": self.kv_usage(),
            "vllm:prefix_cache_hits_total": self.prefix_hits,
            "vllm:prefix_cache_queries_total": self.prefix_queries,
        }

    # -------------------------------------------------------------- time

    def _rate(self) -> float:
        """Decode tokens per ms per running request."""
        return 1.0 / self.spec.step_ms(len(self.running))

    def advance(self, now: float) -> None:
        start = max(self.t, self.stall_until)
        if self.running and now > start:
            self.prog += (now - start) * self._rate()
        self.t = max(self.t, now)

    def next_event(self) -> float:
        """When a request finishes or the cache cannot take the next step, at the current batch;
        inf when idle."""
        if not self.running:
            return math.inf
        start = max(self.t, self.stall_until)
        rate = self._rate()
        batch = len(self.running)
        done = start + max(0.0, self.finish[0][0] - self.prog) / rate
        room = self.spec.kv_tokens - self.kv_active() - batch  # a step's tokens must fit
        full = start + max(0.0, room) / (batch * rate)
        return min(done, full)

    # -------------------------------------------------------------- requests

    def submit(self, req: Request, now: float) -> None:
        self.advance(now)
        self.waiting.append((req, 0))
        self._admit(now)

    def step(self, now: float, done: Callable[[Request, float], None]) -> None:
        """Handle what is due at ``now`` (completions, a full cache), then admit."""
        self.advance(now)
        eps = 1e-6
        while self.finish and self.finish[0][0] <= self.prog + eps:
            _, seq = heapq.heappop(self.finish)
            run = self.running.pop(seq)
            self.sum_private -= run.private - run.start_prog
            self._release_prefix(run.prefix_id)
            run.req.done_ms = now
            done(run.req, now)
        while self.cache and self.kv_active() + self.cached_tokens > self.spec.kv_tokens:
            self.cached_tokens -= self.cache.popitem(last=False)[1]
        while self.running and self.spec.kv_tokens - self.kv_active() < len(self.running) + eps:
            self._preempt()
        self._admit(now)

    def _preempt(self) -> None:
        """The newest running request gives its KV back and waits at the head of the queue; it is
        recomputed (prompt and tokens so far) when admitted again."""
        seq = max(self.running)
        run = self.running.pop(seq)
        self.finish = [(f, s) for f, s in self.finish if s != seq]
        heapq.heapify(self.finish)
        self.sum_private -= run.private - run.start_prog
        self._release_prefix(run.prefix_id)
        made = run.req.output_tokens - run.remaining + int(self.prog - run.start_prog)
        self.waiting.insert(0, (run.req, max(0, made)))
        self.preemptions += 1

    def _release_prefix(self, prefix_id: int | None) -> None:
        if prefix_id is None:
            return
        refs, tokens = self.prefix_refs[prefix_id]
        if refs > 1:
            self.prefix_refs[prefix_id] = (refs - 1, tokens)
            return
        del self.prefix_refs[prefix_id]
        self.ref_tokens -= tokens
        self.cache[prefix_id] = tokens
        self.cached_tokens += tokens

    def _room(self) -> float:
        return self.spec.kv_tokens - self.kv_active() - self.cached_tokens

    def _admit(self, now: float) -> None:
        spec = self.spec
        while self.waiting and len(self.running) < spec.max_seqs:
            req, made = self.waiting[0]
            pid = req.prefix_id if req.prefix_tokens > 0 else None
            resident = pid is not None and (pid in self.prefix_refs or pid in self.cache)
            shared = req.prefix_tokens if pid is not None else 0
            need = req.prompt_tokens - shared + made + (0 if resident else shared)
            # Room for its prompt and a block of growth for every running request and itself (as
            # vLLM allocates): each admission is worth at least a block of decoding before a
            # preemption, so admitting and preempting cannot chase each other without progress.
            # Evict unreferenced prefixes for it, least recently used first (never the one it needs).
            want = need + (len(self.running) + 1) * BLOCK_TOKENS
            while self._room() < want:
                victim = next((k for k in self.cache if k != pid), None)
                if victim is None:
                    break
                self.cached_tokens -= self.cache.pop(victim)
            if self._room() < want:
                break
            self.waiting.pop(0)
            self.prefix_queries += req.prompt_tokens
            if resident:
                self.prefix_hits += shared
            if pid is not None:
                if pid in self.cache:
                    self.cached_tokens -= self.cache.pop(pid)
                refs, _ = self.prefix_refs.get(pid, (0, shared))
                if refs == 0:
                    self.ref_tokens += shared
                self.prefix_refs[pid] = (refs + 1, shared)
            compute = req.prompt_tokens + made - (shared if resident else 0)
            self.advance(now)
            self.stall_until = max(self.stall_until, now) + compute * spec.prefill_ms_per_token * spec.slow
            if math.isnan(req.first_token_ms):
                req.first_token_ms = self.stall_until
            seq = next(self.seq)
            remaining = max(1, req.output_tokens - made)
            private = req.prompt_tokens - shared + made
            self.running[seq] = _Running(req, self.prog, remaining, private, pid, seq)
            self.sum_private += private - self.prog
            heapq.heappush(self.finish, (self.prog + remaining, seq))


@dataclass
class Fleet:
    """The instances and the event queue; strategies dispatch through :meth:`dispatch`."""

    instances: list[Instance]
    rng: random.Random
    nccl_timeout_ms: float = 2000.0
    nccl_bad: dict[str, Callable[[float], float]] = field(default_factory=dict)  # id -> P(timeout) at t
    events: list[tuple[float, int, int, object]] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.by_id = {i.id: i for i in self.instances}

    def at(self, t: float, kind: int, payload: object) -> None:
        heapq.heappush(self.events, (t, next(self._seq), kind, payload))

    def schedule(self, inst: Instance) -> None:
        inst.version += 1
        t = inst.next_event()
        if t < math.inf:
            self.at(t, 0, (inst, inst.version))

    def dispatch(
        self,
        inst_id: str,
        req: Request,
        now: float,
        done: Callable[[Request, float], None],
        failed: Callable[[Request, str, float], None],
    ) -> None:
        """Send ``req`` to an instance at ``now``: it fails with an NCCL timeout (``failed`` after the
        timeout) with the instance's probability, else it queues and ``done`` is called at its end."""
        req.attempts += 1
        p = self.nccl_bad.get(inst_id)
        if p is not None and self.rng.random() < p(now):
            self.at(now + self.nccl_timeout_ms, 1, (failed, req, inst_id))
            return
        inst = self.by_id[inst_id]
        self.done_callbacks[req.id] = done
        inst.submit(req, now)
        self.schedule(inst)

    def run(self, until: float, tick: Callable[[float], None] | None = None, tick_ms: float = 50.0) -> None:
        """Process events up to ``until``; ``tick(now)`` every ``tick_ms`` (metric refreshes, snapshots)."""
        next_tick = 0.0
        while self.events:
            t = self.events[0][0]
            if tick is not None and next_tick <= t and next_tick <= until:
                tick(next_tick)
                next_tick += tick_ms
                continue
            if t > until:
                break
            _, _, kind, payload = heapq.heappop(self.events)
            if kind == 0:
                inst, version = cast(tuple[Instance, int], payload)
                if version == inst.version:
                    inst.step(t, self._done_hook)
                    self.schedule(inst)
            elif kind == 1:
                cb, req, inst_id = cast(tuple[Callable[[Request, str, float], None], Request, str], payload)
                cb(req, inst_id, t)
            else:
                cast(Callable[[float], None], payload)(t)

    # Completion callbacks are stored on the request's client; the fleet calls this hook.
    done_callbacks: dict[int, Callable[[Request, float], None]] = field(default_factory=dict)

    def _done_hook(self, req: Request, now: float) -> None:
        cb = self.done_callbacks.pop(req.id, None)
        if cb is not None:
            cb(req, now)
