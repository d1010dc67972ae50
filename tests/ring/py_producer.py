"""A Python producer for the ring tests, writing the verifiable scheme of ringtool.c."""

from __future__ import annotations

import sys

from kernel_insight.agent import Ring

MIX = 0xA5A5A5A55A5A5A5A
MUL = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1


def main() -> None:
    name, count, tag = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ring = Ring.attach(name)
    print(ring.producer_id, flush=True)
    write = ring.kernel
    stream = (tag * MUL) & MASK
    dev = tag & 0xFFFF
    results = [0, 0, 0]  # written, dropped, lost
    for seq in range(count):
        rc = write(tag, dev, seq, seq ^ MIX, stream, seq)
        results[0 if rc == 0 else (1 if rc == -28 else 2)] += 1
    print(ring.producer_id, *results, flush=True)


if __name__ == "__main__":
    main()
