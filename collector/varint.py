"""Base-128 varints (protobuf's, and the agent wire's: docs/wire.md), written once for the collector.

``encode`` writes one unsigned 64-bit value; ``decode`` reads one from ``buf[pos:end]`` and names
what was wrong through the caller's exception type. The agent wire's stricter reader (canonical
form, at most 10 bytes) is ``wire._Reader.varint``; bulk columns are decoded in C (``_decode``).
"""

from __future__ import annotations

__all__ = ["decode", "encode"]

_U64 = (1 << 64) - 1


def encode(v: int) -> bytes:
    """``v`` (taken modulo 2**64, as Go's uint64 conversion) as a varint."""
    v &= _U64
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def decode(
    buf: bytes | memoryview, pos: int, end: int, error: type[Exception] = ValueError
) -> tuple[int, int]:
    """The varint at ``buf[pos]`` and the position after it; ``error`` when it runs past ``end``, is
    longer than 10 bytes or does not fit 64 bits."""
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise error("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result > _U64:
                raise error("varint overflows 64 bits")
            return result, pos
        shift += 7
        if shift >= 70:
            raise error("varint longer than 10 bytes")
