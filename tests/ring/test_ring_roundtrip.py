"""Every record type written from C reads back in Python, and the other way round."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kernel_insight.agent import (
    CollectiveOp,
    CollectiveRecord,
    ErrorKind,
    ErrorRecord,
    FingerprintField,
    FingerprintRecord,
    KernelRecord,
    LaunchRecord,
    MemopKind,
    MemopRecord,
    Ring,
    RingReader,
    SampleRecord,
    StringRecord,
    StringTable,
    SyncKind,
    SyncRecord,
)

GEMM = "ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_64x3_tn"


def test_every_record_type_round_trips_c_to_python(ringtool: Path, ring_name: str) -> None:
    with Ring.create(ring_name, capacity=64, producer=False), RingReader.open(ring_name) as reader:
        subprocess.run([ringtool, "write-all", ring_name], check=True)
        recs = reader.read()
    strings = StringTable()
    for r in recs:
        if isinstance(r, StringRecord):
            strings.add(r)
    producer = recs[0].producer
    assert strings.get(producer, 7) == GEMM
    body = [r for r in recs if not isinstance(r, StringRecord)]
    assert [type(r) for r in body] == [
        KernelRecord,
        LaunchRecord,
        MemopRecord,
        CollectiveRecord,
        SyncRecord,
        SampleRecord,
        FingerprintRecord,
        ErrorRecord,
    ]
    k, launch, mem, coll, sync, sample, fp, err = body
    assert isinstance(k, KernelRecord)
    assert (k.name_id, k.device, k.start_ns, k.end_ns, k.stream, k.correlation) == (
        7,
        3,
        1000,
        2500,
        0xDEADBEEF,
        42,
    )
    assert k.duration_ns == 1500
    assert k.pid > 0
    assert isinstance(launch, LaunchRecord)
    assert (launch.pid, launch.tid, launch.grid, launch.block) == (4242, 4243, (128, 2, 1), (256, 1, 1))
    assert isinstance(mem, MemopRecord)
    assert mem.kind is MemopKind.ALLOC
    assert (mem.address, mem.nbytes, mem.status, mem.flags & 1) == (0x7F0000001000, 1 << 33, 2, 1)
    assert isinstance(coll, CollectiveRecord)
    assert coll.op is CollectiveOp.ALLREDUCE
    assert (coll.nbytes, coll.duration_ns, coll.comm, coll.rank, coll.nranks) == (
        1 << 20,
        350000,
        0xC0FFEE,
        5,
        8,
    )
    assert isinstance(sync, SyncRecord)
    assert sync.kind is SyncKind.STREAM
    assert (sync.duration_ns, sync.handle, sync.tid) == (1234567, 0xABC, 4245)
    assert isinstance(sample, SampleRecord)
    assert (sample.metric, sample.value, sample.aux) == (17, 0.1 + 0.2, 99)
    assert isinstance(fp, FingerprintRecord)
    assert fp.field is FingerprintField.MEMORY_TOTAL
    assert fp.value == 80 << 30
    assert not fp.is_string
    assert isinstance(err, ErrorRecord)
    assert err.kind is ErrorKind.XID
    assert (err.code, err.aux, err.pid, err.detail_id) == (-79, 3, 4242, 7)
    assert all(r.producer == producer for r in recs)
    assert [r.pos for r in recs] == list(range(len(recs)))


def _dump(ringtool: Path, name: str, count: int) -> list[dict[str, object]]:
    out = subprocess.run(
        [ringtool, "dump", name, str(count), "2000"], check=True, capture_output=True, text=True
    ).stdout
    return [json.loads(line) for line in out.splitlines()]


def test_every_record_type_round_trips_python_to_c(ringtool: Path, ring_name: str) -> None:
    with Ring.create(ring_name, capacity=64) as ring:
        name_id = ring.intern(GEMM)
        assert ring.intern(GEMM) == name_id  # registered once
        statuses = [
            ring.kernel(name_id, 2, 100, 350, 9, 77),
            ring.launch(name_id, 2, 101, 11, 12, 4, 5, 6, 32, 8, 1),
            ring.memop(MemopKind.FREE_ASYNC, 2, 102, 0xABCDEF00, 4096, 11, 13, -2),
            ring.collective(CollectiveOp.SEND, 2, 103, 65536, 999, 0xFEED, 1, 2, 1),
            ring.sync(SyncKind.EVENT, 2, 104, 5555, 0x77, 11, 14),
            ring.sample(3, 2, 105, -1.25e-7, 8),
            ring.fingerprint(FingerprintField.UUID, 2, 106, name_id, 1),
            ring.error(ErrorKind.OOM, 2, 107, -2, 1 << 40, 11, name_id),
        ]
        assert statuses == [0] * 8
        producer = ring.producer_id
        recs = _dump(ringtool, ring_name, 10)
    assert len(recs) == 10
    s0, s1, k, launch, mem, coll, sync, sample, fp, err = recs
    assert (s0["type"], s0["id"], s0["device"], s0["flags"]) == (9, name_id, 0, 0)
    assert (s1["type"], s1["device"], s1["flags"]) == (9, 1, 0x80)
    text = bytes.fromhex(str(s0["text"])) + bytes.fromhex(str(s1["text"]))
    assert text.rstrip(b"\0").decode() == GEMM
    assert all(r["producer"] == producer for r in recs)
    assert k == k | {
        "type": 1,
        "id": name_id,
        "device": 2,
        "ts_ns": 100,
        "end_ns": 350,
        "stream": 9,
        "correlation": 77,
    }
    assert launch | {"grid": [4, 5, 6], "block": [32, 8, 1], "pid": 11, "tid": 12, "ts_ns": 101} == launch
    assert mem | {"type": 3, "id": 4, "address": 0xABCDEF00, "nbytes": 4096, "status": -2, "flags": 1} == mem
    assert (
        coll
        | {"type": 4, "id": 6, "nbytes": 65536, "duration_ns": 999, "comm": 0xFEED, "rank": 1, "nranks": 2}
        == coll
    )
    assert coll["flags"] == 1
    assert sync | {"type": 5, "id": 3, "duration_ns": 5555, "handle": 0x77, "pid": 11, "tid": 14} == sync
    assert sample | {"type": 6, "id": 3, "value": -1.25e-7, "aux": 8} == sample
    assert fp | {"type": 7, "id": 2, "value": name_id, "flags": 0x40} == fp
    assert err | {"type": 8, "id": 1, "code": -2, "aux": 1 << 40, "pid": 11, "detail_id": name_id} == err


def test_long_names_span_several_chunks_and_reassemble(ring_name: str) -> None:
    name = "void at::native::(anonymous)::" + "x" * 500 + "<float, 4>"
    with Ring.create(ring_name, capacity=128) as ring, RingReader.open(ring_name) as reader:
        sid = ring.intern(name)
        producer = ring.producer_id
        strings = StringTable()
        done = [strings.add(r) for r in reader.read() if isinstance(r, StringRecord)]
    assert done[-1] == name
    assert strings.get(producer, sid) == name
    assert len(done) == (len(name) + 31) // 32


def test_intern_retries_registration_after_a_full_ring(ring_name: str) -> None:
    with Ring.create(ring_name, capacity=4) as ring, RingReader.open(ring_name) as reader:
        for i in range(4):
            assert ring.sample(1, 0, i, 1.0) == 0
        sid = ring.intern("late_kernel")  # ring full: id given, registration pending
        assert ring.stats()["dropped"] == 1
        assert reader.read_array().size == 4
        assert ring.intern("late_kernel") == sid  # retried now that there is room
        strings = StringTable()
        for r in reader.read():
            assert isinstance(r, StringRecord)
            strings.add(r)
        assert strings.get(ring.producer_id, sid) == "late_kernel"
        assert ring.intern("late_kernel") == sid
        assert reader.read() == []  # registered once, not again


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r: r.kernel(1, 70000, 0, 0), "device must fit in 16 bits"),
        (lambda r: r.kernel(-1, 0, 0, 0), "must be an integer"),
        (lambda r: r.kernel(1, 0, 0), "takes 4 to 7 positional arguments"),
        (lambda r: r.launch(1, 0, 0, 1 << 33, 0), "must fit in 32 bits"),
        (lambda r: r.write_raw(b"short"), "record must be 48 bytes"),
        (lambda r: r.sample(1, 0, 0, "x"), "must be real number"),
    ],
)
def test_bad_producer_arguments_raise_clear_errors(ring_name: str, call, message: str) -> None:
    with Ring.create(ring_name, capacity=8) as ring:
        with pytest.raises((ValueError, TypeError), match=message):
            call(ring)
        assert ring.stats()["head"] == 0  # nothing half-written
