"""Ring records, written through the real ring, become the spans, samples, events and instances of docs/metrics.md."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest

from kernel_insight.agent import (
    RECORD_DTYPE,
    CollectiveOp,
    ErrorKind,
    FingerprintField,
    MemopKind,
    RecordType,
    Ring,
    RingReader,
    SyncKind,
)
from kernel_insight.agent.metric_ids import METRIC_SPECS, MetricId
from kernel_insight.collector.clickhouse.health import instance_rows, recent_events
from kernel_insight.collector.derive import Deriver, agent_metric_name
from kernel_insight.collector.wire import BatchHeader, DecodedBatch

T0 = 1_790_000_000_000_000_000  # ns


@pytest.fixture
def ring():
    name = f"/kernel_insight.test-derive-{os.getpid()}"
    r = Ring.create(name, capacity=1024)
    yield r
    r.close()
    Ring.unlink(name)


def _drain(ring):
    with RingReader.open(ring.name) as reader:
        return reader.read_array()


def _samples(derived):
    out = {}
    b = derived.samples
    for i, labels in enumerate(b.series):
        mask = b.series_idx == i
        out[labels] = list(zip(b.ts_ms[mask].tolist(), b.values[mask].tolist(), strict=True))
    return out


def _find(samples, name, **labels):
    hits = [
        v for k, v in samples.items() if dict(k).get("__name__") == name and labels.items() <= dict(k).items()
    ]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} series"
    return hits[0]


def test_kernels_become_spans_and_per_kernel_metrics(ring):
    gemm = ring.intern("gemm_bf16")
    attn = ring.intern("flash_attn_fwd")
    ring.fingerprint(FingerprintField.NAME, 0, T0, ring.intern("NVIDIA H100 80GB HBM3"), 1)
    ring.kernel(gemm, 0, T0 + 1000, T0 + 3000, 7, 1, 42)
    ring.kernel(gemm, 0, T0 + 4000, T0 + 8000, 7, 2, 42)
    ring.kernel(attn, 1, T0 + 5000, T0 + 6000, 9, 3, 42)
    d = Deriver("host-1").derive(_drain(ring), now_ns=T0)
    assert d.spans.kernel == ["gemm_bf16", "gemm_bf16", "flash_attn_fwd"]
    assert (d.spans.end_ns - d.spans.start_ns).tolist() == [2000, 4000, 1000]
    assert d.spans.gpu.tolist() == [0, 0, 1]
    assert d.spans.correlation.tolist() == [1, 2, 3]
    s = _samples(d)
    assert _find(
        s, "kernel_launches_total", kernel="gemm_bf16", gpu="0", gpu_product="NVIDIA H100 80GB HBM3"
    ) == [((T0 + 8000) // 1_000_000, 2.0)]
    assert _find(s, "kernel_execution_time_seconds", kernel="gemm_bf16")[0][1] == pytest.approx(3e-6)
    assert _find(s, "kernel_execution_time_seconds_total", kernel="flash_attn_fwd", gpu="1")[0][
        1
    ] == pytest.approx(1e-6)


def test_kernel_time_is_counted_in_whole_nanoseconds(ring):
    # A mean of 1000.33 ns is 1000 ns, and busy time a whole number of ns: each sample is m / 1e9,
    # a decimal the store keeps as an integer mantissa (docs/metrics.md; collector/valuecodec.py).
    k = ring.intern("k")
    for i, dur in enumerate((1000, 1000, 1001)):
        ring.kernel(k, 0, T0 + i * 10_000, T0 + i * 10_000 + dur, 7, i, 42)
    d = Deriver("host-1")
    s = _samples(d.derive(_drain(ring), now_ns=T0))
    assert _find(s, "kernel_execution_time_seconds", kernel="k")[0][1] == 1000 / 1e9
    assert _find(s, "kernel_execution_time_seconds_total", kernel="k")[0][1] == 3001 / 1e9
    ring.kernel(k, 0, T0 + 100_000, T0 + 100_333, 7, 9, 42)
    s = _samples(d.derive(_drain(ring), now_ns=T0))
    assert _find(s, "kernel_execution_time_seconds_total", kernel="k")[0][1] == 3334 / 1e9
    assert _find(s, "kernel_execution_time_seconds", kernel="k")[0][1] == 333 / 1e9


def test_counters_accumulate_across_batches(ring):
    d = Deriver("host-1")
    k = ring.intern("k")
    ring.kernel(k, 0, T0, T0 + 10)
    d.derive(_drain(ring))
    ring.kernel(k, 0, T0 + 20, T0 + 30)
    ring.kernel(k, 0, T0 + 40, T0 + 50)
    # The name arrived in an earlier batch: the deriver remembers it.
    assert _find(_samples(d.derive(_drain(ring))), "kernel_launches_total", kernel="k")[0][1] == 3.0


def test_gpu_samples_use_the_metric_id_table(ring):
    ring.sample(MetricId.MEMORY_TOTAL, 0, T0, 80e9)
    ring.sample(MetricId.MEMORY_FREE, 0, T0, 20e9)
    ring.sample(MetricId.TEMPERATURE, 0, T0, 61.0)
    ring.sample(MetricId.NVLINK_TX, 0, T0, 1e12, 3)
    ring.sample(MetricId.THROTTLE_REASONS, 0, T0, float(0x4 | 0x40))
    ring.sample(9999, 0, T0, 1.0)  # a metric id newer than this collector
    d = Deriver("host-1").derive(_drain(ring))
    s = _samples(d)
    ms = T0 // 1_000_000
    assert _find(s, "gpu_memory_free_bytes", gpu="0") == [(ms, 20e9)]
    assert _find(s, "gpu_memory_free_ratio", gpu="0") == [(ms, 0.25)]
    assert _find(s, "gpu_temperature_celsius") == [(ms, 61.0)]
    assert _find(s, "gpu_nvlink_tx_bytes_total", link="3") == [(ms, 1e12)]
    assert _find(s, "gpu_throttled", reason="sw_power_cap") == [(ms, 1.0)]
    assert _find(s, "gpu_throttled", reason="gpu_idle") == [(ms, 0.0)]
    assert d.unknown_records == 1


def test_errors_become_events_and_counters(ring):
    ring.string(77, "Xid 79: GPU has fallen off the bus")
    ring.error(ErrorKind.XID, 2, T0, 79, 0, 1234, 77)
    ring.error(ErrorKind.OOM, 0, T0 + 1, 2, 0, 1234)
    d = Deriver("host-1").derive(_drain(ring))
    assert [(e.kind, e.gpu, e.code, e.message) for e in d.events] == [
        ("xid", 2, 79, "Xid 79: GPU has fallen off the bus"),
        ("oom", 0, 2, ""),
    ]
    assert _find(_samples(d), "kernel_errors_total", kind="xid", gpu="2")[0][1] == 1.0


def test_memops_collectives_syncs_and_launches(ring):
    f = ring.intern("gemm")
    ring.memop(MemopKind.ALLOC, 0, T0, 0x1000, 1 << 20, 42)
    ring.memop(MemopKind.FREE, 0, T0 + 1, 0x1000, 0, 42)
    ring.collective(CollectiveOp.ALLREDUCE, 0, T0, 1 << 30, 2_000_000, 5, 0, 8)
    ring.collective(CollectiveOp.ALLREDUCE, 0, T0 + 5, 1 << 30, 4_000_000, 5, 0, 8, 1)
    ring.sync(SyncKind.STREAM, 0, T0, 500_000, 7, 42)
    ring.launch(f, 0, T0, 42, 43, 1, 1, 1, 128, 1, 1)
    s = _samples(Deriver("host-1").derive(_drain(ring)))
    assert _find(s, "gpu_memory_allocated_bytes_total")[-1][1] == float(1 << 20)
    assert _find(s, "gpu_memory_operations_total", kind="free")[-1][1] == 1.0
    assert _find(s, "nccl_ops_total", op="allreduce")[-1][1] == 2.0
    assert _find(s, "nccl_op_latency_seconds", op="allreduce") == [
        (T0 // 1_000_000, 0.002),
        (T0 // 1_000_000, 0.004),
    ]
    assert _find(s, "nccl_op_failures_total", op="allreduce")[-1][1] == 1.0
    assert _find(s, "cuda_sync_time_seconds_total", kind="stream")[-1][1] == pytest.approx(5e-4)
    assert _find(s, "cuda_launch_calls_total", kernel="gemm")[-1][1] == 1.0


def test_collectives_memops_and_long_syncs_are_kept_one_row_per_call(ring):
    ring.collective(CollectiveOp.ALLGATHER, 1, T0, 1 << 30, 2_000_000, 0xC0, 3, 8)
    ring.collective(CollectiveOp.ALLREDUCE, 1, T0 + 5, 1 << 20, 4_000_000, 0xC0, 3, 8, 1)
    ring.memop(MemopKind.ALLOC, 1, T0 + 10, 0x1000, 1 << 20, 42, 43)
    ring.memop(MemopKind.MEMCPY, 1, T0 + 11, 0x2000, 4096, 42, 43)
    ring.memop(MemopKind.ALLOC, 1, T0 + 12, 0, 1 << 40, 42, 43, 2)  # cudaErrorMemoryAllocation
    ring.sync(SyncKind.EVENT, 1, T0 + 20, 500_000, 7, 42, 44)
    calls = Deriver("host-1").derive(_drain(ring)).calls
    rows = sorted(
        zip(
            calls.track, calls.op, calls.start_ns.tolist(), calls.duration_ns.tolist(), calls.bytes.tolist(),
            calls.handle.tolist(), calls.pid.tolist(), calls.tid.tolist(), calls.rank.tolist(),
            calls.nranks.tolist(), calls.status.tolist(), calls.failed.tolist(), strict=True,
        ),
        key=lambda r: r[2],
    )  # fmt: skip
    assert rows == [
        ("nccl", "allgather", T0, 2_000_000, 1 << 30, 0xC0, 0, 0, 3, 8, 0, 0),
        ("nccl", "allreduce", T0 + 5, 4_000_000, 1 << 20, 0xC0, 0, 0, 3, 8, 0, 1),
        ("memory", "alloc", T0 + 10, 0, 1 << 20, 0x1000, 42, 43, 0, 0, 0, 0),
        ("memory", "memcpy", T0 + 11, 0, 4096, 0x2000, 42, 43, 0, 0, 0, 0),
        ("memory", "alloc", T0 + 12, 0, 1 << 40, 0, 42, 43, 0, 0, 2, 1),
        ("sync", "event", T0 + 20, 500_000, 0, 7, 42, 44, 0, 0, 0, 0),
    ]
    assert set(calls.gpu.tolist()) == {1}
    assert set(calls.instance) == {"host-1"}


def test_short_syncs_are_sampled_uniformly_across_batches_and_long_ones_all_kept(ring):
    d = Deriver("host-1", sync_keep_ns=10_000, sync_sample_every=10)
    kept_short = kept_long = 0
    for batch in range(3):  # 3 batches of 35 short and 5 long syncs: 105 short, 1 in 10 kept
        for i in range(40):
            ring.sync(SyncKind.STREAM, 0, T0 + batch * 100 + i, 50_000 if i % 8 == 0 else 2_000, 7, 42)
        derived = d.derive(_drain(ring))
        kept_long += int((derived.calls.duration_ns >= 10_000).sum())
        kept_short += int((derived.calls.duration_ns < 10_000).sum())
        # the counters still count every sync
        assert _find(_samples(derived), "cuda_syncs_total", kind="stream")[-1][1] == 40.0 * (batch + 1)
    assert kept_long == 15
    assert kept_short == 11  # short syncs number 0, 10, ..., 100 across the batches
    with pytest.raises(ValueError, match="sync_sample_every"):
        Deriver("host-1", sync_sample_every=0)


def test_fingerprints_describe_the_instance(ring):
    for gpu in (0, 1):
        ring.fingerprint(FingerprintField.NAME, gpu, T0, ring.intern("NVIDIA H100"), 1)
        ring.fingerprint(FingerprintField.MEMORY_TOTAL, gpu, T0, 80 << 30)
        ring.fingerprint(FingerprintField.UUID, gpu, T0, ring.intern(f"GPU-{gpu}"), 1)
    d = Deriver("host-1", labels={"rack": "r7"}).derive(_drain(ring), now_ns=T0)
    (inst,) = d.instances
    assert (inst.gpu_count, inst.gpu_model, inst.memory_total_bytes) == (2, "NVIDIA H100", 160 << 30)
    assert inst.attributes["gpu1.uuid"] == "GPU-1"
    assert inst.labels == {"rack": "r7"}
    assert len(inst.hardware_fingerprint) == 32


def test_agent_counters_become_ki_agent_metrics():
    d = Deriver("host-1").derive(
        np.zeros(0, RECORD_DTYPE), counters={"ring_dropped": 5, "rss_kb": 2, "brand_new": 1}, now_ns=T0
    )
    s = _samples(d)
    assert _find(s, "ki_agent_ring_dropped_total", instance="host-1") == [(T0 // 1_000_000, 5.0)]
    assert _find(s, "ki_agent_resident_memory_bytes") == [(T0 // 1_000_000, 2048.0)]
    assert _find(s, "ki_agent_brand_new") == [(T0 // 1_000_000, 1.0)]
    assert agent_metric_name("drain_lag_ns") == ("ki_agent_drain_lag_seconds", 1e-9)


def test_nanosecond_counters_become_exact_decimal_seconds():
    # 1000 * 1e-9 is 1.0000000000000002e-06, a full-precision float; 1000 / 1e9 is 1e-06 (m / 10**9).
    d = Deriver("host-1").derive(np.zeros(0, RECORD_DTYPE), counters={"drain_lag_ns": 1000}, now_ns=T0)
    assert _find(_samples(d), "ki_agent_drain_lag_seconds") == [(T0 // 1_000_000, 1e-06)]


def test_agent_series_stamps_are_1_ms_apart_per_batch():
    """Batches sharing a header time (the parts of one histogram export) or a receive time (one
    backlog request) give the agent's series one sample each, never two at one millisecond; a
    batch whose newest record is older than the previous batch's is still stamped after it, so
    its (larger) counters never read as a reset."""
    d = Deriver("host-1")
    got = []
    for k, (t, recv) in enumerate(
        [(T0, T0 + 5), (T0 + 300_000, T0 + 7), (T0 - 10**9, T0 + 9), (T0 + 10**9, T0 + 2 * 10**9)]
    ):
        s = _samples(
            d.derive(
                np.zeros(0, RECORD_DTYPE), counters={"batches_sealed": k + 1}, now_ns=t, received_ns=recv
            )
        )
        got.append(
            (_find(s, "ki_agent_batches_sealed_total"), [ts for ts, _ in _find(s, "ki_ingest_lag_seconds")])
        )
    ms = T0 // 1_000_000
    assert got == [
        ([(ms, 1.0)], [ms]),
        ([(ms + 1, 2.0)], [ms + 1]),
        ([(ms + 2, 3.0)], [ms + 2]),
        ([(ms + 1000, 4.0)], [ms + 2000]),  # a later batch time is kept as it is
    ]


def test_wrong_dtype_is_refused():
    with pytest.raises(TypeError, match="RECORD_DTYPE"):
        Deriver("h").derive(np.zeros(3, dtype=np.uint8))


def test_every_metric_id_and_derived_metric_is_documented():
    text = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    for s in METRIC_SPECS.values():
        assert f"`{s.name}`" in text, s.name
        assert f"| {int(s.id)} |" in text, s.id
    for name in (
        "kernel_launches_total",
        "kernel_execution_time_seconds",
        "kernel_execution_time_seconds_total",
        "gpu_memory_free_ratio",
        "gpu_throttled",
        "nccl_op_latency_seconds",
        "kernel_errors_total",
        "ki_agent_ring_dropped_total",
        "cuda_launch_calls_total",
        "gpu_memory_operations_total",
        "cuda_syncs_total",
    ):
        assert f"`{name}`" in text, name


def test_ring_to_store_to_kql(ring, tmp_path):
    import time as _time

    from kernel_insight.collector.clickhouse.store import EmbeddedStore
    from kernel_insight.kql.storage import Matcher

    now = _time.time_ns()
    k = ring.intern("gemm")
    for i in range(5):
        ring.kernel(k, 0, now + i * 1000, now + i * 1000 + 500, 7, i)
    ring.error(ErrorKind.NCCL_TIMEOUT, 0, now, 1)
    d = Deriver("host-1").derive(_drain(ring), now_ns=now)
    with EmbeddedStore(tmp_path / "d") as store:
        assert store.insert_batch(
            "host-1:0", samples=d.samples, spans=d.spans, events=d.events, instances=d.instances
        )
        (series,) = store.storage().select(
            [Matcher("__name__", "=", "kernel_launches_total"), Matcher("kernel", "=", "gemm")],
            now // 1_000_000 - 1000,
            now // 1_000_000 + 1000,
        )
        assert series.values.tolist() == [5.0]
        assert store.row_count("kernel_spans") == 5
        assert store.row_count("events") == 1
        assert [e["kind"] for e in recent_events(store, "host-1", 10)] == ["nccl_timeout"]
        assert [i["id"] for i in instance_rows(store)] == ["host-1"]


def test_simulated_records_label_every_series_and_the_instance() -> None:
    from kernel_insight.agent import RECORD_DTYPE as DT

    rec = np.zeros(1, dtype=DT)
    rec["type"] = 6  # GPU_SAMPLE
    rec["flags"] = 0x02  # SIMULATED
    rec["id"] = 4  # temperature
    rec["ts_ns"] = 1_700_000_000_000_000_000
    rec["payload"] = np.frombuffer(struct.pack("<dQ16x", 61.0, 0), dtype="V32")
    d = Deriver("sim-1")
    out = d.derive(rec, now_ns=1_700_000_000_000_000_000)
    assert all(dict(labels).get("simulated") == "true" for labels in out.samples.series)
    assert out.instances[0].labels["simulated"] == "true"


def test_the_agents_own_series_are_one_per_agent_before_and_after_simulated_records() -> None:
    """Issue 33: ``ki run``'s agent sends a batch before the simulator's first record; its
    ``ki_agent_*`` series then came twice, without and with ``simulated="true"``. The agent's
    counters and ingest lag are the agent process's own (never simulated): one series each."""
    from kernel_insight.agent import RECORD_DTYPE as DT

    d = Deriver("sim-1")
    first = d.derive(np.zeros(0, DT), counters={"records_read": 0.0}, now_ns=T0, received_ns=T0)
    rec = np.zeros(1, dtype=DT)
    rec["type"] = 6  # GPU_SAMPLE
    rec["flags"] = 0x02  # SIMULATED
    rec["id"] = 4  # temperature
    rec["ts_ns"] = T0 + 10**9
    rec["payload"] = np.frombuffer(struct.pack("<dQ16x", 61.0, 0), dtype="V32")
    later = d.derive(rec, counters={"records_read": 1.0}, now_ns=T0 + 10**9, received_ns=T0 + 10**9)

    def agent_series(out):
        return {
            labels
            for labels in out.samples.series
            if dict(labels)["__name__"].startswith(("ki_agent_", "ki_ingest"))
        }

    assert agent_series(first) == agent_series(later)
    assert len(agent_series(later)) == 2  # ki_agent_records_read_total and the ingest lag
    assert all("simulated" not in dict(labels) for labels in agent_series(later))
    # the GPU's own data is still marked
    temp = [
        labels for labels in later.samples.series if dict(labels)["__name__"] == "gpu_temperature_celsius"
    ]
    assert temp
    assert all(dict(labels)["simulated"] == "true" for labels in temp)


