"""Kernel histograms in the agent (agent/src/kstats.c), wire v2's HISTOGRAMS section, and the
collector's decode into native histogram rows (docs/wire.md, docs/metrics.md).

From unit to whole path: the C sampler and exporter; C-encoded sections against the exact
bucket counts of client_golang's mapping (Python port); the Python encoder and decoder and their
refusals; and a C producer -> ki-agent -> ki collector -> ClickHouse run whose stored histograms
give p50/p99/p99.9 within the schema's error bound of the exact quantiles.
"""

from __future__ import annotations

import math
import os
import signal
import struct
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from support.collector import start_collector, stop_collector
from support.stored import metric_samples, metric_series
from test_agent_units import run_unit
from test_histogram import bounds_table, go_index

from bench.histogram.producer import build_producer
from kernel_insight.agent.records import RECORD_DTYPE, RecordType
from kernel_insight.agent.ring import Ring
from kernel_insight.collector import varint, wire
from kernel_insight.collector.keys import KeyStore
from kernel_insight.collector.wire_hist import (
    HIST_SECTION,
    HistKind,
    HistRow,
    WireHistograms,
    decode_histograms,
    encode_histograms,
)
from kernel_insight.kql.histogram import histogram_quantile

REPO = Path(__file__).resolve().parents[2]

T0 = 1_700_000_000 * 10**9
AID = bytes(range(16))
KEY = bytes(32)


def _header(t_min: int = 0, t_max: int = 2**63) -> wire.BatchHeader:
    return wire.BatchHeader(AID, 1, 1, 0, t_min, t_max, 0, 0, wire.COMPRESSION_NONE)


def _decode(section: bytes, header: wire.BatchHeader | None = None) -> WireHistograms:
    r = wire._Reader(section, "section")
    out = decode_histograms(r, header or _header(), wire.DEFAULT_LIMITS)
    assert r.done()
    return out


def _absolute(spans: tuple[tuple[int, int], ...], deltas: tuple[int, ...]) -> dict[int, int]:
    """Bucket index -> count from spans and deltas (gap-filling zeros dropped)."""
    out, idx, k, prev = {}, 0, 0, 0
    for i, (off, length) in enumerate(spans):
        idx = off if i == 0 else idx + off
        for _ in range(length):
            prev += deltas[k]
            k += 1
            if prev:
                out[idx] = prev
            idx += 1
    return out


def test_c_sampler_and_exporter(tmp_path: Path) -> None:
    """Tail, uniform sample, capture window, FAILED spans, other record types, export in parts."""
    run_unit(tmp_path, "test_kstats")


