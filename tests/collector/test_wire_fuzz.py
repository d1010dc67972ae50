"""Untrusted bytes never crash the decoder: random and mutated batches end in clean rejections.

The quick run takes KI_FUZZ_CASES cases (default 20k); the slow one 100k (more if KI_FUZZ_CASES says so).
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import zstandard
from support.wire_corpus import kernel_stream, random_records

from kernel_insight.agent.records import RECORD_DTYPE
from kernel_insight.collector import wire
from kernel_insight.collector.derive import Deriver
from kernel_insight.collector.wire_hist import HistKind, HistRow, encode_histograms

KEY = bytes(range(32))
AID = bytes(16)
CASES = int(os.environ.get("KI_FUZZ_CASES", "20000"))


def _histograms(ts_ns: int, version: int = 3) -> bytes:
    """A HISTOGRAMS section: two kernels (one with a stream) and an NCCL op; in version 4 a third
    kernel as an increment over its previous export."""
    rows = [
        HistRow(HistKind.KERNEL, producer=1, id=1, gpu=0, pid=4242, stream=7, schema=3, count=5, sum=1e-4,
                pos_spans=((-120, 2), (1, 1)), pos_deltas=(2, 1, -2), first=True),
        HistRow(HistKind.KERNEL, producer=1, id=2, gpu=1, pid=4242, schema=0, zero_count=1, count=3, sum=2.5,
                zero_threshold=1e-9, pos_spans=((1, 1),), pos_deltas=(2,)),
        HistRow(HistKind.NCCL, id=3, gpu=0, schema=-4, count=1, sum=3.0, pos_spans=((0, 1),), pos_deltas=(1,)),
    ]  # fmt: skip
    if version >= 4:
        rows.append(HistRow(HistKind.KERNEL, producer=1, id=3, gpu=0, pid=4242, schema=3, zero_count=1, count=90,
                            sum=0.5, pos_spans=((-100, 3), (4, 1)), pos_deltas=(3, -3, 1, 5), increment=True,
                            count_inc=10))  # fmt: skip
    return encode_histograms(ts_ns, rows, version)


def _seeds() -> list[tuple[bytes, wire.BatchHeader, bytes]]:
    """(frame, header, plaintext body) for a few small valid batches of every shape and body
    version (2 and 3: kept kernel spans with a HISTOGRAMS section; 3 sends their correlation as
    the delta of correlation - pos; 4 adds a histogram increment)."""
    rng = np.random.default_rng(42)
    out = []
    stream = kernel_stream(rng, 12)
    hist_ts = int(stream["ts_ns"][-1])
    v2 = {"body_version": 2, "histograms": _histograms(hist_ts), "histograms_ts_ns": hist_ts}
    v3 = {**v2, "body_version": 3}
    v4 = {**v2, "body_version": 4, "histograms": _histograms(hist_ts, 4)}
    # Version 5: names once; one text left out, the NAMES_USED digest over both names used.
    both = wire.name_hash(1, 1, b"gemm") ^ wire.name_hash(1, 3, b"attn")
    v5 = {**v4, "body_version": 5, "names_digest": both}
    shapes: list[tuple[npt.NDArray[np.void], dict[tuple[int, int], str], dict[int, int], dict[str, Any]]] = [
        (random_records(rng, 6), {(1, 2): "gemm", (3, 4): "ψ-kernel"}, {1: 5, 22: 1 << 40}, {}),
        (random_records(rng, 1, [6]), {}, {}, {}),
        (stream, {(1, 1): "a" * 40}, {3: 1}, {}),
        (random_records(rng, 0), {}, {10: 1}, {}),
        (random_records(rng, 9, [2, 3, 4, 5, 7, 8]), {}, {}, {}),
        (stream, {(1, 1): "gemm", (1, 2): "attn"}, {28: 8, 30: 12}, v2),
        (stream, {(1, 1): "gemm", (1, 2): "attn"}, {28: 8, 30: 12}, v3),
        (random_records(rng, 7, [1, 1, 1, 6]), {}, {}, v3),
        (stream, {(1, 1): "gemm", (1, 3): "attn"}, {28: 8, 30: 12}, v4),
        (stream, {(1, 3): "attn"}, {28: 8, 30: 12}, v5),
        (random_records(rng, 0), {(1, 1): "gemm", (1, 3): "attn"}, {}, {"body_version": 5}),
    ]
    for seq, (arr, strings, counters, version) in enumerate(shapes):
        body_args = {k: v for k, v in version.items() if k != "histograms_ts_ns"}
        for compress in (True, False):
            frame = wire.encode_batch(
                arr,
                agent_id=AID,
                key_id=1,
                key=KEY,
                epoch=1,
                seq=seq,
                strings=strings,
                counters=counters,
                now_ns=5,
                compress=compress,
                **version,
            )
            header = wire.parse_header(frame)
            body = wire.encode_body(arr, strings, counters, **body_args)
            back = wire.decode_batch(frame, KEY)  # every seed is valid and decodes to its records
            assert back.body_version == version.get("body_version", 1)
            assert back.to_array().tobytes() == arr[np.argsort(arr["pos"], kind="stable")].tobytes()
            out.append((frame, header, body))
    return out


def _mutate(rnd: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    b = bytearray(data)
    for _ in range(rnd.choice((1, 1, 2, 3, 8))):
        op = rnd.randrange(7)
        i = rnd.randrange(len(b) + 1) if b else 0
        if op == 0 and b:
            b[min(i, len(b) - 1)] ^= 1 << rnd.randrange(8)
        elif op == 1 and b:
            b[min(i, len(b) - 1)] = rnd.choice((0, 0x7F, 0x80, 0xFF, rnd.randrange(256)))
        elif op == 2:
            del b[i:]
        elif op == 3:
            b[i:i] = rnd.randbytes(rnd.randrange(1, 16))
        elif op == 4 and b:
            del b[i : i + rnd.randrange(1, 16)]
        elif op == 5:
            other = rnd.choice(pool)
            j = rnd.randrange(len(other) + 1)
            b[i:] = other[j:]
        else:
            b[i:i] = b"\xff" * rnd.randrange(1, 11)
    return bytes(b)


def test_fuzz_random_and_mutated_batches_reject_cleanly():
    _fuzz(CASES, 1234)


@pytest.mark.slow
def test_fuzz_100k_cases_reject_cleanly():
    _fuzz(max(100_000, CASES), 4321)


def _fuzz(cases: int, seed: int) -> None:
    seeds = _seeds()
    frames = [s[0] for s in seeds]
    bodies = [s[2] for s in seeds]
    rnd = random.Random(seed)
    outcomes = {"ok": 0, "malformed": 0, "auth": 0}
    names = Deriver("fuzz")
    names.derive(np.zeros(0, dtype=RECORD_DTYPE), strings={(1, 1): "gemm"})
    started = time.monotonic()
    for case in range(cases):
        kind = case % 10
        try:
            if kind == 0:
                # Frame-level: header checks and the tag (mutations almost never survive it).
                wire.decode_batch(_mutate(rnd, rnd.choice(frames), frames), KEY)
            elif kind == 1:
                # Random bytes behind a valid-looking header.
                wire.decode_batch(rnd.choice(frames)[:64] + rnd.randbytes(rnd.randrange(0, 200)), KEY)
            elif kind == 2:
                # Authenticated garbage: a mutated zstd payload sealed with the right key.
                _frame, header, body = rnd.choice(seeds)
                payload = _mutate(rnd, zstandard.compress(body), bodies)
                sealed = wire.seal_body(
                    payload,
                    agent_id=AID,
                    key_id=1,
                    key=KEY,
                    epoch=1,
                    seq=case,
                    t_min_ns=0,
                    t_max_ns=2**64 - 1,
                    record_count=header.record_count,
                    compress=False,
                )
                h = wire.parse_header(sealed)
                h = wire.BatchHeader(**{**{f: getattr(h, f) for f in h.__slots__}, "compression": 1})
                wire.decode_body(wire.open_frame(sealed[:6] + b"\x01" + sealed[7:], h, KEY), h)
            else:
                # Body-level: the part an authenticated but buggy or hostile agent controls.
                _frame, header, body = rnd.choice(seeds)
                mutated = (
                    _mutate(rnd, body, bodies) if kind < 9 else bytes([1]) + rnd.randbytes(rnd.randrange(60))
                )
                wide = wire.BatchHeader(
                    **{
                        **{f: getattr(header, f) for f in header.__slots__},
                        "t_min_ns": 0,
                        "t_max_ns": 2**64 - 1,
                    }
                )
                batch = wire.decode_body(mutated, wide)
                assert batch.record_count == header.record_count
                batch.records()
                if batch.names_digest is not None:  # the collector's check of a version 5 batch's names
                    names.names_match(
                        batch.by_type(),
                        batch.strings,
                        batch.string_hashes,
                        batch.histograms,
                        batch.names_digest,
                    )
            outcomes["ok"] += 1
        except wire.AuthenticationFailed:
            outcomes["auth"] += 1
        except wire.MalformedBatch:
            outcomes["malformed"] += 1
    elapsed = time.monotonic() - started
    print(f"fuzz: {cases} cases in {elapsed:.1f}s: {outcomes}")
    assert sum(outcomes.values()) == cases
    assert outcomes["malformed"] > cases // 4
    assert outcomes["auth"] > cases // 20


def test_fuzz_request_bodies_of_several_frames_split_cleanly_or_are_rejected():
    """split_frames (x-ki-batches request bodies): either whole frames that tile the body, or MalformedBatch."""
    frames = [s[0] for s in _seeds()]
    rnd = random.Random(77)
    limits = wire.Limits(max_frames=16, max_frame=1 << 16)
    outcomes = {"ok": 0, "malformed": 0}
    for case in range(CASES // 4):
        body = b"".join(rnd.choice(frames) for _ in range(rnd.randrange(1, 20)))
        if case % 4:
            body = _mutate(rnd, body, frames)
        try:
            parts = wire.split_frames(body, limits)
        except wire.MalformedBatch:  # OversizedBatch included
            outcomes["malformed"] += 1
            continue
        outcomes["ok"] += 1
        assert b"".join(bytes(p) for p in parts) == body
        assert 1 <= len(parts) <= 16
        for p in parts:
            assert len(p) >= wire.HEADER_SIZE + wire.TAG_SIZE
            assert int.from_bytes(p[60:64], "little") == len(p) - wire.HEADER_SIZE
    assert outcomes["ok"] > CASES // 40
    assert outcomes["malformed"] > CASES // 40


def test_fuzz_string_chunks_decode_to_at_most_their_bytes():
    """decode_record on STRING chunks with any flags and bytes: sized chunks give at most 31 bytes."""
    from kernel_insight.agent.records import RecordFlag, StringRecord, decode_record

    rnd = random.Random(5)
    for _ in range(CASES // 4):
        raw = bytearray(rnd.randbytes(64))
        raw[16] = 9  # STRING
        rec = decode_record(bytes(raw))
        assert isinstance(rec, StringRecord)
        if rec.flags & RecordFlag.STRING_LAST and rec.flags & RecordFlag.STRING_SIZED:
            assert rec.text == bytes(raw[32 : 32 + min(raw[63], 31)])
        elif rec.flags & RecordFlag.STRING_LAST:
            assert rec.text == bytes(raw[32:64]).rstrip(b"\0")
        else:
            assert rec.text == bytes(raw[32:64])