def test_launch_aggregates_become_named_counters_and_a_histogram() -> None:
    from kernel_insight.agent import RECORD_DTYPE as DT

    recs = np.zeros(4, dtype=DT)
    ts = 1_700_000_000_000_000_000
    name = b"gemm_kernel"
    recs[0]["type"], recs[0]["id"], recs[0]["flags"], recs[0]["ts_ns"] = 9, 5, 0x80, ts  # STRING id 5
    recs[0]["payload"] = np.frombuffer(name.ljust(32, b"\0"), dtype="V32")[0]
    for i, (metric, value, aux) in enumerate([(25, 10.0, 5), (26, 0.002, 5), (27, 7.0, 5 | 3 << 32)], 1):
        recs[i]["type"], recs[i]["id"], recs[i]["ts_ns"] = 6, metric, ts
        recs[i]["payload"] = np.frombuffer(struct.pack("<dQ16x", value, aux), dtype="V32")[0]
    recs["producer"] = 1
    out = Deriver("h").derive(recs, now_ns=ts)
    got = {
        (dict(labels)["__name__"], dict(labels).get("le")): dict(labels).get("kernel")
        for labels in out.samples.series
    }
    assert got[("cuda_launch_api_calls_total", None)] == "gemm_kernel"
    assert got[("cuda_launch_host_seconds_total", None)] == "gemm_kernel"
    assert got[("cuda_launch_host_seconds_bucket", "+Inf")] == "gemm_kernel"
    assert got[("cuda_launch_host_seconds_bucket", repr(2.0**4 / 1e9))] == "gemm_kernel"


