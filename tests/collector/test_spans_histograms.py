"""The timeline summary counts every launch from the agent's native histograms when it ships them
(wire body v2 keeps only the tail and a sample of spans), and the kept spans otherwise."""

from __future__ import annotations

import time

import numpy as np

from kernel_insight.collector.rows import HistogramBuilder, SpanBatch
from kernel_insight.collector.spans import SpanWindow, _launches, kernel_histograms, summarize
from kernel_insight.collector.store import EmbeddedStore
from kernel_insight.kql.nativehist import FloatHistogram

T0_MS = (int(time.time()) - 120) * 1000  # recent: older rows would be past the retention TTL
PER_S = 1_000


def _durations(seconds: int, kernel: int) -> list[np.ndarray]:
    rng = np.random.default_rng(kernel)
    return [rng.lognormal(np.log(100e-6 * (kernel + 1)), 0.4, PER_S) for _ in range(seconds)]


def test_summary_counts_every_launch_from_the_histograms(tmp_path):
    # Exports every second from T0-1 s to T0+10 s, cumulative; the window [T0, T0+10 s) grows from
    # the export at T0 to the last one before its end (T0+9 s): 9 seconds of launches.
    hb = HistogramBuilder()
    seen: dict[str, list[np.ndarray]] = {}
    for k, kernel in enumerate(("gemm", "softmax")):
        per_second = _durations(12, k)
        for s in range(12):
            seen.setdefault(kernel, []).append(per_second[s])
            h = FloatHistogram.from_observations(np.concatenate(seen[kernel]), schema=3)
            labels = {"__name__": "kernel_duration_seconds", "instance": "n1", "gpu": "0", "kernel": kernel}
            hb.add_histogram(labels, T0_MS + (s - 1) * 1000, h)
    # The agent kept three gemm spans of the window (a sample), and none of softmax.
    starts = np.array([T0_MS * 10**6 + i * 10**9 for i in (1, 4, 7)], np.int64)
    spans = SpanBatch(
        instance=["n1"] * 3,
        gpu=np.zeros(3, np.uint16),
        stream=np.full(3, 7, np.uint64),
        kernel=["gemm"] * 3,
        start_ns=starts,
        end_ns=starts + 5_000_000,
        correlation=np.arange(1, 4, dtype=np.uint64),
        pid=np.full(3, 1, np.uint32),
    )
    with EmbeddedStore(tmp_path / "data") as store:
        store.insert_histograms(hb.build())
        store.insert_spans(spans)
        window = SpanWindow("n1", 0, T0_MS * 10**6, (T0_MS + 10_000) * 10**6)
        got = summarize(store, window, kernels=10, slowest=2)
        hists = kernel_histograms(store, window)
        filtered = kernel_histograms(
            store, SpanWindow("n1", 0, window.start_ns, window.end_ns, kernel="soft.*")
        )
        by_stream = kernel_histograms(store, SpanWindow("n1", 0, window.start_ns, window.end_ns, stream=7))
    kernels = {k["kernel"]: k for k in got["kernels"]}
    assert set(kernels) == {"gemm", "softmax"}
    for k, name in enumerate(("gemm", "softmax")):
        exact = np.concatenate(_durations(12, k)[2:11])  # the launches of seconds T0 .. T0+9
        assert kernels[name]["source"] == "histograms"
        assert kernels[name]["count"] == 9 * PER_S
        assert abs(kernels[name]["total_ns"] - exact.sum() * 1e9) < 1e3
        p99 = np.quantile(exact, 0.99) * 1e9
        assert abs(kernels[name]["p99_ns"] / p99 - 1) < 2 ** (1 / 8) - 1  # schema 3's relative bound
    assert len(kernels["gemm"]["slowest"]) == 2  # the kept spans still name the moments
    assert kernels["gemm"]["max_ns"] == 5_000_000
    assert kernels["softmax"]["slowest"] == []
    assert kernels["softmax"]["max_ns"] >= np.concatenate(_durations(12, 1)).max() * 1e9 * 0.9
    assert got["span_count"] == 3
    assert got["total_ns"] == kernels["gemm"]["total_ns"] + kernels["softmax"]["total_ns"]
    assert abs(sum(k["share"] for k in got["kernels"]) - 1) < 1e-9
    assert set(hists) == {"gemm", "softmax"}
    assert set(filtered) == {"softmax"}
    assert by_stream == {}  # histograms carry no per-span filter: the spans answer alone


def test_a_counter_reset_inside_the_window_starts_a_new_run():
    def h(n: float) -> FloatHistogram:
        return FloatHistogram(schema=0, count=n, sum=n, positive_spans=((1, 1),), positive_buckets=(n,))

    grown = _launches([h(15), h(20), h(3), h(7)], base=h(10))  # the agent restarted after 20
    assert grown is not None
    assert grown.count == (20 - 10) + 7
    assert _launches([h(5)], base=None).count == 5  # a series born in the window counts whole
    assert _launches([], base=h(5)) is None
