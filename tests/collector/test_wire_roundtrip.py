"""Encoder and decoder agree on every record, name and counter; the header binds the body."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.wire_corpus import SHIPPED, kernel_stream, random_records

from kernel_insight.agent.records import (
    KernelRecord,
    MemopKind,
    MemopRecord,
    SampleRecord,
    decode_records,
)
from kernel_insight.collector import wire

KEY = bytes(range(32))
AID = bytes(range(100, 116))


def _frame(arr, **kw):
    args = {"agent_id": AID, "key_id": 1, "key": KEY, "epoch": 5, "seq": 0, **kw}
    return wire.encode_batch(arr, **args)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 60),
    types=st.lists(st.sampled_from(SHIPPED), min_size=1, max_size=8, unique=True),
    compress=st.booleans(),
)
def test_any_records_round_trip_bytewise(seed, n, types, compress):
    arr = random_records(np.random.default_rng(seed), n, types)
    batch = wire.decode_batch(_frame(arr, compress=compress, now_ns=123), KEY)
    assert batch.to_array().tobytes() == arr.tobytes()
    assert batch.header.record_count == n


@settings(max_examples=100, deadline=None)
@given(
    strings=st.dictionaries(
        st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)), st.text(max_size=80), max_size=20
    ),
    counters=st.dictionaries(st.integers(1, 10_000), st.integers(0, 2**64 - 1), max_size=30),
)
def test_names_and_counters_round_trip(strings, counters):
    batch = wire.decode_batch(
        _frame(random_records(np.random.default_rng(0), 3), strings=strings, counters=counters), KEY
    )
    assert batch.strings == strings
    assert batch.counters == counters


def test_typed_records_come_back_equal():
    recs = [
        KernelRecord(1, 2, 0, 0, 5, 1000, 2000, 7, 99, 1234),
        MemopRecord(2, 2, 1, 1, MemopKind.FREE, 1500, 0xDEAD0000, 4096, 1, 2, -5),
        SampleRecord(3, 3, 0, 0, 4, 1200, 3.25, 9),
    ]
    batch = wire.decode_batch(_frame(recs), KEY)
    assert batch.records() == recs
    assert batch.header.t_min_ns == 1000
    assert batch.header.t_max_ns == 1500


def test_header_fields_and_batch_id():
    frame = _frame(random_records(np.random.default_rng(1), 4), epoch=77, seq=2**40, key_id=9)
    h = wire.parse_header(frame)
    assert (h.agent_id, h.key_id, h.epoch, h.seq) == (AID, 9, 77, 2**40)
    assert h.batch_id == wire.BatchId(AID, 77, 2**40)
    assert h.nonce == struct.pack("<IQ", 77, 2**40)
    assert frame[:4] == b"KIWB"
    assert len(frame) == 64 + h.payload_len


def test_kernel_stream_is_under_six_bytes_per_record():
    arr = kernel_stream(np.random.default_rng(2), 10_000)
    frame = _frame(arr)
    assert len(frame) / len(arr) < 6.0
    assert wire.decode_batch(frame, KEY).to_array().tobytes() == arr.tobytes()


@pytest.mark.parametrize("offset", [8, 24, 28, 32, 40, 48])
def test_changing_any_authenticated_header_field_fails_the_tag(offset):
    frame = bytearray(_frame(random_records(np.random.default_rng(3), 5)))
    # Keep t_min <= t_max so the change reaches the tag check.
    frame[offset] ^= 0x01 if offset != 48 else 0x80
    frame[55] |= 0x40
    with pytest.raises(wire.AuthenticationFailed):
        wire.decode_batch(bytes(frame), KEY)


def test_wrong_key_fails_the_tag():
    with pytest.raises(wire.AuthenticationFailed):
        wire.decode_batch(_frame(random_records(np.random.default_rng(4), 5)), os.urandom(32))


def test_string_chunks_cannot_be_shipped_as_records():
    arr = random_records(np.random.default_rng(5), 2)
    arr["type"][0] = 9
    with pytest.raises(ValueError, match="STRING"):
        _frame(arr)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda f: b"XXXX" + f[4:], "magic"),
        (lambda f: f[:4] + b"\x02" + f[5:], "version"),
        (lambda f: f[:5] + b"\x02" + f[6:], "AEAD"),
        (lambda f: f[:6] + b"\x07" + f[7:], "compression"),
        (lambda f: f[:7] + b"\x01" + f[8:], "flags"),
        (lambda f: f[:-1], "payload length"),
        (lambda f: f[:100], "payload length"),
        (lambda f: f[:20], "shorter"),
    ],
)
def test_header_problems_are_malformed(mutate, message):
    frame = _frame(random_records(np.random.default_rng(6), 5))
    with pytest.raises(wire.MalformedBatch, match=message):
        wire.decode_batch(mutate(frame), KEY)


def test_oversized_frame_and_body_are_refused_before_work():
    frame = _frame(kernel_stream(np.random.default_rng(7), 2000))
    with pytest.raises(wire.OversizedBatch):
        wire.decode_batch(frame, KEY, wire.Limits(max_frame=1000))
    with pytest.raises(wire.OversizedBatch):
        wire.decode_batch(frame, KEY, wire.Limits(max_body=1000))


def test_zstd_bomb_without_content_size_is_refused():
    import zstandard

    body = zstandard.ZstdCompressor(write_content_size=False).compress(b"\x01" + b"\x00" * 100)
    header = wire.BatchHeader(AID, 1, 1, 1, 0, 0, 0, len(body) + 16, wire.COMPRESSION_ZSTD)
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    frame = header.pack() + ChaCha20Poly1305(KEY).encrypt(header.nonce, body, header.pack())
    with pytest.raises(wire.MalformedBatch, match="content size"):
        wire.decode_batch(frame, KEY)


def _body_frame(body: bytes, count: int = 0, t_max: int = 2**64 - 1) -> bytes:
    return wire.seal_body(
        body, agent_id=AID, key_id=1, key=KEY, epoch=1, seq=1, t_min_ns=0, t_max_ns=t_max, record_count=count
    )


@pytest.mark.parametrize(
    ("body", "count", "message"),
    [
        (b"\x06", 0, "body version"),  # 1 to 5 are known
        (b"\x00", 0, "body version"),
        (b"\x01\x01\x01\x00\x01\x01\x00", 0, "twice"),
        (b"\x01\x55\x00", 0, "unknown section"),
        (b"\x01\x19\x00", 0, "unknown section"),
        (b"\x01\x01\x05\x00", 0, "runs past"),
        (b"\x01\x01\x02\x00\x00", 0, "left over"),
        (b"\x01\x01\x05\x02\x02\x00\x01\x00", 0, "increasing"),
        (b"\x01\x01\x03\x01\x80\x00", 0, "non-canonical"),
        (b"\x01\x11\x01\x00", 0, "record count"),
        (b"\x01", 3, "header says 3"),
    ],
)
def test_body_problems_are_malformed(body, count, message):
    with pytest.raises(wire.MalformedBatch, match=message):
        wire.decode_batch(_body_frame(body, count), KEY)


def test_record_time_outside_header_range_is_malformed():
    arr = random_records(np.random.default_rng(8), 3, [1])
    body = wire.encode_body(arr)
    t = int(arr["ts_ns"].min())
    frame = wire.seal_body(
        body, agent_id=AID, key_id=1, key=KEY, epoch=1, seq=1, t_min_ns=t, t_max_ns=t, record_count=3
    )
    with pytest.raises(wire.MalformedBatch, match="time"):
        wire.decode_batch(frame, KEY)


def test_field_wider_than_its_slot_is_malformed():
    arr = random_records(np.random.default_rng(9), 1, [2])
    body = bytearray(wire.encode_body(arr))
    # Replace the device column (2 bytes max) with a 3-byte varint.
    good = wire._encode_varints(np.array([int(arr["device"][0])], dtype=np.uint64))
    big = wire._encode_varints(np.array([1 << 20], dtype=np.uint64))
    i = body.index(bytes([len(good)]) + good, 4)
    body[i : i + 1 + len(good)] = bytes([len(big)]) + big
    body[2] += len(big) - len(good)  # the section length (one-byte varint here)
    with pytest.raises(wire.MalformedBatch, match="16 bits"):
        wire.decode_batch(_body_frame(bytes(body), 1), KEY)


def test_decoded_records_match_ring_decoder():
    arr = random_records(np.random.default_rng(10), 40, [1, 2, 3, 4, 5, 7, 8])
    batch = wire.decode_batch(_frame(arr), KEY)
    assert batch.records() == decode_records(arr.tobytes())


def _header_for(body: bytes) -> wire.BatchHeader:
    """A header for decode_body, which reads only its record count and time range."""
    return wire.BatchHeader(b"\0" * 16, 1, 1, 0, 0, 0, 0, len(body), 0)


def test_labels_section_round_trips_and_malformed_ones_are_refused():
    empty = np.zeros(0, wire.RECORD_DTYPE)
    body = wire.encode_body(empty, labels=[("model", "llama-70b"), ("rack", "ré")])
    assert wire.decode_body(body, _header_for(body)).labels == (("model", "llama-70b"), ("rack", "ré"))
    assert wire.decode_body(wire.encode_body(empty), _header_for(body)).labels is None
    for section, reason in (
        (b"\x00", "0 labels"),
        (bytes([17]) + b"\x01a\x01b" * 17, "17 labels"),
        (b"\x01\x00\x01b", "label name of 0 bytes"),
        (b"\x01\x01a\x02\xff\xfe", "label value is not UTF-8"),
        (b"\x01\x01a\x05b", "past the end"),
    ):
        bad = bytes([wire.BODY_VERSION, wire.SECTION_LABELS, len(section)]) + section
        with pytest.raises(wire.MalformedBatch, match=reason):
            wire.decode_body(bad, _header_for(bad))