# ---- the columnar pass against the per-record reference ---------------------------------

_PAYLOAD_FMT = {
    1: "<QQQI4x",
    2: "<II3I3I",
    3: "<QQIIi4x",
    4: "<QQQII",
    5: "<QQII8x",
    6: "<dQ16x",
    7: "<Q24x",
    8: "<qQII8x",
}


def _random_batch(rng: np.random.Generator, n: int, t0: int) -> np.ndarray:
    """Valid records of every shipped type, names from a small table so series repeat."""
    recs = np.zeros(n, dtype=RECORD_DTYPE)
    for i in range(n):
        t = int(rng.choice([1, 1, 1, 2, 3, 4, 5, 6, 6, 6, 7, 8]))
        ts = t0 + int(rng.integers(0, 10**9))
        dev = int(rng.integers(0, 3))
        producer = int(rng.integers(1, 3))
        flags = int(rng.choice([0, 0, 0, 1]))
        if t == 1:
            ident, p = int(rng.integers(1, 6)), (ts + int(rng.integers(0, 10**7)), 7, i, 42)
        elif t == 2:
            ident, p = int(rng.integers(1, 6)), (42, 43, 1, 1, 1, 128, 1, 1)
        elif t == 3:
            ident, p = int(rng.integers(1, 6)), (0x1000, int(rng.integers(0, 1 << 40)), 42, 43, 0)
        elif t == 4:
            ident, p = (
                int(rng.integers(1, 11)),
                (int(rng.integers(0, 1 << 40)), int(rng.integers(0, 10**9)), 5, 0, 8),
            )
        elif t == 5:
            ident, p = int(rng.integers(1, 4)), (int(rng.integers(0, 10**9)), 7, 42, 43)
        elif t == 6:
            ident = int(rng.choice([1, 2, 3, 3, 4, 16, 20, 21, 25, 26, 27, 9999]))
            value = float(rng.integers(0, 1 << 9)) if ident == 20 else float(rng.normal(1e9, 1e8))
            aux = int(rng.integers(1, 6)) | (int(rng.integers(0, 40)) << 32 if ident == 27 else 0)
            p = (value, aux)
        elif t == 7:
            ident = int(rng.choice([1, 2, 5, 9]))
            p = (int(rng.integers(1, 6)) if ident in (1, 2) else int(rng.integers(1, 1 << 40)),)
            if ident in (1, 2):
                flags |= 0x40
        else:
            ident, p = int(rng.integers(1, 8)), (int(rng.integers(-5, 100)), 0, 1234, int(rng.integers(0, 6)))
        recs[i] = (i, producer, 0, t, flags, dev, ident, ts, struct.pack(_PAYLOAD_FMT[t], *p))
    return recs


