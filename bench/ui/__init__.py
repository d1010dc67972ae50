"""What the web UI's browser test and ``make bench-ui`` share: Debian's chromium through
Playwright, and a store holding a fleet to look at.

Playwright's own browser download cannot run here (and CI should not depend on it), so
the browser is the distribution's ``/usr/bin/chromium`` (scripts/bootstrap.sh installs it).
"""

from __future__ import annotations

import contextlib
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bench.api.__main__ import populate
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import CallBatch, Event, HistogramBuilder, SampleBuilder, SpanBatch
from kernel_insight.kql.histogram import FloatHistogram

__all__ = [
    "CHROMIUM",
    "CHROMIUM_ARGS",
    "HISTOGRAM_INTERVAL_S",
    "KERNELS",
    "MEMORY_OPS",
    "NCCL_OPS",
    "POD",
    "SYNCS",
    "calls_of",
    "chromium",
    "populate_fleet",
    "populate_kernel_histograms",
    "populate_spans",
]

#: Debian's chromium package.
CHROMIUM = "/usr/bin/chromium"

#: Headless in a container without a GPU, a sandbox or the network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless chromium (Playwright ``Browser``); RuntimeError saying why when it cannot start."""
    if shutil.which(CHROMIUM) is None:
        raise RuntimeError(f"{CHROMIUM} is missing: install Debian's chromium package (make bootstrap)")
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError as exc:
        raise RuntimeError(f"playwright is not installed ({exc}): pip install -e '.[dev]'") from None
    with sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        except Error as exc:
            raise RuntimeError(f"{CHROMIUM} does not launch: {exc}") from None
        try:
            yield browser
        finally:
            browser.close()


def populate_fleet(path: Path, instances: int, now_ms: int, *, hot: tuple[str, ...] = ()) -> None:
    """``bench.api.populate``'s fleet (instances x 8 GPUs), plus GPU 0 of each ``hot`` instance at
    95 degrees now, which the health rule (90 at most) marks unhealthy with a reason."""
    populate(path, instances, now_ms)
    if not hot:
        return
    b = SampleBuilder()
    for inst in hot:
        labels = {"__name__": "gpu_temperature_celsius", "instance": inst, "gpu": "0"}
        b.add({**labels, "model": "NVIDIA H100 80GB HBM3"}, now_ms - 500, 95.0)
    with EmbeddedStore(path) as store:
        store.insert_samples(b.build())


#: The Kubernetes (pod, namespace, container) that ran ``populate_spans``' spans of even streams.
POD = ("train-0", "ml", "main")

#: The kernels ``populate_spans`` draws from.
KERNELS = (
    "gemm_fp16_128x128",
    "flash_attn_fwd",
    "layernorm_fwd",
    "nccl_allreduce_ring",
    "softmax_fp32",
    "memcpy_d2d",
)


