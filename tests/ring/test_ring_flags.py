"""A producer handle's flags: OR-ed by the ring into every record written through it, and only into those."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kernel_insight.agent import Ring, RingError, RingReader
from kernel_insight.agent.records import (
    KernelRecord,
    MemopKind,
    MemopRecord,
    Record,
    RecordFlag,
    StringRecord,
    StringTable,
)

NAME = "a_kernel_name_long_enough_for_two_chunks"  # two STRING chunks: the second has STRING_LAST
EINVAL = 22


def _by_producer(records: list[Record]) -> dict[int, list[Record]]:
    out: dict[int, list[Record]] = {}
    for r in records:
        out.setdefault(r.producer, []).append(r)
    return out


def _write_three(ring: Ring) -> None:
    assert ring.intern(NAME) == 1
    assert ring.kernel(1, 0, 100, 200, 1, 1) == 0
    assert ring.memop(MemopKind.ALLOC, 0, 300, 0, 0, 1, 1, 2) == 0  # status 2: the record's own FAILED


def _check(records: list[Record], simulated: bool) -> None:
    """Three records and two name chunks; SIMULATED on all or none, each record's own flags kept."""
    want = RecordFlag.SIMULATED if simulated else 0
    assert [type(r) for r in records] == [StringRecord, StringRecord, KernelRecord, MemopRecord]
    assert [r.flags & RecordFlag.SIMULATED for r in records] == [want] * 4
    chunk0, chunk1, _kernel, memop = records
    assert not chunk0.flags & RecordFlag.STRING_LAST
    assert chunk1.flags & RecordFlag.STRING_LAST
    assert memop.flags & RecordFlag.FAILED
    table = StringTable()
    for r in records[:2]:
        assert isinstance(r, StringRecord)
        table.add(r)
    assert table.get(records[0].producer, 1) == NAME


def test_python_handle_with_simulated_flag_marks_every_record_and_a_plain_handle_none(
    ring_name: str,
) -> None:
    with (
        Ring.create(ring_name, capacity=64, producer=False),
        RingReader.open(ring_name) as reader,
        Ring.attach(ring_name) as plain,
        Ring.attach(ring_name, flags=RecordFlag.SIMULATED) as sim,
    ):
        assert (plain.flags, sim.flags) == (0, RecordFlag.SIMULATED)
        _write_three(plain)
        _write_three(sim)
        records = _by_producer(reader.read())
        assert reader.stats()["torn"] == 0  # the checksum covers the flags the ring added
        plain_id, sim_id = plain.producer_id, sim.producer_id
    _check(records[plain_id], simulated=False)
    _check(records[sim_id], simulated=True)


def test_flags_set_on_an_open_handle_apply_from_the_next_write_and_clear_with_zero(ring_name: str) -> None:
    with Ring.create(ring_name, capacity=64) as ring, RingReader.open(ring_name) as reader:
        ring.sample(1, 0, 1, 1.0)
        ring.flags = RecordFlag.SIMULATED
        ring.sample(1, 0, 2, 2.0)
        ring.flags = 0
        ring.sample(1, 0, 3, 3.0)
        flags = [r.flags for r in reader.read()]
    assert flags == [0, RecordFlag.SIMULATED, 0]


@pytest.mark.parametrize("bad", [RecordFlag.STRING_LAST, RecordFlag.FAILED, RecordFlag.FP_STRING, 0x100])
def test_only_simulated_can_be_a_handle_flag_and_a_refused_create_leaves_no_ring(
    ring_name: str, bad: int
) -> None:
    with pytest.raises(ValueError, match="a handle may only set 0x2"):
        Ring.create(ring_name, flags=bad)
    with pytest.raises(RingError, match="no such ring"):
        Ring.attach(ring_name)
    with Ring.create(ring_name, capacity=64) as ring:
        with pytest.raises(ValueError, match="a handle may only set 0x2"):
            ring.flags = bad
        with pytest.raises(ValueError, match="a handle may only set 0x2"):
            Ring.attach(ring_name, flags=bad)
        assert ring.flags == 0


def test_c_handle_with_simulated_flag_marks_every_record_and_a_plain_handle_none(
    ringtool: Path, ring_name: str
) -> None:
    with Ring.create(ring_name, capacity=64, producer=False), RingReader.open(ring_name) as reader:
        out = subprocess.run([ringtool, "flagged", ring_name], check=True, capture_output=True, text=True)
        records = _by_producer(reader.read())
        assert reader.stats()["torn"] == 0
    plain_id, sim_id, bad_rc = (int(x) for x in out.stdout.split())
    assert bad_rc == -EINVAL  # ki_ring_set_flags refuses a per-record flag
    _check(records[plain_id], simulated=False)
    _check(records[sim_id], simulated=True)


def test_python_handle_flags_reach_a_c_consumer(ringtool: Path, ring_name: str) -> None:
    with Ring.create(ring_name, capacity=64, flags=RecordFlag.SIMULATED) as ring:
        assert ring.sample(1, 0, 1, 1.0) == 0
        out = subprocess.run(
            [ringtool, "dump", ring_name, "1", "2000"], check=True, capture_output=True, text=True
        ).stdout
    (rec,) = [json.loads(line) for line in out.splitlines()]
    assert rec["flags"] == RecordFlag.SIMULATED