def _normalized(d):
    samples = {}
    b = d.samples
    for i, labels in enumerate(b.series):
        mask = b.series_idx == i
        samples[labels] = sorted(zip(b.ts_ms[mask].tolist(), b.values[mask].tolist(), strict=True))
    spans = (
        d.spans.instance,
        d.spans.kernel,
        d.spans.gpu.tolist(),
        d.spans.stream.tolist(),
        d.spans.start_ns.tolist(),
        d.spans.end_ns.tolist(),
        d.spans.correlation.tolist(),
        d.spans.pid.tolist(),
    )
    return samples, spans, d.events, d.instances, d.unknown_records


@pytest.mark.parametrize("seed", range(12))
def test_columnar_derive_matches_the_per_record_reference(seed) -> None:
    import derive_reference

    rng = np.random.default_rng(seed)
    names = {(p, s): f"kernel_{s % 3}" for p in (1, 2) for s in range(1, 6)}  # ids share names
    new, old = Deriver("host-1"), derive_reference.Deriver("host-1")
    for k in range(3):  # running totals, names and memory totals carry across batches
        recs = _random_batch(rng, int(rng.integers(1, 300)), T0 + k * 10**9)
        counters = {"ring_dropped": float(k), "rss_kb": 10.0}
        # Batch times a second apart, as the records': the reference does not model the 1 ms
        # apart the agent's series of batches within one millisecond get (test_agent_series_stamps_are_1_ms_apart_per_batch).
        got = new.derive(recs, strings=names, counters=counters, now_ns=T0 + k * 10**9)
        want = old.derive(recs, strings=names, counters=counters, now_ns=T0 + k * 10**9)
        assert _normalized(got) == _normalized(want)
        assert got.dropped == {}


