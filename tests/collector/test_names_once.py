"""Names once (wire body version 5, issue 14): batches leave out names their agent sent before, a
NAMES_USED digest lets the collector check its copies, and a collector that cannot match them
answers 424 so that the agent sends its names and the batch again (docs/wire.md, "Names once")."""

from __future__ import annotations

import http.client
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
from support.collector import start_collector, stop_collector

from kernel_insight.agent.records import (
    ERROR_PAYLOAD,
    FINGERPRINT_PAYLOAD,
    RECORD_DTYPE,
    RecordFlag,
    RecordType,
)
from kernel_insight.collector import wire
from kernel_insight.collector.derive import Deriver
from kernel_insight.collector.keys import KeyStore
from kernel_insight.collector.wire_hist import (
    HistKind,
    HistRow,
    WireHistograms,
    decode_histograms,
    encode_histograms,
)

S = 10**9
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
ATTN = "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>(Flash_fwd_params)"
NAMES = {(1, 7): GEMM, (1, 8): ATTN}


def digest(names: dict[tuple[int, int], str]) -> int:
    out = 0
    for (p, i), text in names.items():
        out ^= wire.name_hash(p, i, text.encode())
    return out


def kernels(ts_ns: int, ids: list[int]) -> np.ndarray:
    """KERNEL records (kept spans) of producer 1 naming ``ids``."""
    recs = np.zeros(len(ids), dtype=RECORD_DTYPE)
    recs["type"] = RecordType.KERNEL
    recs["producer"] = 1
    recs["id"] = ids
    recs["pos"] = np.arange(len(ids))
    recs["ts_ns"] = ts_ns
    payload = np.zeros((len(ids), 32), dtype=np.uint8)
    payload[:, 0:8] = np.frombuffer(
        np.full(len(ids), ts_ns + 20_000, dtype="<u8").tobytes(), np.uint8
    ).reshape(-1, 8)
    recs["payload"] = payload.view("V32").reshape(-1)
    return recs


def hist_row(ident: int, count: int, first: bool = False) -> HistRow:
    return HistRow(HistKind.KERNEL, producer=1, id=ident, gpu=0, pid=42, stream=3, schema=3, zero_count=0,
                   count=count, sum=0.001 * count, pos_spans=((0, 1),), pos_deltas=(count,), first=first)  # fmt: skip


def section(ts_ns: int, rows: list[HistRow]) -> WireHistograms:
    data = encode_histograms(ts_ns, rows, 4)
    header = wire.BatchHeader(bytes(16), 1, 1, 0, 0, 2**63, 0, 0, wire.COMPRESSION_NONE)
    return decode_histograms(wire._Reader(data, "HISTOGRAMS"), header, wire.DEFAULT_LIMITS, 5)


def test_the_digest_matches_names_sent_before_and_nothing_else() -> None:
    d = Deriver("host-1")
    ts = 1_700_000_000 * S
    d.derive(kernels(ts, [7, 8]), strings=NAMES, now_ns=ts, body_version=5)
    recs, hist = kernels(ts + S, [7]), section(ts + S, [hist_row(8, 10, first=True)])
    assert d.names_match(recs, {}, {}, hist, digest(NAMES))  # both left out, both held
    assert not d.names_match(recs, {}, {}, hist, digest({(1, 7): GEMM}))  # the histogram's name counts too
    assert not d.names_match(recs, {}, {}, hist, digest({(1, 7): GEMM, (1, 8): "other text"}))
    # A name the batch carries counts with its own text, whatever this collector held before.
    new = {(1, 8): "triton_poi_fused_mul_silu_2"}
    assert d.names_match(recs, new, {}, hist, digest({(1, 7): GEMM, **new}))
    # A name neither side knows (its STRING chunks were lost on the way to the agent) counts on neither side.
    assert d.names_match(kernels(ts, [7, 99]), {}, {}, None, digest({(1, 7): GEMM}))
    # A name this collector never got: no match, whatever the batch says.
    assert not d.names_match(kernels(ts, [7, 98]), {}, {}, None, digest({(1, 7): GEMM, (1, 98): "x"}))
    # Another agent's deriver holds nothing: no match.
    assert not Deriver("host-2").names_match(recs, {}, {}, hist, digest(NAMES))


def _typed(rtype: RecordType, payloads: list[bytes], flags: int = 0) -> np.ndarray:
    """Records of producer 1 of one type with the given 32-byte payloads, packed by records' own
    struct formats (the layout of docs/ring.md)."""
    recs = np.zeros(len(payloads), dtype=RECORD_DTYPE)
    recs["type"] = rtype
    recs["producer"] = 1
    recs["flags"] = flags
    recs["pos"] = np.arange(len(payloads))
    recs["payload"] = np.frombuffer(b"".join(payloads), dtype="V32")
    return recs