def test_c_sections_hold_the_exact_bucket_counts(tmp_path: Path) -> None:
    rng = np.random.default_rng(14)
    n = 30_000
    recs = np.zeros(n, dtype=RECORD_DTYPE)
    recs["pos"] = np.arange(n)
    recs["producer"] = 3
    kinds = rng.choice(
        np.array([RecordType.KERNEL, RecordType.COLLECTIVE, RecordType.MEMOP], dtype=np.uint8),
        n,
        p=[0.8, 0.1, 0.1],
    )
    recs["type"] = kinds
    recs["device"] = rng.integers(0, 2, n)
    recs["ts_ns"] = T0
    dur = (rng.lognormal(np.log(20_000), 0.6, n) * np.where(rng.random(n) < 0.01, 50, 1)).astype(
        np.uint64
    ) + 1
    name = rng.integers(1, 6, n).astype(np.uint32)
    recs["id"] = np.where(
        kinds == RecordType.MEMOP, 5, np.where(kinds == RecordType.COLLECTIVE, name % 3 + 1, name)
    )
    payload = np.zeros(n, dtype=[("a", "<u8"), ("b", "<u8"), ("c", "<u8"), ("pid", "<u4"), ("r", "<u4")])
    k = kinds == RecordType.KERNEL
    payload["a"] = np.where(k, T0 + dur, 0)  # KERNEL end_ns; COLLECTIVE bytes
    payload["b"] = np.where(
        k, name % 2, np.where(kinds == RecordType.MEMOP, dur * 64, dur)
    )  # stream / bytes / ns
    payload["pid"] = np.where(k, 42, 0)
    recs["payload"] = payload.view("V32")
    src = tmp_path / "records.bin"
    src.write_bytes(recs.tobytes())
    out = tmp_path / "sections.bin"
    stdout = run_unit(tmp_path, "test_kstats", "section", str(src), str(out))
    # No sample rate and no tail yet: every kernel span aggregated and dropped; other records kept.
    assert stdout.split() == ["ok", str(int(np.count_nonzero(kinds != RecordType.KERNEL)))]

    raw, rows = out.read_bytes(), []
    while raw:
        (length,) = struct.unpack_from("<I", raw)
        rows += _decode(raw[4 : 4 + length]).rows()
        raw = raw[4 + length :]
    bounds = bounds_table()
    want: dict[tuple[int, int, int, int | None, int], Counter[int]] = {}
    sums: dict[tuple[int, int, int, int | None, int], float] = {}
    for i in range(n):
        t, gpu = int(kinds[i]), int(recs["device"][i])
        if t == RecordType.KERNEL:
            key, v = (HistKind.KERNEL, gpu, int(name[i]), int(name[i]) % 2, 42), int(dur[i]) * 1e-9
        elif t == RecordType.COLLECTIVE:
            key, v = (HistKind.NCCL, gpu, int(name[i]) % 3 + 1, None, 0), int(dur[i]) * 1e-9
        else:
            key, v = (HistKind.MEMCPY, gpu, 0, None, 0), float(int(dur[i]) * 64)
        want.setdefault(key, Counter())[go_index(v, 3, bounds)] += 1
        sums[key] = sums.get(key, 0.0) + v
    got = {(r.kind, r.gpu, r.id, r.stream, r.pid): r for r in rows}
    assert set(got) == set(want)
    for key, buckets in want.items():
        r = got[key]
        assert r.schema == 3
        assert r.first
        assert r.neg_spans == ()
        assert r.zero_count == 0
        assert r.count == sum(buckets.values())
        assert _absolute(r.pos_spans, r.pos_deltas) == dict(buckets)
        assert math.isclose(r.sum, sums[key], rel_tol=1e-9)
        assert r.producer == (3 if key[0] == HistKind.KERNEL else 0)


def test_v2_bodies_round_trip_and_v1_stays_accepted() -> None:
    rows = [
        HistRow(HistKind.KERNEL, producer=1, id=7, gpu=0, pid=42, stream=3, count=3, sum=0.5,
                pos_spans=((-20, 2), (1, 1)), pos_deltas=(1, 0, -1), first=True),
        HistRow(HistKind.NCCL, id=1, gpu=1, schema=0, zero_threshold=1e-9, zero_count=2, count=4, sum=1.0,
                neg_spans=((0, 1),), neg_deltas=(2,)),
    ]  # fmt: skip
    section = encode_histograms(T0, rows)
    frame = wire.encode_batch(
        np.zeros(0, dtype=RECORD_DTYPE), agent_id=AID, key_id=1, key=KEY, epoch=3, seq=0,
        body_version=2, histograms=section, histograms_ts_ns=T0,
    )  # fmt: skip
    batch = wire.decode_batch(frame, KEY)
    assert batch.body_version == 2
    assert batch.histograms is not None
    assert batch.histograms.ts_ns == T0
    assert batch.histograms.rows() == rows
    v1 = wire.decode_batch(
        wire.encode_batch(
            np.zeros(0, dtype=RECORD_DTYPE), agent_id=AID, key_id=1, key=KEY, epoch=3, seq=1, now_ns=T0
        ),
        KEY,
    )
    assert v1.body_version == 1
    assert v1.histograms is None


