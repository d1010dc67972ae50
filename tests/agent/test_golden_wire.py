"""Golden wire frames: the format cannot drift silently, on either side (tests/fixtures/wire/, golden_wire.py)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from golden_wire import FIXTURES, KEY, batch_json, golden_records, seal_in_c

from kernel_insight.agent.records import RecordType
from kernel_insight.collector import wire
from kernel_insight.collector.varint import encode as encode_varint


def test_committed_input_is_every_shipped_type_and_a_name():
    raw = (FIXTURES / "records.bin").read_bytes()
    assert raw == golden_records().tobytes(), "records.bin no longer matches golden_wire.golden_records()"
    types = set(np.frombuffer(raw, dtype=golden_records().dtype)["type"].tolist())
    assert types == {int(t) for t in wire.SHIPPED_TYPES} | {int(RecordType.STRING)}


def test_the_decoder_reads_the_golden_frame_as_committed():
    frame = (FIXTURES / "frame.kib").read_bytes()
    want = json.loads((FIXTURES / "frame.json").read_text())
    assert batch_json(wire.decode_batch(frame, KEY)) == want


def test_the_golden_frame_holds_its_input_records():
    frame = (FIXTURES / "frame.kib").read_bytes()
    recs = golden_records()
    shipped = recs[recs["type"] != int(RecordType.STRING)]
    assert wire.decode_batch(frame, KEY).to_array().tobytes() == shipped.tobytes()


def test_a_tampered_golden_frame_is_refused():
    frame = bytearray((FIXTURES / "frame.kib").read_bytes())
    frame[-1] ^= 1
    with pytest.raises(wire.AuthenticationFailed):
        wire.decode_batch(bytes(frame), KEY)


def test_the_c_encoder_still_seals_the_golden_frame(tmp_path):
    """Sealed from the same records by the current C sources: same header and same plaintext body.

    The nonce is epoch || seq, so sealing is deterministic; the compressed bytes (and so the
    header's payload length and the tag) depend on the zstd library's version, so the frame is
    compared after opening rather than byte for byte.
    """
    golden = (FIXTURES / "frame.kib").read_bytes()
    fresh = seal_in_c(tmp_path, FIXTURES / "records.bin")
    g_head, f_head = wire.parse_header(golden), wire.parse_header(fresh)
    assert dataclasses.replace(f_head, payload_len=0) == dataclasses.replace(g_head, payload_len=0)
    assert fresh[:20] == golden[:20]  # magic, version, AEAD, compression, flags, agent id
    assert wire.open_frame(fresh, f_head, KEY) == wire.open_frame(golden, g_head, KEY)


def test_the_decoder_reads_the_v2_golden_frame_as_committed():
    """Version 2: the same records with the kernels and NCCL operations in a HISTOGRAMS section."""
    frame = (FIXTURES / "frame_v2.kib").read_bytes()
    want = json.loads((FIXTURES / "frame_v2.json").read_text())
    got = batch_json(wire.decode_batch(frame, KEY))
    assert got == want
    assert got["body_version"] == 2
    kinds = sorted(r["kind"] for r in got["histograms"]["rows"])
    assert kinds == ["KERNEL", "KERNEL", "NCCL", "NCCL"]  # two GPUs each
    assert all(r["type"] != "KERNEL" for r in got["records"])  # no span kept: rates 0 in the encoder test
    assert [2, 42, "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkernel_gemm"] in got["strings"]


def test_the_c_encoder_still_seals_the_v2_golden_frame(tmp_path):
    golden = (FIXTURES / "frame_v2.kib").read_bytes()
    fresh = seal_in_c(tmp_path, FIXTURES / "records.bin", "v2")
    g_head, f_head = wire.parse_header(golden), wire.parse_header(fresh)
    assert dataclasses.replace(f_head, payload_len=0) == dataclasses.replace(g_head, payload_len=0)
    assert wire.open_frame(fresh, f_head, KEY) == wire.open_frame(golden, g_head, KEY)


def test_the_decoder_reads_the_v3_golden_frame_as_committed():
    """Version 3: as version 2 with both kernel spans kept, their correlation sent as the delta of
    (correlation - pos); decoded, they are the input records exactly."""
    frame = (FIXTURES / "frame_v3.kib").read_bytes()
    want = json.loads((FIXTURES / "frame_v3.json").read_text())
    batch = wire.decode_batch(frame, KEY)
    got = batch_json(batch)
    assert got == want
    assert got["body_version"] == 3
    recs = golden_records()
    kernels = recs[recs["type"] == int(RecordType.KERNEL)]
    assert batch.arrays[int(RecordType.KERNEL)].tobytes() == kernels.tobytes()
    assert sorted(r["kind"] for r in got["histograms"]["rows"]) == ["KERNEL", "KERNEL", "NCCL", "NCCL"]


def test_the_c_encoder_still_seals_the_v3_golden_frame(tmp_path):
    golden = (FIXTURES / "frame_v3.kib").read_bytes()
    fresh = seal_in_c(tmp_path, FIXTURES / "records.bin", "v3")
    g_head, f_head = wire.parse_header(golden), wire.parse_header(fresh)
    assert dataclasses.replace(f_head, payload_len=0) == dataclasses.replace(g_head, payload_len=0)
    assert wire.open_frame(fresh, f_head, KEY) == wire.open_frame(golden, g_head, KEY)


def test_the_decoder_reads_the_v4_golden_frame_as_committed():
    """Version 4: GPU 0's kernel histogram as an increment (one kernel over an earlier export of
    4,097: count 4,097, count_inc 1, one bucket); the others first exports, cumulative. A collector
    that never saw the base leaves the increment out and keeps the rest."""
    from kernel_insight.collector.hist_base import HistogramBases

    frame = (FIXTURES / "frame_v4.kib").read_bytes()
    want = json.loads((FIXTURES / "frame_v4.json").read_text())
    batch = wire.decode_batch(frame, KEY)
    got = batch_json(batch)
    assert got == want
    assert got["body_version"] == 4
    rows = {(r["kind"], r["gpu"]): r for r in got["histograms"]["rows"]}
    inc = rows[("KERNEL", 0)]
    assert (inc["increment"], inc["first"], inc["count"], inc["count_inc"]) == (True, False, 4097, 1)
    assert sum(inc["pos_deltas"]) == 1
    assert all(not r["increment"] and r["first"] for k, r in rows.items() if k != ("KERNEL", 0))
    assert batch.histograms is not None
    kept, missing = HistogramBases().resolve(batch.histograms, epoch=77)
    assert missing == 1
    assert kept is not None
    assert len(kept) == 3


def test_the_c_encoder_still_seals_the_v4_golden_frame(tmp_path):
    golden = (FIXTURES / "frame_v4.kib").read_bytes()
    fresh = seal_in_c(tmp_path, FIXTURES / "records.bin", "v4")
    g_head, f_head = wire.parse_header(golden), wire.parse_header(fresh)
    assert dataclasses.replace(f_head, payload_len=0) == dataclasses.replace(g_head, payload_len=0)
    assert wire.open_frame(fresh, f_head, KEY) == wire.open_frame(golden, g_head, KEY)


def test_the_v3_correlation_column_is_the_delta_of_correlation_minus_pos():
    """The bytes, not only the round trip: a probe that numbers its kernels as the ring numbers
    its records gives a column of one varint and zeros; versions 1 and 2 keep the plain delta."""
    recs = golden_records()
    k = recs[recs["type"] == int(RecordType.KERNEL)].copy()
    k["pos"] = [1000, 1003]
    payload = k["payload"].copy().view(wire._PAYLOAD_DTYPE[RecordType.KERNEL])
    payload["correlation"] = [7000, 7003]
    k["payload"] = payload.view("V32").reshape(len(k))

    def correlation_column(version: int) -> bytes:
        r = wire._Reader(wire._encode_records(k, int(RecordType.KERNEL), version), "s")
        assert r.varint() == 2
        cols = [bytes(r.take(r.varint())) for _ in wire._columns(int(RecordType.KERNEL), version)]
        return cols[8]  # pos, producer, flags, device, id, ts_ns, end_ns, stream, correlation

    assert correlation_column(3) == encode_varint(2 * 6000) + b"\x00"
    assert correlation_column(2) == encode_varint(2 * 7000) + encode_varint(2 * 3)
    header = wire.BatchHeader(bytes(16), 1, 1, 0, 0, 2**63, 2, 0, wire.COMPRESSION_NONE)
    for version in (1, 2, 3):
        r = wire._Reader(wire._encode_records(k, int(RecordType.KERNEL), version), "s")
        back = wire._decode_records(r, int(RecordType.KERNEL), header, wire.DEFAULT_LIMITS, version)
        assert back.tobytes() == k.tobytes()