def test_a_batch_of_several_errors_and_string_fingerprints_is_matched_not_refused() -> None:
    """Issue 33: two or more ERROR records, or two or more FP_STRING fingerprints (the agent's
    once-a-minute fingerprint), made names_match view a strided payload column and raise, so the
    collector answered 422 and the agent dead-lettered the batch. Their name ids count as the C
    encoder counts them: ERROR's detail_id, and the fingerprint value's low 32 bits."""
    d = Deriver("host-1")
    ts = 1_700_000_000 * S
    d.derive(kernels(ts, [7, 8]), strings=NAMES, now_ns=ts, body_version=5)
    errors = _typed(RecordType.ERROR, [ERROR_PAYLOAD.pack(2, 0, 42, 7), ERROR_PAYLOAD.pack(700, 0, 42, 8)])
    fps = _typed(
        RecordType.FINGERPRINT,
        [FINGERPRINT_PAYLOAD.pack(7), FINGERPRINT_PAYLOAD.pack(8 | (5 << 32))],
        flags=RecordFlag.FP_STRING,
    )
    for recs in (errors, fps, np.concatenate([errors, fps, kernels(ts, [7])])):
        assert d.names_match(recs, {}, {}, None, digest(NAMES))
        assert not d.names_match(recs, {}, {}, None, digest({(1, 7): GEMM}))
    # A fingerprint without FP_STRING holds a number, not a name: it names nothing.
    plain = _typed(RecordType.FINGERPRINT, [FINGERPRINT_PAYLOAD.pack(7), FINGERPRINT_PAYLOAD.pack(8)])
    assert d.names_match(plain, {}, {}, None, 0)


def test_a_names_used_section_is_version_5_only_and_eight_bytes() -> None:
    header = wire.BatchHeader(bytes(16), 1, 1, 0, 0, 2**63, 0, 0, wire.COMPRESSION_NONE)
    empty = np.zeros(0, dtype=RECORD_DTYPE)
    body = wire.encode_body(empty, {(1, 7): GEMM}, body_version=5, names_digest=0x0123456789ABCDEF)
    batch = wire.decode_body(body, header)
    assert batch.names_digest == 0x0123456789ABCDEF
    assert batch.string_hashes == {(1, 7): wire.name_hash(1, 7, GEMM.encode())}
    v4 = bytearray(body)
    v4[0] = 4
    with pytest.raises(wire.MalformedBatch, match="unknown section 0x06"):
        wire.decode_body(bytes(v4), header)
    short = bytes([5, wire.SECTION_NAMES_USED, 7]) + bytes(7)
    with pytest.raises(wire.MalformedBatch):
        wire.decode_body(short, header)
    with pytest.raises(ValueError, match="body_version 5"):
        wire.encode_body(empty, body_version=4, names_digest=1)
    # Version 5 without the section: a batch that resolves alone, as versions 1-4 do.
    assert (
        wire.decode_body(wire.encode_body(empty, {(1, 7): GEMM}, body_version=5), header).names_digest is None
    )


def _post(url: str, frames: list[bytes]) -> list[int]:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        conn.request("POST", wire.INGEST_PATH, b"".join(frames), {"Content-Type": wire.FRAMES_CONTENT_TYPE})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
        return [int(s) for s in resp.getheader(wire.BATCH_STATUS_HEADER, "").split(",")]
    finally:
        conn.close()


def test_the_real_collector_resolves_left_out_names_and_answers_424_after_a_restart(tmp_path: Path) -> None:
    """`ki collector` on loopback, restarted between batches: a batch leaving out names it no longer
    holds is answered 424 and not remembered; behind a names batch the same bytes are stored, with
    the kernels' real names. Old bodies (version 4, every name in every batch) are still stored."""
    enrolled = KeyStore(tmp_path / "keys.json").add_agent("names")
    now = time.time_ns() // S * S

    def frame(seq: int, ids: list[int], strings: dict[tuple[int, int], str], *, left_out: bool, version: int = 5,
              hist: list[HistRow] | None = None) -> bytes:  # fmt: skip
        ts = now + seq * S
        used = {k: NAMES[k] for k in [(1, i) for i in ids] + [(1, r.id) for r in hist or []]}
        return wire.encode_batch(
            kernels(ts, ids), agent_id=enrolled.agent_id, key_id=enrolled.key_id, key=enrolled.key, epoch=3,
            seq=seq, strings=strings, now_ns=ts, body_version=version, names_digest=digest(used) if left_out else None,
            histograms=encode_histograms(ts, hist, 4) if hist else None, histograms_ts_ns=ts,
        )  # fmt: skip

    proc, url = start_collector(tmp_path)
    port = urllib.parse.urlsplit(url).port
    try:
        assert _post(url, [frame(0, [7, 8], NAMES, left_out=False)]) == [200]
        # Both texts left out, a histogram naming one of them: the collector holds both.
        assert _post(url, [frame(1, [7], {}, left_out=True, hist=[hist_row(8, 10, first=True)])]) == [200]
        # A version 4 body (an agent before names once) is stored as ever.
        assert _post(url, [frame(2, [7, 8], NAMES, left_out=False, version=4)]) == [200]
    finally:
        stop_collector(proc)
    proc, url = start_collector(tmp_path, "--port", str(port))
    try:
        lost = frame(3, [7, 8], {}, left_out=True)
        assert _post(url, [lost]) == [424]  # a restarted collector has no names of this agent
        assert _post(url, [lost]) == [424]  # not remembered as stored: the same bytes are answered alike
        names = frame(4, [], NAMES, left_out=False)  # the agent's names batch: no records
        assert _post(url, [names, lost]) == [200, 200]
        assert _post(url, [lost]) == [409]
    finally:
        stop_collector(proc)
    from kernel_insight.collector.clickhouse.store import EmbeddedStore

    store = EmbeddedStore(tmp_path / "data")
    try:
        got = store.query(
            "SELECT kernel, count() AS n FROM ki.kernel_spans GROUP BY kernel ORDER BY kernel"
        ).to_pylist()
    finally:
        store.close()
    assert {r["kernel"]: r["n"] for r in got} == {ATTN: 3, GEMM: 4}  # seq 0, 2, 3 (and seq 1's gemm)
