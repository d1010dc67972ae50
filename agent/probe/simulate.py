"""A stand-in for GPUs on machines without one: realistic records, every one flagged SIMULATED.

The model is data-parallel training: each simulated GPU runs the same
transformer step (forward and backward kernels per layer, gradient all-reduce
buckets overlapping the backward pass, an optimizer, a stream synchronise),
with long-tailed kernel durations, activation memory that grows and is
released every step, a cache that creeps up and is given back before it runs
out, rare out-of-memory episodes (a burst of failed allocations), checkpoint pauses, and NVML samples (utilisation, power, temperature, clocks,
throttling, NVLink) that follow the load.  Every record carries
``RecordFlag.SIMULATED`` so it can never pass for real data.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kernel_insight.agent.dcgm import dcgm_id, dcgm_samples, host_name
from kernel_insight.agent.metric_ids import MetricId
from kernel_insight.agent.records import (
    CollectiveOp,
    ErrorKind,
    FingerprintField,
    MemopKind,
    RecordFlag,
    SyncKind,
)
from kernel_insight.agent.ring import Ring

__all__ = ["KERNELS", "SimConfig", "Simulator"]

_MIB = 1 << 20
_GIB = 1 << 30
_US = 1_000
_S = 1_000_000_000
CUDA_ERROR_OUT_OF_MEMORY = 2


#: The longest a straggler runs, as a multiple of its ordinary duration. Real stragglers (a clock
#: drop, a neighbour's memory traffic, a preempted SM) take a few times as long, not hundreds of
#: times: an unbounded Pareto tail gave the GEMM maxima hundreds of times its median.
STRAGGLER_MAX = 6.0


def straggler_factor(rng: random.Random, alpha: float, high: float = STRAGGLER_MAX) -> float:
    """How many times longer a straggler runs: 1 + a Pareto(``alpha``) draw bounded to
    [1, ``high`` - 1] (the bounded Pareto law's inverse CDF), so between 2 and ``high`` times,
    heavy-tailed up to the bound with no pile of draws at it as a clipped law would have."""
    u = rng.random()
    return 1.0 + float((1.0 - u * (1.0 - (high - 1.0) ** -alpha)) ** (-1.0 / alpha))


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """A kernel's duration law: lognormal around ``median_us`` with a Pareto straggler tail."""

    name: str
    median_us: float
    sigma: float = 0.08
    grid: tuple[int, int, int] = (132, 1, 1)
    block: tuple[int, int, int] = (256, 1, 1)


_GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"
_GEMM_NN = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
_LN = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
_ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>"

#: Kernels of one layer's forward and backward pass, and of the optimizer.
KERNELS: dict[str, list[KernelSpec]] = {
    "forward": [
        KernelSpec(_LN, 60, 0.05),
        KernelSpec(_GEMM, 900),
        KernelSpec(
            "flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>",
            1400,
            0.12,
        ),
        KernelSpec(_GEMM, 300),
        KernelSpec(_ADD, 40, 0.05),
        KernelSpec(_LN, 60, 0.05),
        KernelSpec(_GEMM, 1200),
        KernelSpec(
            "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", 150, 0.05
        ),
        KernelSpec(_GEMM, 1200),
        KernelSpec(_ADD, 40, 0.05),
    ],
    "backward": [
        KernelSpec(_GEMM_NN, 1200),
        KernelSpec(_GEMM, 1200),
        KernelSpec(
            "void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackwardCUDAKernelImpl>",
            200,
            0.05,
        ),
        KernelSpec(_GEMM_NN, 1200),
        KernelSpec(_GEMM, 1200),
        KernelSpec(
            "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel<c10::BFloat16, float>", 120
        ),
        KernelSpec(_GEMM_NN, 300),
        KernelSpec(_GEMM, 300),
        KernelSpec(
            "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8>>",
            3000,
            0.15,
        ),
        KernelSpec(_GEMM_NN, 900),
        KernelSpec(_GEMM, 900),
        KernelSpec(
            "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel<c10::BFloat16, float>", 120
        ),
        KernelSpec(
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t>>",
            80,
        ),
    ],
    "optimizer": [
        KernelSpec(
            "void at::native::multi_tensor_apply_kernel<at::native::FusedAdamMathFunctor<float, 4>>", 2500
        ),
        KernelSpec("void at::native::multi_tensor_apply_kernel<at::native::L2NormFunctor<float, 1>>", 400),
    ],
}
_ALLREDUCE_KERNEL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"

#: XID codes drawn by the simulator, with the text the driver logs for them.
XIDS: dict[int, str] = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    48: "Double Bit ECC Error",
    63: "ECC page retirement or row remapping recording event",
    74: "NVLink Error",
    79: "GPU has fallen off the bus",
    94: "Contained ECC error",
    119: "GSP RPC timeout",
}


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Knobs of the simulated job; the defaults give about 2.5 steps/s and ~700 kernels/s per GPU."""

    gpus: int = 1
    seed: int = 0
    layers: int = 12
    time_scale: float = 2.0  # multiplies every kernel duration
    launch_sample: int = 16  # one LAUNCH record per this many launches (0: none)
    #: The loop reads its loss (a stream sync) once per this many steps, as training loops that
    #: log every N steps do; in between the host runs ahead of the GPU...
    sync_every_steps: int = 10
    #: ...until this many launches are pending, when a launch blocks until one is done (CUDA's
    #: pending-launch queue). A sync then waits for the queued work only, not for every step.
    launch_queue: int = 1024
    error_rate: float = 1 / 600  # random xid / nccl_timeout errors per GPU per second
    fingerprint_every_s: float = 60.0
    memory_total: int = 80 * _GIB
    #: The GPU's product name (the ``gpu_product`` label); the served model is an instance label
    #: given at enrolment (``ki keys add-agent NAME --label model=...``), not something a GPU reports.
    gpu_product: str = "NVIDIA H100 80GB HBM3"
    static_memory: int = 28 * _GIB  # weights, gradients, optimizer state
    activation_bytes: int = 1536 * _MIB  # per layer, allocated in forward, freed in backward
    growth_every_steps: int = 25  # the allocator cache grows by growth_bytes this often...
    growth_bytes: int = 2 * _GIB  # ...until the next growth would not fit, when it is given back
    #: Out-of-memory episodes (a batch whose activations do not fit): on average one per GPU this
    #: often (exponential gaps; math.inf: none), each oom_episode_s long, every step's
    #: allocation failing in it. Real jobs fail allocations rarely and in bursts, not steadily.
    oom_every_s: float = 3600.0
    oom_episode_s: float = 20.0
    first_oom_s: float | None = None  # when the first episode begins (None: drawn like the others)
    idle_every_steps: int = 120  # a checkpoint pause this often...
    idle_s: float = 4.0  # ...this long, with no kernels
    nvlink_links: int = 18
    power_limit_w: float = 700.0
    model_bytes: int = 14 * _GIB  # gradient bytes all-reduced per step
    buckets: int = 4
    slow_kernel: str = ""  # while Simulator.slow is set, kernels whose name contains this...
    slow_factor: float = 100.0  # ...run this many times longer (a regression to alert on)
    dcgm_names: bool = True  # also write dcgm-exporter's series, as the NVML sampler does (agent/dcgm.py)

    def __post_init__(self) -> None:
        checks = [
            (1 <= self.gpus <= 1024, "gpus must be in 1..1024"),
            (self.layers >= 1, "layers must be at least 1"),
            (self.time_scale > 0, "time_scale must be positive"),
            (self.launch_sample >= 0, "launch_sample must be 0 or more"),
            (
                self.sync_every_steps >= 1 and self.launch_queue >= 1,
                "sync_every_steps and launch_queue must be at least 1",
            ),
            (0 <= self.error_rate <= 1, "error_rate must be in 0..1 (errors per GPU per second)"),
            (self.fingerprint_every_s > 0, "fingerprint_every_s must be positive"),
            (self.static_memory < self.memory_total, "static_memory must be below memory_total"),
            (self.growth_every_steps >= 1 and self.idle_every_steps >= 1, "step periods must be at least 1"),
            (
                self.oom_every_s > 0 and self.oom_episode_s > 0,
                "oom_every_s and oom_episode_s must be positive",
            ),
            (self.first_oom_s is None or self.first_oom_s >= 0, "first_oom_s must be 0 or more"),
            (self.buckets >= 1 and self.nvlink_links >= 0, "buckets must be >= 1, nvlink_links >= 0"),
            (self.slow_factor > 0, "slow_factor must be positive"),
            (0 < len(self.gpu_product) <= 100, "gpu_product must be 1-100 characters"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"simulator: {message}")

    def compressed(self, factor: float) -> SimConfig:
        """The same job with its rare events ``factor`` times as often, to see every one of them in
        minutes (``ki probe simulate --compress``, ``ki run --compress``; tests, demos): FINGERPRINTs,
        random errors, OOM episodes (and their length; the first one begins 360 s / ``factor`` in
        unless ``first_oom_s`` says otherwise) and checkpoint pauses (and their length). Kernels,
        steps, memory and NVML samples keep their real pace (docs/probes.md)."""
        if not 1 <= factor <= 3600:
            raise ValueError(f"simulator: compress must be in 1..3600, got {factor}")
        return dataclasses.replace(
            self,
            fingerprint_every_s=self.fingerprint_every_s / factor,
            error_rate=min(1.0, self.error_rate * factor),
            oom_every_s=self.oom_every_s / factor,
            oom_episode_s=self.oom_episode_s / factor,
            first_oom_s=360 / factor if self.first_oom_s is None else self.first_oom_s,
            idle_every_steps=max(1, round(self.idle_every_steps / factor)),
            idle_s=self.idle_s / factor,
        )


@dataclass(slots=True)
class _Gpu:
    index: int
    ring: Ring
    rng: random.Random
    pid: int
    heap: list[tuple[int, int, Callable[[], int]]] = field(default_factory=list)
    busy: list[tuple[int, int]] = field(default_factory=list)  # device intervals, for utilisation
    pending: list[int] = field(default_factory=list)  # heap: device ends of launched kernels (the queue)
    compute_free: int = 0
    comm_free: int = 0
    next_addr: int = 0x7F00_0000_0000
    cache: list[tuple[int, int]] = field(default_factory=list)  # (address, bytes) of the growing cache
    outstanding: int = 0
    nvlink_bytes: int = 0  # all-reduce bytes moved since the last sample
    nvlink_total: list[int] = field(default_factory=list)
    energy_j: float = 0.0
    temperature: float = 34.0
    slowdown: float = 1.0
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    last_xid: int = 0  # the last simulated Xid (DCGM_FI_DEV_XID_ERRORS)
    oom_rng: random.Random = field(default_factory=random.Random)  # episodes' own draws (see _in_oom)
    oom_from: float = math.inf  # the current or next OOM episode: [oom_from, oom_until) ns
    oom_until: float = math.inf
    next_sample: int = 0
    next_fingerprint: int = 0
    correlation: int = 0
    launches: int = 0
    written: int = 0  # records the ring took (STRING chunks not counted)
    failed: int = 0  # records it refused (full or lost)

    def put(self, status: int) -> None:
        """Count one write's status (0, or the ring's DROPPED/LOST)."""
        if status == 0:
            self.written += 1
        else:
            self.failed += 1


class Simulator:
    """Generates records for ``config.gpus`` GPUs up to a moving "now" into one ring handle per GPU.

    Time is the caller's: ``advance_to(now_ns)`` emits every record stamped at
    or before ``now_ns`` (CLOCK_REALTIME nanoseconds), so tests drive it with a
    synthetic clock and ``run`` drives it with the wall clock.  The simulator
    sets SIMULATED in each handle's ``flags``, so the ring itself marks every
    record it writes through them, names included.  STRING records carry the
    ring's clock, not the simulated one.

    Example::

        rings = [Ring.attach(ring_name(i), create=True) for i in range(2)]
        sim = Simulator(SimConfig(gpus=2), rings)
        sim.run(seconds=10)
    """

    def __init__(self, config: SimConfig, rings: Sequence[Ring], start_ns: int | None = None) -> None:
        if len(rings) != config.gpus:
            raise ValueError(f"simulator: {config.gpus} GPUs need {config.gpus} rings, got {len(rings)}")
        for ring in rings:
            if ring.producer_id == 0:
                raise ValueError(f"simulator: ring {ring.name} was attached without producer=True")
            ring.flags |= RecordFlag.SIMULATED
        self.config = config
        #: Whether ``config.slow_kernel`` runs ``slow_factor`` times longer now (``run(slow_when=...)``).
        self.slow = False
        self.start_ns = time.time_ns() if start_ns is None else start_ns
        self._seq = 0
        self._step = 0
        self._comm = random.Random(config.seed).getrandbits(63) | 1
        self._coll_seq = 0
        self.horizon = self.start_ns  # host time up to which steps are generated
        self.gpus = [
            _Gpu(
                index=i,
                ring=ring,
                rng=random.Random(config.seed * 1_000_003 + i),
                pid=200_000 + i,
                compute_free=self.start_ns,
                comm_free=self.start_ns,
                nvlink_total=[0] * config.nvlink_links,
                next_sample=self.start_ns + _S,
                next_fingerprint=self.start_ns,
                # A generator of their own, so that episodes leave every other record as it was.
                oom_rng=random.Random(f"oom-{config.seed}-{i}"),
            )
            for i, ring in enumerate(rings)
        ]
        for g in self.gpus:
            first = self._oom_gap(g) if config.first_oom_s is None else config.first_oom_s * _S
            g.oom_from = self.start_ns + first
            g.oom_until = g.oom_from + config.oom_episode_s * _S

    # ---- public -------------------------------------------------------------

    @property
    def steps(self) -> int:
        return self._step

    def advance_to(self, now_ns: int) -> int:
        """Emit every record stamped at or before now_ns; returns how many were written."""
        while self.horizon <= now_ns + _S:
            self._generate_step()
        written = 0
        for g in self.gpus:
            before = g.written
            while g.next_fingerprint <= now_ns:
                self._fingerprint(g, g.next_fingerprint)
                g.next_fingerprint += int(self.config.fingerprint_every_s * _S)
            while g.next_sample <= now_ns:
                self._samples(g, g.next_sample)
                g.next_sample += _S
            while g.heap and g.heap[0][0] <= now_ns:
                g.put(heapq.heappop(g.heap)[2]())
            written += g.written - before
        return written

    def run(
        self,
        seconds: float | None = None,
        *,
        clock: Callable[[], int] = time.time_ns,
        sleep: Callable[[float], None] = time.sleep,
        tick_s: float = 0.05,
        slow_when: Callable[[], bool] | None = None,
    ) -> int:
        """Follow the wall clock for ``seconds`` (forever when None); returns records written.
        ``slow_when`` is asked every tick whether the ``slow_kernel`` regression is on now."""
        end = None if seconds is None else self.start_ns + int(seconds * _S)
        total = 0
        while True:
            if slow_when is not None:
                self.slow = slow_when()
            now = clock()
            if end is not None and now >= end:
                return total + self.advance_to(end)
            total += self.advance_to(now)
            sleep(tick_s)

    # ---- generation ---------------------------------------------------------

    def _push(self, g: _Gpu, ts: int, fn: Callable[[], int]) -> None:
        self._seq += 1
        heapq.heappush(g.heap, (ts, self._seq, fn))

    def _duration(self, g: _Gpu, spec: KernelSpec) -> int:
        d = spec.median_us * self.config.time_scale * math.exp(g.rng.gauss(0.0, spec.sigma))
        if self.slow and self.config.slow_kernel and self.config.slow_kernel in spec.name:
            d *= self.config.slow_factor
        if g.rng.random() < 0.005:  # stragglers: a bounded Pareto tail on top of the lognormal body
            d *= straggler_factor(g.rng, 1.3)
        return max(1_000, int(d * _US * g.slowdown))

    def _kernel(self, g: _Gpu, host: int, spec: KernelSpec, comm: bool = False) -> tuple[int, int]:
        """Launch one kernel at host time ``host``; returns (host time after the launch, device end)."""
        cfg = self.config
        launch_cost = int(g.rng.uniform(4, 9) * _US)
        stream = 0x2 if comm else 0x1
        # (The all-reduce's kernel is placed at device time, not launched at a host time: it
        # takes a place in the queue but neither drains it nor waits on it.)
        while not comm and g.pending and g.pending[0] <= host:
            heapq.heappop(g.pending)
        if not comm and len(g.pending) >= cfg.launch_queue:
            host = heapq.heappop(g.pending)  # the queue is full: the launch waits for a kernel to end
        free = g.comm_free if comm else g.compute_free
        start = max(host + 5 * _US, free)
        end = start + self._duration(g, spec)
        if comm:
            g.comm_free = end
        else:
            g.compute_free = end
        g.busy.append((start, end))
        heapq.heappush(g.pending, end)
        g.correlation += 1
        corr = g.correlation
        g.launches += 1
        w = g.ring
        pid = g.pid
        if cfg.launch_sample and g.launches % cfg.launch_sample == 0:
            self._push(
                g,
                host,
                lambda: w.launch(w.intern(spec.name), g.index, host, pid, pid, *spec.grid, *spec.block),
            )
        self._push(g, start, lambda: w.kernel(w.intern(spec.name), g.index, start, end, stream, corr, pid))
        return host + launch_cost, end

    def _memop(self, g: _Gpu, ts: int, kind: int, addr: int, nbytes: int, status: int = 0) -> None:
        w = g.ring
        self._push(g, ts, lambda: w.memop(kind, g.index, ts, addr, nbytes, g.pid, g.pid, status))

    def _alloc(self, g: _Gpu, ts: int, nbytes: int, kind: int = MemopKind.ALLOC_ASYNC) -> int:
        addr = g.next_addr
        g.next_addr += (nbytes + 0x1FFFFF) & ~0x1FFFFF
        g.outstanding += nbytes
        self._memop(g, ts, kind, addr, nbytes)
        return addr

    def _free(self, g: _Gpu, ts: int, addr: int, nbytes: int, kind: int = MemopKind.FREE_ASYNC) -> None:
        g.outstanding -= nbytes
        self._memop(g, ts, kind, addr, nbytes)

    def _error(self, g: _Gpu, ts: int, kind: int, code: int, aux: int, detail: str) -> None:
        w = g.ring
        self._push(g, ts, lambda: w.error(kind, g.index, ts, code, aux, g.pid, w.intern(detail)))

    def _generate_step(self) -> None:
        cfg = self.config
        self._step += 1
        step = self._step
        start = self.horizon
        if step > 1 and step % cfg.idle_every_steps == 0:
            start += int(cfg.idle_s * _S)  # checkpoint: the GPUs sit idle
        hosts: list[int] = []
        acts: list[list[tuple[int, int]]] = []
        for g in self.gpus:
            host = start + int(g.rng.uniform(0.5, 2.5) * 1_000 * _US)  # data loading
            g.compute_free = max(g.compute_free, host)
            g.comm_free = max(g.comm_free, host)
            if self._in_oom(g, host):
                host = self._oom(g, host)
            elif step % cfg.growth_every_steps == 0:
                host = self._grow_cache(g, host)
            layer_acts: list[tuple[int, int]] = []
            for _ in range(cfg.layers):
                layer_acts.append((self._alloc(g, host, cfg.activation_bytes), cfg.activation_bytes))
                for spec in KERNELS["forward"]:
                    host, _end = self._kernel(g, host, spec)
            hosts.append(host)
            acts.append(layer_acts)
        # Backward, bucket by bucket; each bucket's all-reduce starts when the slowest rank reaches it.
        per_bucket = max(1, cfg.layers // cfg.buckets)
        layer = cfg.layers
        bucket_bytes = cfg.model_bytes // cfg.buckets
        while layer > 0:
            arrive: list[int] = []
            for gi, g in enumerate(self.gpus):
                host = hosts[gi]
                for li in range(layer - 1, max(0, layer - per_bucket) - 1, -1):
                    for spec in KERNELS["backward"]:
                        host, _end = self._kernel(g, host, spec)
                    addr, nbytes = acts[gi][li]
                    self._free(g, host, addr, nbytes)
                hosts[gi] = host
                arrive.append(g.compute_free)
            layer = max(0, layer - per_bucket)
            self._allreduce(arrive, hosts, bucket_bytes)
        for gi, g in enumerate(self.gpus):
            host = hosts[gi]
            for spec in KERNELS["optimizer"]:
                host, _end = self._kernel(g, host, spec)
            # The next batch's inputs go host -> device, the loss comes back (memcpy_bytes); sizes
            # from the step count, not the generator, so the rest of the stream stays as it was.
            self._memop(g, host, MemopKind.MEMCPY, 0, (8 << 20) << (self._coll_seq % 3))
            self._memop(g, host, MemopKind.MEMCPY, 0, 4)
            if self._step % cfg.sync_every_steps:
                hosts[gi] = host  # no sync this step: the host goes on to the next batch
                continue
            done = max(g.compute_free, g.comm_free)
            waited = max(0, done - host)
            w = g.ring
            self._push(
                g,
                host,
                functools.partial(w.sync, SyncKind.STREAM, g.index, host, waited, 0x1, g.pid, g.pid),
            )
            hosts[gi] = max(done, host)
        self.horizon = max(hosts)

    def _allreduce(self, arrive: list[int], hosts: list[int], nbytes: int) -> None:
        cfg = self.config
        self._coll_seq += 1
        seq = self._coll_seq
        n = cfg.gpus
        ready = max(arrive)
        # Ring all-reduce moves 2(n-1)/n of the buffer over ~450 GB/s of NVLink; one GPU only copies.
        wire = nbytes * 2 * (n - 1) / n if n > 1 else 0
        base = int((wire / 450e9) * _S) + 25 * _US
        timeout = any(g.rng.random() < cfg.error_rate / 20 for g in self.gpus)
        for gi, g in enumerate(self.gpus):
            start = max(ready, g.comm_free, hosts[gi])
            dur = int(base * math.exp(g.rng.gauss(0, 0.1)))
            if g.rng.random() < 0.01:
                dur = int(dur * straggler_factor(g.rng, 1.5))
            spec = KernelSpec(_ALLREDUCE_KERNEL, dur / _US / cfg.time_scale, 0.0)
            g.comm_free = max(g.comm_free, start)
            _host, end = self._kernel(g, start - 5 * _US, spec, comm=True)
            g.nvlink_bytes += int(wire)
            w = g.ring
            self._push(
                g,
                start,
                functools.partial(
                    w.collective,
                    CollectiveOp.ALLREDUCE,
                    g.index,
                    start,
                    nbytes,
                    end - start,
                    self._comm,
                    gi,
                    n,
                    int(timeout),
                ),
            )
            if timeout:
                detail = (
                    f"[Rank {gi}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, "
                    f"OpType=ALLREDUCE, NumelIn={nbytes // 2}, Timeout(ms)=600000) ran for 600012 "
                    "milliseconds before timing out (simulated)"
                )
                self._error(g, end, ErrorKind.NCCL_TIMEOUT, 600_000, seq, detail)

    def _grow_cache(self, g: _Gpu, host: int) -> int:
        cfg = self.config
        peak = cfg.static_memory + g.outstanding + cfg.layers * cfg.activation_bytes + cfg.growth_bytes
        if peak <= cfg.memory_total:
            g.cache.append((self._alloc(g, host, cfg.growth_bytes, MemopKind.ALLOC), cfg.growth_bytes))
            return host + 30 * _US
        # The allocator gives its cache back before the device runs out (PyTorch's
        # garbage_collection_threshold): creeping usage alone never fails an allocation.
        return self._release_cache(g, host)

    def _release_cache(self, g: _Gpu, host: int) -> int:
        for addr, nbytes in g.cache:
            self._free(g, host, addr, nbytes, MemopKind.FREE)
            host += 20 * _US
        g.cache.clear()
        return host

    def _oom_gap(self, g: _Gpu) -> float:
        """Nanoseconds from one OOM episode's end to the next one's start."""
        every = self.config.oom_every_s
        return math.inf if every == math.inf else g.oom_rng.expovariate(1.0 / every) * _S

    def _in_oom(self, g: _Gpu, host: int) -> bool:
        """Whether host time ``host`` falls in an OOM episode of this GPU (moving on to the next
        episode once one is over)."""
        while host >= g.oom_until:
            g.oom_from = g.oom_until + self._oom_gap(g)
            g.oom_until = g.oom_from + self.config.oom_episode_s * _S
        return g.oom_from <= host

    def _oom(self, g: _Gpu, host: int) -> int:
        """One step of an OOM episode: the step's batch needs more than is free, the allocation
        fails (a failed MEMOP, status 2, and an ``oom`` ERROR), and the job gives its cache back
        and carries on; while the episode lasts, every step fails so."""
        cfg = self.config
        free = max(0, cfg.memory_total - cfg.static_memory - g.outstanding)
        nbytes = (free + int(g.oom_rng.uniform(0.5, 4.0) * _GIB)) & ~0x1FFFFF
        self._memop(g, host, MemopKind.ALLOC, 0, nbytes, CUDA_ERROR_OUT_OF_MEMORY)
        detail = (
            f"CUDA out of memory. Tried to allocate {nbytes / _GIB:.2f} GiB. GPU {g.index} has a "
            f"total capacity of {cfg.memory_total / _GIB:.2f} GiB of which {free / _GIB:.2f} GiB is "
            "free (simulated)"
        )
        self._error(g, host, ErrorKind.OOM, CUDA_ERROR_OUT_OF_MEMORY, nbytes, detail)
        return self._release_cache(g, host + 200 * _US)

    # ---- NVML-like state ----------------------------------------------------

    def _utilisation(self, g: _Gpu, lo: int, hi: int) -> float:
        busy = 0
        edge = lo
        keep: list[tuple[int, int]] = []
        for s, e in sorted(g.busy):
            if e > hi - 2 * _S:
                keep.append((s, e))
            s, e = max(s, edge), min(e, hi)
            if e > s:
                busy += e - s
                edge = e
        g.busy = keep
        return min(1.0, busy / (hi - lo))

    def _samples(self, g: _Gpu, ts: int) -> None:
        cfg = self.config
        util = self._utilisation(g, ts - _S, ts)
        power = min(cfg.power_limit_w, 85.0 + (cfg.power_limit_w - 85.0) * util**0.9 + g.rng.gauss(0, 4))
        g.energy_j += power
        target = 30.0 + 0.07 * power
        g.temperature += (target - g.temperature) * (1 - math.exp(-1 / 30))
        reasons = 0
        clock = 1980e6
        if util < 0.05:
            reasons |= 0x1
            clock = 345e6
        if g.temperature >= 78.0:
            reasons |= 0x20
            clock = min(clock, 1755e6)
        if power >= 0.98 * cfg.power_limit_w:
            reasons |= 0x4
            clock = min(clock, 1830e6)
        g.slowdown = 1980e6 / clock if reasons & 0x24 else 1.0
        if g.rng.random() < 0.002:
            g.ecc_corrected += 1
        used = cfg.static_memory + g.outstanding
        per_link = g.nvlink_bytes // max(1, cfg.nvlink_links)
        g.nvlink_bytes = 0
        w = g.ring
        dev = g.index
        values: list[tuple[int, float, int]] = [
            (MetricId.MEMORY_USED, used, 0),
            (MetricId.MEMORY_FREE, cfg.memory_total - used, 0),
            (MetricId.MEMORY_TOTAL, cfg.memory_total, 0),
            (MetricId.TEMPERATURE, round(g.temperature), 0),
            (MetricId.MEMORY_TEMPERATURE, round(g.temperature + 6), 0),
            (MetricId.POWER, round(power, 3), 0),
            (MetricId.POWER_LIMIT, cfg.power_limit_w, 0),
            (MetricId.ENERGY, round(g.energy_j, 3), 0),
            (MetricId.GPU_UTIL, round(util, 2), 0),
            (MetricId.SM_UTIL, round(util * 0.82, 2), 0),
            (MetricId.MEMORY_UTIL, round(util * 0.45, 2), 0),
            (MetricId.SM_CLOCK, clock, 0),
            (MetricId.MEMORY_CLOCK, 2619e6, 0),
            (MetricId.PCIE_TX, round(12e6 + 30e6 * util), 0),
            (MetricId.PCIE_RX, round(20e6 + 180e6 * util), 0),
            (MetricId.ECC_CORRECTED, g.ecc_corrected, 0),
            (MetricId.ECC_UNCORRECTED, g.ecc_uncorrected, 0),
            (MetricId.THROTTLE_REASONS, reasons, 0),
            (MetricId.PROCESS_MEMORY, used - 512 * _MIB, g.pid),
            (MetricId.PCIE_REPLAYS, 0, 0),
            (MetricId.RETIRED_PAGES, 0, 0),
        ]
        for link in range(cfg.nvlink_links):
            g.nvlink_total[link] += per_link
            values.append((MetricId.NVLINK_TX, g.nvlink_total[link], link))
            values.append((MetricId.NVLINK_RX, g.nvlink_total[link], link))
        if cfg.dcgm_names:
            values += self._dcgm(g, values, util, per_link * cfg.nvlink_links)
        for metric, value, aux in values:
            g.put(w.sample(metric, dev, ts, float(value), aux))
        if g.rng.random() < cfg.error_rate:
            self._random_error(g, ts)

    def _dcgm(
        self, g: _Gpu, ours: list[tuple[int, float, int]], util: float, nvlink: int
    ) -> list[tuple[int, float, int]]:
        """dcgm-exporter's series as the NVML sampler writes them: ours in DCGM's units, the rest modelled
        (``nvlink``: bytes sent this second, each way)."""
        out = dcgm_samples(ours)
        out += [
            (dcgm_id(206), 0.0, 0),  # no video encoding or decoding in a training job
            (dcgm_id(207), 0.0, 0),
            (dcgm_id(253), 462.0, 0),  # MiB the driver reserves on an 80 GB H100
            (dcgm_id(393), float(g.ecc_uncorrected), 0),
            (dcgm_id(394), 0.0, 0),
            (dcgm_id(395), 0.0, 0),
            (dcgm_id(230), float(g.last_xid), g.last_xid),
            (dcgm_id(1001), round(util, 3), 0),
            (dcgm_id(1002), round(util * 0.82, 3), 0),
            (dcgm_id(1003), round(util * 0.35, 3), 0),
            (dcgm_id(1004), round(util * 0.61, 3), 0),
            (dcgm_id(1005), round(util * 0.45, 3), 0),
            (dcgm_id(1006), 0.0, 0),
            (dcgm_id(1007), round(util * 0.12, 3), 0),
            (dcgm_id(1008), round(util * 0.05, 3), 0),
            (dcgm_id(1009), round(12e6 + 30e6 * util), 0),
            (dcgm_id(1010), round(20e6 + 180e6 * util), 0),
            (dcgm_id(1011), float(nvlink), 0),
            (dcgm_id(1012), float(nvlink), 0),
        ]
        return out

    def _random_error(self, g: _Gpu, ts: int) -> None:
        w = g.ring
        if g.rng.random() < 0.7:
            code = g.rng.choice(sorted(XIDS))
            if code in (48, 94):
                g.ecc_uncorrected += 1
            g.last_xid = code
            detail = f"NVRM: Xid (PCI:0000:{0x18 + g.index:02x}:00): {code}, {XIDS[code]} (simulated)"
            g.put(w.error(ErrorKind.XID, g.index, ts, code, 0, g.pid, w.intern(detail)))
        else:
            self._coll_seq += 1
            detail = (
                f"[Rank {g.index}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum="
                f"{self._coll_seq}, OpType=ALLREDUCE, Timeout(ms)=600000) (simulated)"
            )
            g.put(
                w.error(ErrorKind.NCCL_TIMEOUT, g.index, ts, 600_000, self._coll_seq, g.pid, w.intern(detail))
            )

    def _fingerprint(self, g: _Gpu, ts: int) -> None:
        cfg = self.config
        w = g.ring
        dev = g.index
        strings = {
            FingerprintField.NAME: f"{cfg.gpu_product} (simulated)",
            FingerprintField.UUID: f"GPU-5140a7ed-0000-4000-8000-{cfg.seed & 0xFFFF:04x}{dev:08x}",
            FingerprintField.DRIVER_VERSION: "550.54.15",
            FingerprintField.PCI_BUS_ID: f"00000000:{0x18 + dev:02X}:00.0",
            FingerprintField.HOSTNAME: host_name(),
        }
        for fid, text in strings.items():
            g.put(w.fingerprint(fid, dev, ts, w.intern(text), 1))
        numbers = {
            FingerprintField.CUDA_VERSION: 12040,
            FingerprintField.MEMORY_TOTAL: cfg.memory_total,
            FingerprintField.NVLINK_LINKS: cfg.nvlink_links,
            FingerprintField.NVLINK_BANDWIDTH: 25_000_000_000
            * cfg.nvlink_links,  # bytes/s, one direction, all links
            FingerprintField.SM_COUNT: 132,
            FingerprintField.COMPUTE_CAPABILITY: 90,
        }
        for fid, value in numbers.items():
            g.put(w.fingerprint(fid, dev, ts, value))