def populate_spans(
    path: Path,
    instance: str,
    gpu: int,
    start_ns: int,
    count: int,
    *,
    streams: int = 4,
    window_ns: int = 10_000_000_000,
) -> None:
    """``count`` kernel spans of one GPU in ``[start_ns, start_ns + window_ns)``, back to back on
    ``streams`` streams (handles like CUDA's pointers), each a ``KERNELS`` name, 25-90% of its slot,
    each launched by one of two host threads (tids 4243, 4244) 5-50 us before it starts, those of
    the even streams in Kubernetes pod ``POD``;
    plus the GPU's memory use and SM use every 100 ms of the window, one OOM event in its middle,
    and its other calls (``populate_calls``)."""
    rng = random.Random(19)
    per = -(-count // streams)
    slot = window_ns // per
    rows = [(s, i) for i in range(per) for s in range(streams)][:count]
    starts = np.array([start_ns + i * slot for _, i in rows], np.int64)
    durs = np.array([int(slot * rng.uniform(0.25, 0.9)) for _ in rows], np.int64)
    batch = SpanBatch(
        instance=[instance] * count,
        gpu=np.full(count, gpu, np.uint16),
        stream=np.array([0x7F0000001000 + s * 0x100 for s, _ in rows], np.uint64),
        kernel=[KERNELS[rng.randrange(len(KERNELS))] for _ in rows],
        start_ns=starts,
        end_ns=starts + durs,
        correlation=np.arange(1, count + 1, dtype=np.uint64),
        pid=np.full(count, 4242, np.uint32),
    )
    lead = np.array([rng.randrange(5_000, 50_000) for _ in rows], np.int64)
    batch.launch_ns[:] = starts - lead
    batch.launch_host_ns[:] = 3_000
    batch.tid[:] = np.array([4243 + s % 2 for s, _ in rows], np.uint32)
    # Kubernetes: the even streams' spans ran in pod ml/train-0 (container main), the odd ones in none
    batch.owners = (np.array([1 - s % 2 for s, _ in rows], np.int32), [("", "", ""), POD])
    samples = SampleBuilder()
    base = {"instance": instance, "gpu": str(gpu)}
    for n, t_ms in enumerate(range(start_ns // 1_000_000, (start_ns + window_ns) // 1_000_000, 100)):
        samples.add(
            {**base, "__name__": "gpu_memory_used_bytes"}, t_ms, (40 + 30 * (n % 50) / 50) * (1 << 30)
        )
        samples.add({**base, "__name__": "gpu_sm_utilization_ratio"}, t_ms, rng.uniform(0.5, 1.0))
    oom = Event(instance, gpu, start_ns + window_ns // 2, "oom", 2, message="CUDA out of memory (simulated)")
    with EmbeddedStore(path) as store:
        store.insert_spans(batch)
        store.insert_samples(samples.build())
        store.insert_events([oom])
        store.insert_calls(calls_of(instance, gpu, start_ns, window_ns))


#: What ``calls_of`` puts in a window: NCCL operations, memory operations and syncs.
NCCL_OPS, MEMORY_OPS, SYNCS = 200, 100, 50


def calls_of(instance: str, gpu: int, start_ns: int, window_ns: int) -> CallBatch:
    """A GPU's other calls over the window, evenly spread: ``NCCL_OPS`` all-reduces of 1 GiB (the
    last one failed) on communicator 0xc0, ``MEMORY_OPS`` allocations / frees / copies of 64 MiB
    and ``SYNCS`` stream syncs of 200 us, from host thread 4243."""
    rows: list[tuple[str, str, int, int, int, int]] = []
    for i in range(NCCL_OPS):
        rows.append(
            (
                "nccl",
                "allreduce",
                start_ns + i * window_ns // NCCL_OPS,
                window_ns // NCCL_OPS // 3,
                1 << 30,
                0xC0,
            )
        )
    for i in range(MEMORY_OPS):
        op = ("alloc", "free", "memcpy")[i % 3]
        rows.append(
            ("memory", op, start_ns + i * window_ns // MEMORY_OPS + 7, 0, 64 << 20, 0x7F00_0000_0000 + i)
        )
    for i in range(SYNCS):
        rows.append(("sync", "stream", start_ns + i * window_ns // SYNCS + 11, 200_000, 0, 0x7F0000001000))
    failed = [i == NCCL_OPS - 1 for i in range(len(rows))]
    return CallBatch.of(instance, gpu, rows, pid=4242, tid=4243, nranks=8, failed=failed)


#: How often the agent ships its histograms by default (``histogram_interval_s``, agent/src/config.c).
HISTOGRAM_INTERVAL_S = 7


def populate_kernel_histograms(
    path: Path,
    instance: str,
    gpu: int,
    start_ms: int,
    seconds: int,
    kernels: tuple[str, ...] = KERNELS[:3],
    *,
    interval_s: int = HISTOGRAM_INTERVAL_S,
) -> None:
    """``kernel_duration_seconds`` of one GPU as the agent ships it: a cumulative native histogram per
    kernel every ``interval_s`` (the agent's default) from ``start_ms`` for ``seconds``, 2,000
    launches a second each, log-normal around 50-400 us with 0.5% stragglers 20x slower (the tail
    a heatmap must show)."""
    rng = np.random.default_rng(14)
    out = HistogramBuilder()
    for k, kernel in enumerate(kernels):
        labels = {
            "__name__": "kernel_duration_seconds",
            "instance": instance,
            "gpu": str(gpu),
            "kernel": kernel,
        }
        total: FloatHistogram | None = None
        for s in range(0, seconds, interval_s):
            n = 2_000 * interval_s
            d = rng.lognormal(np.log(50e-6 * 2**k), 0.3, n)
            slow = rng.random(n) < 0.005
            d[slow] *= 20
            new = FloatHistogram.from_observations(d, schema=3)
            total = new if total is None else total.add(new).histogram
            out.add_histogram(labels, start_ms + s * 1000, total)
    with EmbeddedStore(path) as store:
        store.insert_histograms(out.build())
