"""Shared record generators for the wire tests (a helper module, not a test file)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from kernel_insight.agent.records import PAYLOAD_DTYPES, RECORD_DTYPE
from kernel_insight.collector import wire

SHIPPED = list(wire.SHIPPED_TYPES)


def zero_reserved(arr: npt.NDArray[np.void]) -> npt.NDArray[np.void]:
    """Reserved payload bytes are not shipped; zero them so arrays compare bytewise."""
    out = arr.copy()
    out["check"] = 0
    for t, dt in PAYLOAD_DTYPES.items():
        m = out["type"] == t
        if not m.any() or "reserved" not in (dt.names or ()):
            continue
        pl = out["payload"][m].copy().view(dt)
        pl["reserved"] = 0
        out["payload"][m] = pl.view("V32").reshape(-1)
    return out


def random_records(rng: np.random.Generator, n: int, types: list[int] | None = None) -> npt.NDArray[np.void]:
    """n records of random shippable types with random bytes everywhere a value may be."""
    raw = rng.integers(0, 256, size=n * 64, dtype=np.uint8).view(RECORD_DTYPE).copy()
    raw["pos"] = np.sort(rng.choice(1 << 40, size=n, replace=False)).astype(np.uint64)
    raw["type"] = rng.choice(types or SHIPPED, size=n)
    return zero_reserved(raw)


def kernel_stream(
    rng: np.random.Generator, n: int, start_ns: int = 1_700_000_000_000_000_000
) -> npt.NDArray[np.void]:
    """A realistic KERNEL stream: a handful of names, ~10 us apart, lognormal durations."""
    arr = np.zeros(n, dtype=RECORD_DTYPE)
    arr["pos"] = np.arange(n)
    arr["type"] = 1
    arr["producer"] = 1
    arr["id"] = rng.integers(1, 6, n)
    ts = (np.cumsum(rng.integers(5000, 15000, n)) + start_ns).astype(np.uint64)
    arr["ts_ns"] = ts
    pl = np.zeros(n, dtype=wire._PAYLOAD_DTYPE[1])
    pl["end_ns"] = ts + rng.lognormal(11, 0.6, n).astype(np.uint64)
    pl["stream"] = 7
    pl["correlation"] = np.arange(n)
    pl["pid"] = 4242
    arr["payload"] = pl.view("V32").reshape(n)
    return arr
