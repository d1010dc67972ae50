"""Histogram increments (wire body version 4, issue 14): decoding, rebuilding them into the cumulative
histograms the agent holds, exactly-once, and the snapshot request when a base is missing."""

from __future__ import annotations

import http.client
import random
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
from support.collector import start_collector, stop_collector

from kernel_insight.agent.records import RECORD_DTYPE
from kernel_insight.collector import hist_base, wire
from kernel_insight.collector.derive import Deriver
from kernel_insight.collector.hist_base import BASE_MIN_COUNT
from kernel_insight.collector.keys import KeyStore
from kernel_insight.collector.wire_hist import (
    HistKind,
    HistRow,
    WireHistograms,
    decode_histograms,
    encode_histograms,
)

T0 = 1_700_000_000 * 10**9
S = 10**9

Buckets = dict[int, int]


@pytest.fixture(autouse=True)
def _every_export_a_base(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rebuilding tests use small counts: every export is a base in process here (the real
    collector's test, a separate process, keeps the real rule and counts above it)."""
    monkeypatch.setattr(hist_base, "BASE_MIN_COUNT", 1)


def make_buckets(b: Buckets) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
    """client_golang makeBuckets, written out again here (gaps of up to two buckets filled)."""
    spans: list[list[int]] = []
    deltas: list[int] = []
    prev = nxt = 0
    for i in sorted(k for k, c in b.items() if c):
        gap = i - nxt
        if not spans or gap > 2:
            spans.append([gap, 0])
        else:
            for _ in range(gap):
                spans[-1][1] += 1
                deltas.append(-prev)
                prev = 0
        spans[-1][1] += 1
        deltas.append(b[i] - prev)
        prev, nxt = b[i], i + 1
    return tuple((o, n) for o, n in spans), tuple(deltas)


def row(
    cum: Buckets,
    zc: int,
    count: int,
    total: float,
    *,
    base: tuple[Buckets, int, int] | None = None,
    first: bool = False,
    schema: int = 3,
    ident: int = 7,
) -> HistRow:
    """A kernel histogram's row: cumulative, or (with base = (buckets, zero count, count)) the increment over it."""
    if base is not None:
        bb, bz, _ = base
        cum = {i: c - bb.get(i, 0) for i, c in cum.items() if c - bb.get(i, 0)}
        zc -= bz
    spans, deltas = make_buckets(cum)
    return HistRow(HistKind.KERNEL, producer=1, id=ident, gpu=0, pid=42, stream=3, schema=schema, zero_count=zc,
                   count=count, sum=total, pos_spans=spans, pos_deltas=deltas, first=first,
                   increment=base is not None, count_inc=0 if base is None else count - base[2])  # fmt: skip


def _header() -> wire.BatchHeader:
    return wire.BatchHeader(bytes(16), 1, 1, 0, 0, 2**63, 0, 0, wire.COMPRESSION_NONE)


def decode(rows: list[HistRow], ts_ns: int, version: int = 4) -> WireHistograms:
    data = encode_histograms(ts_ns, rows, version)
    r = wire._Reader(data, "HISTOGRAMS")
    out = decode_histograms(r, _header(), wire.DEFAULT_LIMITS, version)
    assert r.done()
    return out


def derive(
    d: Deriver, rows: list[HistRow], ts_ns: int, version: int = 4, epoch: int = 5
) -> tuple[list[dict], dict]:  # type: ignore[type-arg]
    out = d.derive(np.zeros(0, dtype=RECORD_DTYPE), strings={(1, 7): "gemm", (1, 8): "attn"}, now_ns=ts_ns,
                   histograms=decode(rows, ts_ns, version), body_version=version, epoch=epoch)  # fmt: skip
    s = out.samples
    values = {dict(s.series[int(s.series_idx[i])])["__name__"]: float(s.values[i]) for i in range(len(s))}
    return [out.histograms.row(i) for i in range(len(out.histograms))], {**values, **out.dropped}


def grow(rng: random.Random, b: Buckets, n: int) -> tuple[Buckets, int]:
    """n more long-tailed observations: most near bucket 0, a few far out (new buckets appear)."""
    out, zero = dict(b), 0
    for _ in range(n):
        if rng.random() < 0.02:
            zero += 1
            continue
        i = int(rng.expovariate(0.3)) - 5 + (rng.randrange(40) if rng.random() < 0.01 else 0)
        out[i] = out.get(i, 0) + 1
    return out, zero


def test_increments_rebuild_exactly_what_snapshots_would_have_stored() -> None:
    """Agent side simulated: a snapshot, then increments only; the collector's rows equal, field for
    field, those of a collector that got a cumulative (version 3) section every time."""
    rng = random.Random(14)
    inc_d, ref_d = Deriver("host-1"), Deriver("host-1")
    cum: Buckets = {}
    zc = count = 0
    total = 0.0
    last: tuple[Buckets, int, int] | None = None
    for step in range(30):
        n = rng.choice((1, 5, 200, 1000))
        cum, z = grow(rng, cum, n)
        zc, count, total = zc + z, count + n, total + n * 1e-4
        ts = T0 + step * S
        want, want_values = derive(ref_d, [row(cum, zc, count, total, first=step == 0)], ts, version=3)
        got, values = derive(inc_d, [row(cum, zc, count, total, base=last, first=step == 0)], ts)
        assert got == want
        assert values == want_values  # kernel_launches_total and friends from the cumulative counts
        last = (dict(cum), zc, count)
    assert values["kernel_launches_total"] == count


def test_an_increment_without_its_base_is_left_out_and_the_snapshot_brings_the_counts_back() -> None:
    d = Deriver("host-1")
    cum = {0: 5, 3: 2}
    rows, values = derive(d, [row({0: 6, 3: 2, 9: 1}, 0, 9, 1.0, base=(cum, 0, 7))], T0)
    assert rows == []  # a collector that never saw count 7 cannot rebuild it
    assert values["histogram_without_base"] == 1
    assert "kernel_launches_total" not in values
    assert d.snapshot_wanted
    rows, values = derive(d, [row({0: 8, 3: 2, 9: 1}, 0, 11, 1.5)], T0 + S)
    assert rows[0]["count"] == 11
    assert rows[0]["positive_buckets"][0] == 8.0
    assert values["kernel_launches_total"] == 11  # nothing counted was lost, one point is


def test_a_retried_batch_rebuilds_the_same_histogram_and_never_adds_twice() -> None:
    d = Deriver("host-1")
    a, b, c = {0: 1}, {0: 3, 2: 1}, {0: 4, 2: 1, 5: 2}
    derive(d, [row(a, 0, 1, 0.1, first=True)], T0)
    first, _ = derive(d, [row(b, 0, 4, 0.4, base=(a, 0, 1))], T0 + S)
    derive(d, [row(c, 0, 7, 0.7, base=(b, 0, 4))], T0 + 2 * S)  # derived before the retry (pipelined)
    again, _ = derive(d, [row(b, 0, 4, 0.4, base=(a, 0, 1))], T0 + S)
    assert again == first
    assert first[0]["positive_buckets"] == (3.0, 0.0, 1.0)
    assert not d.snapshot_wanted


def test_an_increment_over_another_schema_or_series_has_no_base() -> None:
    d = Deriver("host-1")
    derive(d, [row({0: 2}, 0, 2, 0.2, first=True)], T0)
    rows, values = derive(d, [row({0: 3}, 0, 3, 0.3, base=({0: 2}, 0, 2), schema=2)], T0 + S)
    assert rows == []
    assert values["histogram_without_base"] == 1
    rows, values = derive(d, [row({0: 3}, 0, 3, 0.3, base=({0: 2}, 0, 2), ident=8)], T0 + S)
    assert rows == []
    assert values["histogram_without_base"] == 1
    rows, _ = derive(d, [row({0: 3}, 0, 3, 0.3, base=({0: 2}, 0, 2))], T0 + S, epoch=6)  # another agent run
    assert rows == []


def _mutate(**kw: object) -> bytes:
    base = {"kind": HistKind.KERNEL, "count": 3, "sum": 1.0, "pos_spans": ((0, 1),), "pos_deltas": (1,),
            "increment": True, "count_inc": 1}  # fmt: skip
    return encode_histograms(T0, [HistRow(**{**base, **kw})], 4)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("section", "version", "message"),
    [
        (_mutate(first=True), 4, "first export cannot be an increment"),
        (_mutate(count_inc=4), 4, "count_inc"),
        (_mutate(increment=False), 4, "count_inc"),
        (_mutate(count_inc=0, increment=False), 3, "HISTOGRAMS"),  # a version 4 section in a version 3 body
    ],
)
def test_malformed_increment_sections_are_refused(section: bytes, version: int, message: str) -> None:
    def read() -> None:
        r = wire._Reader(section, "HISTOGRAMS")
        decode_histograms(r, _header(), wire.DEFAULT_LIMITS, version)
        if not r.done():
            raise wire.MalformedBatch("bytes left over")

    with pytest.raises(wire.MalformedBatch, match=message):
        read()


def test_the_increment_flag_is_refused_below_version_4() -> None:
    section = encode_histograms(
        T0, [HistRow(HistKind.KERNEL, count=1, sum=1.0, pos_spans=((0, 1),), pos_deltas=(1,))]
    )
    flagged = bytearray(section)
    # the flags column of one histogram: find its single 0 byte after the 6 key columns and set 0x02
    r = wire._Reader(section, "h")
    r.varint(), r.varint()
    for _ in range(6):
        r.take(r.varint())
    assert r.varint() == 1
    flagged[r.pos] = 0x02
    with pytest.raises(wire.MalformedBatch, match="unknown flags"):
        decode_histograms(wire._Reader(bytes(flagged), "h"), _header(), wire.DEFAULT_LIMITS, 3)


def _post(url: str, frame: bytes) -> tuple[int, dict[str, str]]:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        conn.request("POST", wire.INGEST_PATH, frame, {"Content-Type": wire.CONTENT_TYPE})
        resp = conn.getresponse()
        resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def test_the_real_collector_stores_rebuilt_increments_once_and_asks_for_a_snapshot(tmp_path: Path) -> None:
    """`ki collector` on loopback: v4 frames over HTTP, the stored cumulative histograms read back from chDB."""
    enrolled = KeyStore(tmp_path / "keys.json").add_agent("inc")
    aid, key = enrolled.agent_id, enrolled.key
    n = BASE_MIN_COUNT  # bases hold at least this many observations (docs/wire.md)
    a, b, c = {0: n, 4: 1}, {0: n + 3, 4: 1, 6: 2}, {0: n + 4, 4: 3, 6: 2}

    now = time.time_ns() // S * S  # inside the store's retention

    def frame(seq: int, rows: list[HistRow], epoch: int = 9) -> bytes:
        ts = now + seq * S
        return wire.encode_batch(np.zeros(0, dtype=RECORD_DTYPE), agent_id=aid, key_id=enrolled.key_id, key=key,
                                 epoch=epoch, seq=seq, strings={(1, 7): "gemm"}, now_ns=ts, body_version=4,
                                 histograms=encode_histograms(ts, rows, 4), histograms_ts_ns=ts)  # fmt: skip

    proc, url = start_collector(tmp_path)
    try:
        status, headers = _post(url, frame(0, [row(a, 0, n + 1, 0.3, first=True)]))
        assert status == 200
        assert "ki-histogram-snapshot" not in headers
        inc = frame(1, [row(b, 0, n + 6, 0.8, base=(a, 0, n + 1))])
        assert _post(url, inc)[0] == 200
        assert _post(url, inc)[0] == 409  # a retry is not stored (nor added) again
        status, headers = _post(
            url, frame(2, [row(c, 0, n + 9, 1.1, base=({0: 1}, 0, 1))])
        )  # a base never sent
        assert status == 200  # the batch is good; its increment alone is left out
        assert headers.get("ki-histogram-snapshot") == "1"
        status, headers = _post(url, frame(3, [row(c, 0, n + 9, 1.1, base=(b, 0, n + 6))]))
        assert status == 200
        assert "ki-histogram-snapshot" not in headers  # asked once, not on every answer
    finally:
        stop_collector(proc)
    from kernel_insight.collector.clickhouse.store import EmbeddedStore

    store = EmbeddedStore(tmp_path / "data")
    try:
        got = store.query(
            "SELECT ts, count, positive_span_offsets AS po, positive_span_lengths AS pl, positive_counts AS pc"
            " FROM ki.histograms WHERE metric = 'kernel_duration_seconds' ORDER BY ts"
        ).to_pylist()
    finally:
        store.close()
    assert [h["count"] for h in got] == [n + 1, n + 6, n + 9]  # seq 2's point is the one lost
    spans, deltas = make_buckets(c)
    want = np.cumsum(deltas).tolist()
    assert (list(zip(got[-1]["po"], got[-1]["pl"], strict=True)), [int(x) for x in got[-1]["pc"]]) == (
        [tuple(s) for s in spans],
        want,
    )


def test_only_exports_of_at_least_base_min_count_observations_are_kept_as_bases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wire's rule: an agent increments only over exports of >= 4,096 observations, so a
    collector keeps no base for a lighter one (an agent's rarely launched kernels cost nothing)."""
    monkeypatch.setattr(hist_base, "BASE_MIN_COUNT", BASE_MIN_COUNT)
    n = BASE_MIN_COUNT
    d = Deriver("host-1")
    rows, _ = derive(d, [row({0: 10}, 0, 10, 0.1, first=True)], T0)
    assert [r["count"] for r in rows] == [10]  # stored as ever
    assert len(d.hist_bases) == 0
    rows, values = derive(d, [row({0: 11}, 0, 11, 0.1, base=({0: 10}, 0, 10))], T0 + S)
    assert rows == []  # no agent sends this one
    assert values["histogram_without_base"] == 1
    derive(d, [row({0: n, 2: 1}, 0, n + 1, 0.5)], T0 + 2 * S)
    assert len(d.hist_bases) == 1
    rows, _ = derive(d, [row({0: n + 2, 2: 1}, 0, n + 3, 0.6, base=({0: n, 2: 1}, 0, n + 1))], T0 + 3 * S)
    assert [r["count"] for r in rows] == [n + 3]
    rows, _ = derive(d, [row({0: 5}, 0, 5, 0.1, first=True)], T0 + 4 * S)  # the series starts again
    assert len(d.hist_bases) == 0
