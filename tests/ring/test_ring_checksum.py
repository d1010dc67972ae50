"""The slot checksum is CRC-32C of position, producer and record (docs/ring.md, "Checksum").

Checked from outside the C code: a pure-Python CRC-32C over the raw bytes of the shm object
must give every published slot's ``check``, and the header's table fallback must agree with
the CPU's CRC-32C instruction.
"""

from __future__ import annotations

import platform
import struct
import subprocess
from pathlib import Path

from ringutil import HERE, compile_c

from kernel_insight.agent import Ring

HEADER_BYTES = 4096 + 1024 * 32  # header and producer table: the first slot's offset


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def test_the_reference_crc32c_is_castagnolis() -> None:
    # RFC 3720 (iSCSI) B.4 and the usual check value of CRC-32C
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(bytes([0xFF] * 32)) == 0x62A8AB43


def test_every_published_slot_carries_the_crc32c_of_position_producer_and_record(ring_name: str) -> None:
    with Ring.create(ring_name, capacity=64) as ring:
        name_id = ring.intern("flash_attn_fwd_kernel_with_a_name_longer_than_one_chunk")
        for i in range(20):
            assert ring.kernel(name_id, 0, 1_000 + i, 5_000 + 7 * i, 7, i) == 0
        assert ring.sample(3, 1, 123_456, 71.5) == 0
        producer = ring.producer_id
        written = ring.stats()["head"]
        raw = Path(f"/dev/shm{ring_name}").read_bytes()
    assert written >= 22
    for pos in range(written):
        slot = raw[HEADER_BYTES + 64 * pos : HEADER_BYTES + 64 * (pos + 1)]
        seq, writer, check = struct.unpack_from("<QII", slot)
        assert seq == pos + 1, f"slot {pos} not published"
        assert writer == producer
        assert check == crc32c(struct.pack("<QI", pos, writer) + slot[16:]), f"slot {pos}"
        # the check could fail: one flipped bit of the record changes it
        torn = bytearray(slot[16:])
        torn[pos % 48] ^= 0x10
        assert check != crc32c(struct.pack("<QI", pos, writer) + bytes(torn))


def test_the_table_fallback_agrees_with_the_crc32c_instruction(tmp_path: Path) -> None:
    native = compile_c(HERE / "c" / "checksums.c", tmp_path / "checksums")
    table = compile_c(HERE / "c" / "checksums.c", tmp_path / "checksums-table", ["-DKI_RING_CRC_SOFTWARE"])
    if platform.machine() in ("x86_64", "AMD64"):
        asm = subprocess.run(
            ["objdump", "-d", str(native)], capture_output=True, text=True, check=True
        ).stdout
        assert "crc32" in asm, "the x86-64 build should use the SSE4.2 crc32 instruction"
    a = subprocess.run([native, "5000"], capture_output=True, text=True, check=True).stdout.split()
    b = subprocess.run([table, "5000"], capture_output=True, text=True, check=True).stdout.split()
    assert len(a) == 5000
    assert a == b
    assert len(set(a)) > 4990  # and they are checksums, not a constant