def test_names_are_bounded_per_agent(monkeypatch) -> None:
    """One agent cannot grow the collector's memory without end by sending ever more names."""
    from kernel_insight.collector import derive

    monkeypatch.setattr(derive, "NAMES_MAX_BYTES", 100)
    d = Deriver("h")
    out = d.derive(np.zeros(0, RECORD_DTYPE), strings={(1, i): "x" * 30 for i in range(5)}, now_ns=T0)
    assert out.dropped == {"names_over_limit": 2}
    assert d._name(1, 2) == "x" * 30
    assert d._name(1, 3) is None


def test_fingerprints_are_bounded_per_agent(monkeypatch) -> None:
    from kernel_insight.collector import derive

    monkeypatch.setattr(derive, "MAX_FINGERPRINT_FIELDS", 3)
    monkeypatch.setattr(derive, "MAX_FINGERPRINT_GPUS", 2)
    recs = np.zeros(8, RECORD_DTYPE)
    recs["type"] = 7  # FINGERPRINT
    recs["ts_ns"] = T0
    recs["id"] = [100, 101, 102, 103, 100, 100, 100, 104]  # fields unknown to this collector
    recs["device"] = [0, 0, 0, 0, 1, 2, 3, 1]
    out = Deriver("h").derive(recs, now_ns=T0)
    assert out.dropped == {"fingerprint_over_limit": 3}  # gpu0's 4th field, gpus 2 and 3
    (inst,) = out.instances
    assert inst.gpu_count == 2
    assert sorted(inst.attributes) == [
        "gpu0.field_100",
        "gpu0.field_101",
        "gpu0.field_102",
        "gpu1.field_100",
        "gpu1.field_104",
    ]