def _mutate(**kw: object) -> bytes:
    base = dict(kind=HistKind.KERNEL, count=1, sum=1.0, pos_spans=((0, 1),), pos_deltas=(1,))
    base.update(kw)
    return encode_histograms(T0, [HistRow(**base)])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (_mutate(schema=9), "schema"),
        (_mutate(kind=4), "kind"),
        (_mutate(pos_spans=((0, 1), (-1, 1)), pos_deltas=(1, 0)), "negative offset"),
        (_mutate(zero_threshold=-1.0), "zero threshold"),
        (_mutate(gpu=1 << 16), "gpu"),
        (_mutate(pos_spans=((0, 2),)), "varints"),  # two buckets announced, one delta sent
        (_mutate()[:-1], "truncated"),
    ],
)
def test_malformed_sections_are_refused(section: bytes, message: str) -> None:
    with pytest.raises(wire.MalformedBatch, match=message):
        _decode(section)


def test_histograms_outside_the_header_time_or_in_a_v1_body_are_refused() -> None:
    with pytest.raises(wire.MalformedBatch, match="time outside"):
        _decode(_mutate(), _header(T0 + 1, T0 + 2))
    body = bytes([1]) + bytes([HIST_SECTION]) + varint.encode(len(_mutate())) + _mutate()
    with pytest.raises(wire.MalformedBatch, match="unknown section"):
        wire.decode_body(body, _header())


def _exact_quantile(sorted_ns: np.ndarray, q: float) -> float:
    """Prometheus' notion: the value of rank ceil(q * n)."""
    return float(sorted_ns[max(0, math.ceil(q * len(sorted_ns)) - 1)]) * 1e-9


