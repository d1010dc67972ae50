from typing import Any

import numpy.typing as npt

# Contiguous arrays: float64 values, int64 windows and times, float64 outputs, uint8 const_y.
_A = npt.NDArray[Any]

def kahan(vs: _A, lo: _A, cnt: _A, limit: int, total: _A, comp: _A, /) -> None: ...
def variance(vs: _A, lo: _A, cnt: _A, limit: int, out: _A, /) -> None: ...
def regression(
    vs: _A,
    ts: _A,
    lo: _A,
    cnt: _A,
    t0: _A,
    limit: int,
    total: _A,
    comp: _A,
    first_y: _A,
    const_y: _A,
    /,
) -> None: ...
def group_kahan(
    values: _A | None, present: _A, gid: _A, total: _A | None, comp: _A | None, count: _A, /
) -> None: ...
def searchsorted(ts: _A, offsets: _A, queries: _A, right: bool, out: _A, /) -> None: ...
def series_ranges(
    fps: _A, offsets: _A, ts: _A, want: _A, start: int, end: int, starts: _A, lengths: _A, /
) -> None: ...
def stamps_text(ms: _A, after: bytes, /) -> bytes: ...