def test_probe_launches_become_the_host_side_of_their_spans_even_a_batch_later(ring):
    step = ring.intern("train_step")
    ring.launch(step, 0, T0, 42, 7)  # a driver launch call (eBPF): counted, never attached
    ring.launch_span(step, 0, T0 + 100, 42, 7, 5, 900)
    ring.kernel(step, 0, T0 + 1000, T0 + 3000, 3, 5, 42)
    ring.launch_span(step, 1, T0 + 200, 42, 8, 6, 50)  # its kernel comes in the next batch
    ring.launch_span(step, 0, T0 + 300, 43, 9, 5, 70)  # same correlation, another process
    deriver = Deriver("host-1")
    d = deriver.derive(_drain(ring), now_ns=T0)
    assert d.spans.launch_ns.tolist() == [T0 + 100]
    assert d.spans.launch_host_ns.tolist() == [900]
    assert d.spans.tid.tolist() == [7]
    assert _find(_samples(d), "cuda_launch_calls_total", gpu="0") == [(T0 // 10**6, 1.0)]
    ring.kernel(step, 1, T0 + 2000, T0 + 2500, 3, 6, 42)
    ring.kernel(step, 0, T0 + 2100, T0 + 2600, 3, 5, 43)
    ring.kernel(step, 0, T0 + 2200, T0 + 2700, 3, 99, 42)  # no launch known
    d = deriver.derive(_drain(ring), now_ns=T0)
    assert d.spans.launch_ns.tolist() == [T0 + 200, T0 + 300, 0]
    assert d.spans.tid.tolist() == [8, 9, 0]


def test_the_nvtx_range_of_a_launch_is_stored_with_its_span(ring):
    """The CUPTI probe's LAUNCH_SPAN names the NVTX range around the launch in block x (a string
    id of its producer): the span gets the range's text; no range (0) or an id whose STRING never
    came gives ""."""
    gemm = ring.intern("gemm")
    layer = ring.intern("layer.3")

    def launch_span(corr: int, range_id: int) -> None:
        # ki_rec: type, flags, device, id, ts_ns; launch: pid, tid, grid[3], block[3] (docs/ring.md)
        rec = struct.pack("<BBHIQ8I", 2, 0x04, 0, gemm, T0 + corr, 42, 7, corr, 0, 10, range_id, 0, 0)
        assert ring.write_raw(rec) == 0

    launch_span(1, layer)
    launch_span(2, 0)
    launch_span(3, 999)  # no such string
    for corr in (1, 2, 3):
        ring.kernel(gemm, 0, T0 + 1000 * corr, T0 + 1000 * corr + 500, 3, corr, 42)
    d = Deriver("host-1").derive(_drain(ring), now_ns=T0)
    assert d.spans.nvtx is not None
    codes, ranges = d.spans.nvtx
    assert [ranges[i] for i in codes.tolist()] == ["layer.3", "", ""]
    assert d.spans.tid.tolist() == [7, 7, 7]


def test_the_order_across_record_types_does_not_change_what_is_derived(ring):
    """The sink hands derive the records grouped by type (DecodedBatch.by_type, no sort by position):
    the rows must be those of the same records in ring order."""
    gemm = ring.intern("gemm_bf16")
    for i in range(3):
        ring.sample(MetricId.MEMORY_TOTAL, 0, T0 + i * 10, 80e9)
        ring.kernel(gemm, 0, T0 + i * 10 + 1, T0 + i * 10 + 5, 7, i, 42)
        ring.sample(MetricId.MEMORY_FREE, 0, T0 + i * 10 + 2, 20e9 + i)
        ring.memop(MemopKind.ALLOC, 0, T0 + i * 10 + 3, 0x1000 + i, 1 << 20, 42)
        ring.error(ErrorKind.XID, 0, T0 + i * 10 + 4, 79, 0, 1234, 77)
        ring.collective(CollectiveOp.ALLREDUCE, 0, T0 + i * 10 + 6, 1 << 30, 2_000_000, 5, 0, 8)
    records = _drain(ring)
    arrays = {int(t): records[records["type"] == t] for t in np.unique(records["type"]).tolist()}
    batch = DecodedBatch(BatchHeader(bytes(16), 1, 1, 0, T0, T0 + 100, len(records), 0, 1), arrays=arrays)
    assert len(arrays) >= 5
    assert RecordType.KERNEL in arrays
    assert not np.array_equal(batch.by_type()["pos"], batch.to_array()["pos"])  # the orders differ
    a, b = (
        Deriver("h").derive(batch.to_array(), now_ns=T0 + 100),
        Deriver("h").derive(batch.by_type(), now_ns=T0 + 100),
    )
    assert _samples(a) == _samples(b)
    assert a.spans.kernel == b.spans.kernel == ["gemm_bf16"] * 3
    assert a.spans.start_ns.tolist() == b.spans.start_ns.tolist()
    assert a.events == b.events
    assert len(a.events) == 3
    assert a.calls.start_ns.tolist() == b.calls.start_ns.tolist()
    assert len(a.calls) == 6