def test_a_million_long_tailed_kernels_give_quantiles_within_the_schema_bound(
    tmp_path: Path, agent_bin: Path, ring_name: str
) -> None:
    """C producer -> ki-agent (histograms on) -> ki collector -> ClickHouse; then Prometheus'
    histogram_quantile (kql.histogram) over the stored histogram against the exact quantiles."""
    total = 1_000_000
    producer = build_producer(tmp_path)
    KeyStore(tmp_path / "keys.json").add_agent("hist").write_key_file(tmp_path / "agent.key")
    ring = Ring.create(ring_name, capacity=1 << 16)
    collector, url = start_collector(tmp_path)
    agent = None
    try:
        with (tmp_path / "agent.log").open("w") as log:
            agent = subprocess.Popen(
                [str(agent_bin), "--ring", ring_name, "--collector", url, "--key-file", str(tmp_path / "agent.key"),
                 "--spool-dir", str(tmp_path / "spool"), "--shutdown-timeout-s", "60", "--names-max", "64"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        durations = tmp_path / "durations.bin"
        r = subprocess.run(
            [str(producer), ring_name, str(total), "1", "0", "7", str(durations)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.strip() == f"written {total}"
        agent.send_signal(signal.SIGTERM)  # drains the ring, exports the histograms, delivers the spool
        assert agent.wait(timeout=120) == 0, (tmp_path / "agent.log").read_text()[-3000:]
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait()
        stop_collector(collector)
        ring.close()
    from kernel_insight.collector.clickhouse.store import EmbeddedStore

    store = EmbeddedStore(tmp_path / "data")
    try:
        newest = [
            (s.hist_timestamps[-1], s.histograms[-1])
            for s in metric_series(store, "kernel_duration_seconds")
            if s.histograms
        ]
        h = max(newest, key=lambda th: th[0])[1]  # the newest histogram sample of the metric
        launches = metric_samples(store, "kernel_launches_total")[-1][1]  # its newest value
        spans = store.row_count("kernel_spans")
    finally:
        store.close()
    assert h.count == total
    assert launches == total  # counted from the histograms, not from the sampled spans
    assert 0 < spans < total // 20  # tail and uniform sample only
    exact = np.sort(np.fromfile(durations, dtype="<u8"))
    assert len(exact) == total
    assert math.isclose(h.sum, float(exact.sum()) * 1e-9, rel_tol=1e-6)
    base = 2.0 ** (2.0**-h.schema)  # the schema's relative error bound: one bucket's width
    for q in (0.5, 0.99, 0.999):
        got, _ = histogram_quantile(q, h)
        want = _exact_quantile(exact, q)
        assert want / base <= got <= want * base, (q, got, want)


def test_the_agent_refuses_bad_histogram_settings(agent_bin: Path, tmp_path: Path) -> None:
    r = subprocess.run(
        [str(agent_bin), "--histogram-schema", "9", "--key-file", str(tmp_path / "k")],
        capture_output=True, text=True, timeout=30, env={k: v for k, v in os.environ.items() if not k.startswith("KI_AGENT_")},
    )  # fmt: skip
    assert r.returncode != 0
    assert "histogram_schema must be in [-4, 8]" in r.stderr


def _derive(d: object, rows: list[HistRow], ts_ns: int, epoch: int) -> tuple[object, dict[str, float]]:
    from kernel_insight.collector.derive import Deriver

    assert isinstance(d, Deriver)
    out = d.derive(
        np.zeros(0, dtype=RECORD_DTYPE), strings={(1, 7): "gemm"}, now_ns=ts_ns,
        histograms=_decode(encode_histograms(ts_ns, rows)), body_version=2, epoch=epoch,
    )  # fmt: skip
    s = out.samples
    values = {dict(s.series[int(s.series_idx[i])])["__name__"]: float(s.values[i]) for i in range(len(s))}
    return out, values


def test_the_collector_turns_sections_into_histogram_rows_and_kernel_counters() -> None:
    from kernel_insight.collector.derive import Deriver

    kernel = HistRow(HistKind.KERNEL, producer=1, id=7, gpu=0, pid=42, stream=3, count=6, sum=0.25,
                     pos_spans=((-20, 2), (2, 1)), pos_deltas=(1, 2, 0), zero_count=0, first=True)  # fmt: skip
    rows = [
        kernel,
        HistRow(
            HistKind.NCCL,
            id=1,
            gpu=1,
            schema=0,
            zero_threshold=1e-9,
            zero_count=2,
            count=5,
            sum=-1.0,
            neg_spans=((0, 1), (1, 2)),
            neg_deltas=(1, 0, 1),
        ),
        HistRow(HistKind.MEMCPY, gpu=0, count=1, sum=0.0, zero_count=1),
    ]
    d = Deriver("host-1")
    out, values = _derive(d, rows, T0, epoch=3)
    h = out.histograms  # type: ignore[attr-defined]
    assert len(h) == 3
    got = [h.row(i) for i in range(3)]
    assert dict(got[0]["labels"]) == {
        "__name__": "kernel_duration_seconds", "instance": "host-1", "gpu": "0",
        "kernel": "gemm", "pid": "42", "stream": "3",
    }  # fmt: skip
    assert got[0]["positive_spans"] == ((-20, 2), (2, 1))
    assert got[0]["positive_buckets"] == (1.0, 3.0, 3.0)
    assert got[0]["counter_reset_hint"] == 1
    assert got[0]["ts_ms"] == T0 // 10**6
    assert dict(got[1]["labels"])["op"] == "allreduce"
    assert got[1]["negative_buckets"] == (1.0, 1.0, 2.0)
    assert got[1]["positive_buckets"] == ()
    assert (got[1]["zero_count"], got[1]["zero_threshold"], got[1]["counter_reset_hint"]) == (2.0, 1e-9, 0)
    assert dict(got[2]["labels"])["__name__"] == "memcpy_bytes"
    assert got[2]["zero_count"] == 1.0
    assert values["kernel_launches_total"] == 6
    assert values["kernel_execution_time_seconds_total"] == 0.25
    # The next sample counts only the growth; an agent restart (new epoch) starts from zero.
    grown = HistRow(**{**_fields(kernel), "count": 10, "sum": 0.5, "first": False})
    _, values = _derive(d, [grown], T0 + 10**9, epoch=3)
    assert values["kernel_launches_total"] == 10
    assert values["kernel_execution_time_seconds"] == 0.25 / 4
    restarted = HistRow(**{**_fields(kernel), "count": 2, "sum": 0.1})
    _, values = _derive(d, [restarted], T0 + 2 * 10**9, epoch=4)
    assert values["kernel_launches_total"] == 12


def _fields(r: HistRow) -> dict[str, object]:
    return {f: getattr(r, f) for f in HistRow.__dataclass_fields__}
