"""The timeline summary counts every launch from the agent's native histograms when it ships them
(wire body v2 keeps only the tail and a sample of spans), and the kept spans otherwise."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import HistogramBuilder, SpanBatch
from kernel_insight.collector.spans import SpanWindow, _launches, kernel_histograms, summarize
from kernel_insight.kql.histogram import FloatHistogram

T0_MS = (int(time.time()) - 120) * 1000  # recent: older rows would be past the retention TTL
PER_S = 1_000


def _durations(seconds: int, kernel: int) -> list[np.ndarray]:
    rng = np.random.default_rng(kernel)
    return [rng.lognormal(np.log(100e-6 * (kernel + 1)), 0.4, PER_S) for _ in range(seconds)]


def _histograms(kernels: tuple[str, ...], **pod: str) -> HistogramBuilder:
    """``kernel_duration_seconds`` of n1's GPU 0 as the agent ships it: each kernel's cumulative
    histogram of :func:`_durations` exported every second from T0-1 s to T0+10 s (``pod``: the
    series' Kubernetes labels, pod, namespace, container)."""
    hb = HistogramBuilder()
    for k, kernel in enumerate(kernels):
        per_second = _durations(12, k)
        labels = {
            "__name__": "kernel_duration_seconds",
            "instance": "n1",
            "gpu": "0",
            "kernel": kernel,
            **pod,
        }
        for s in range(12):
            h = FloatHistogram.from_observations(np.concatenate(per_second[: s + 1]), schema=3)
            hb.add_histogram(labels, T0_MS + (s - 1) * 1000, h)
    return hb


def _kept(rows: list[tuple[str, int, int]]) -> SpanBatch:
    """The spans the agent kept of n1's GPU 0, stream 7: rows of (kernel, start_ns, duration_ns)."""
    n = len(rows)
    starts = np.array([r[1] for r in rows], np.int64)
    return SpanBatch(
        instance=["n1"] * n,
        gpu=np.zeros(n, np.uint16),
        stream=np.full(n, 7, np.uint64),
        kernel=[r[0] for r in rows],
        start_ns=starts,
        end_ns=starts + np.array([r[2] for r in rows], np.int64),
        correlation=np.arange(1, n + 1, dtype=np.uint64),
        pid=np.full(n, 1, np.uint32),
    )


def test_summary_counts_every_launch_from_the_histograms(tmp_path):
    # Exports every second from T0-1 s to T0+10 s, cumulative; the window [T0, T0+10 s) grows from
    # the export at T0 to the last one before its end (T0+9 s): 9 seconds of launches.
    # The agent kept three gemm spans of the window (a sample), and none of softmax.
    spans = _kept([("gemm", T0_MS * 10**6 + i * 10**9, 5_000_000) for i in (1, 4, 7)])
    with EmbeddedStore(tmp_path / "data") as store:
        store.insert_histograms(_histograms(("gemm", "softmax")).build())
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


def test_a_pod_filter_counts_the_launches_of_that_pods_histograms_only(tmp_path):
    # gemm ran in two pods one after the other within the window's GPU history: each pod's series
    # carries its pod labels (derive), so a summary of one pod counts that pod's launches alone.
    train = {"pod": "train-0", "namespace": "ml", "container": "main"}
    serve = {"pod": "serve-0", "namespace": "serving", "container": "engine"}
    with EmbeddedStore(tmp_path / "data") as store:
        store.insert_histograms(_histograms(("gemm",), **train).build())
        store.insert_histograms(_histograms(("other", "gemm"), **serve).build())  # gemm: durations of k=1
        window = SpanWindow("n1", 0, T0_MS * 10**6, (T0_MS + 10_000) * 10**6)
        every = {k["kernel"]: k for k in summarize(store, window, kernels=10, slowest=0)["kernels"]}
        mine = summarize(store, dataclasses.replace(window, pod="train-0"), kernels=10, slowest=0)
        theirs = summarize(store, dataclasses.replace(window, namespace="serving"), kernels=10, slowest=0)
    assert every["gemm"]["count"] == 2 * 9 * PER_S
    (gemm,) = mine["kernels"]
    assert (gemm["kernel"], gemm["source"], gemm["count"]) == ("gemm", "histograms", 9 * PER_S)
    assert abs(gemm["total_ns"] - np.concatenate(_durations(12, 0)[2:11]).sum() * 1e9) < 1e3
    assert {k["kernel"]: k["count"] for k in theirs["kernels"]} == {"gemm": 9 * PER_S, "other": 9 * PER_S}


def test_shares_add_up_when_only_some_kernels_have_histograms(tmp_path):
    # Only gemm's launches are in histograms (an agent whose full histogram table refused the other
    # kernels' keys, say): gemm is counted from them, softmax and copy from their kept spans, and
    # the GPU's kernel time is the sum of the three, so every share is a part of it.
    kept = [("gemm", (T0_MS + 1000 * i) * 10**6, 300_000) for i in (2, 5)]  # its slow tail, 0.6 ms
    kept += [("softmax", (T0_MS + 900 * i) * 10**6, 20_000_000) for i in range(10)]  # 200 ms
    kept += [("copy", (T0_MS + 1700 * i) * 10**6, 1_000_000) for i in range(5)]  # 5 ms
    kept.append(("copy", (T0_MS + 10_000) * 10**6, 7_000_000))  # starts at the window's end: not in it
    with EmbeddedStore(tmp_path / "data") as store:
        store.insert_histograms(_histograms(("gemm",)).build())
        store.insert_spans(_kept(kept))
        window = SpanWindow("n1", 0, T0_MS * 10**6, (T0_MS + 10_000) * 10**6)
        got = summarize(store, window, kernels=10, slowest=2)
        top = summarize(store, window, kernels=1, slowest=2)
    kernels = {k["kernel"]: k for k in got["kernels"]}
    gemm = np.concatenate(_durations(12, 0)[2:11])  # its launches of seconds T0 .. T0+9
    assert kernels["gemm"]["source"] == "histograms"
    assert kernels["gemm"]["count"] == gemm.size
    assert abs(kernels["gemm"]["total_ns"] - gemm.sum() * 1e9) < 1e3
    assert (kernels["softmax"]["source"], kernels["softmax"]["count"]) == ("spans", 10)
    assert kernels["softmax"]["total_ns"] == 200_000_000
    assert (kernels["copy"]["source"], kernels["copy"]["count"]) == ("spans", 5)
    assert kernels["copy"]["total_ns"] == 5_000_000
    assert [k["kernel"] for k in got["kernels"]] == ["gemm", "softmax", "copy"]  # by each one's own total
    assert got["total_ns"] == sum(k["total_ns"] for k in got["kernels"])
    assert all(0 <= k["share"] <= 1 for k in got["kernels"])
    assert sum(k["share"] for k in got["kernels"]) == pytest.approx(1)
    for k in got["kernels"]:
        assert k["share"] == pytest.approx(k["total_ns"] / got["total_ns"])
    assert got["busy_ratio"] == pytest.approx(got["total_ns"] / 10e9)
    assert got["span_count"] == 17
    # The first kernel by its own source is listed even when its kept spans are the fewest, with
    # its slowest kept spans and their max; the total is still the whole window's.
    (first,) = top["kernels"]
    assert first == kernels["gemm"]
    assert [s["duration_ns"] for s in first["slowest"]] == [300_000, 300_000]
    assert first["max_ns"] == 300_000
    assert top["total_ns"] == got["total_ns"]
    assert first["share"] < 1


def test_a_counter_reset_inside_the_window_starts_a_new_run():
    def h(n: float) -> FloatHistogram:
        return FloatHistogram(schema=0, count=n, sum=n, positive_spans=((1, 1),), positive_buckets=(n,))

    grown = _launches([h(15), h(20), h(3), h(7)], base=h(10))  # the agent restarted after 20
    assert grown is not None
    assert grown.count == (20 - 10) + 7
    assert _launches([h(5)], base=None).count == 5  # a series born in the window counts whole
    assert _launches([], base=h(5)) is None
