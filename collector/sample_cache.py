"""Decoded samples of whole past hours in memory, so queries that re-read them skip ClickHouse.

Dashboards and alert rules read the same recent hours over and over; decoding them from
ClickHouse (Gorilla + ZSTD, then Arrow) costs more than the PromQL evaluation itself, which is
why Prometheus keeps its recent data in memory. This cache holds one entry per metric and
UTC hour: every series of the metric with samples in that hour, as numpy columns. It is exact,
not a time-to-live cache: the store invalidates the (metric, hour) pairs of every insert after
it commits, and a fill that raced an insert to its hour is thrown away (see :meth:`put`).
That needs every write to pass through this process, which is true for the embedded store
(one process per data directory); a ClickHouse server may have other writers, so the cache is
off there unless configured.

Hours still being written (the current one, up to ``settle_ms`` after it ends) are never
cached: live ingestion would invalidate them every batch. Queries read those from ClickHouse.

Missing hours are filled by one background thread (:meth:`fill_later`), so the query that
finds them missing is answered the uncached way, no slower than without a cache, and the
ones after it find the hours in memory.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kernel_insight.kql import _windows
from kernel_insight.kql.pushdown import SeriesColumns, columns_of, gather_ranges
from kernel_insight.kql.storage import Labels

__all__ = ["BLOCK_MS", "DEFAULT_CACHE_BYTES", "CacheStats", "SampleBlock", "SampleCache", "gather_series"]

#: One cache entry spans one UTC hour of one metric.
BLOCK_MS = 3_600_000

#: The embedded store's default budget: ~16 M decoded samples.
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024

#: Pairs remembered as recently invalidated before the memory is reset (see ``_touched``).
_TOUCHED_MAX = 100_000

#: How long an hour too large for the budget is not tried again.
OVERSIZED_RETRY_S = 600.0

log = logging.getLogger(__name__)

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class SampleBlock:
    """One metric's samples in one hour: series ``fps[i]`` owns ``offsets[i]:offsets[i+1]``.

    ``fps`` ascend and are unique; each series' timestamps ascend without duplicates.
    ``serial`` tells this block from every other made in this process (ids are reused once an
    object is freed): a query that saw the same blocks saw the same series (``ClickHouseStorage``
    keeps which of them a selector matched by it, without comparing fingerprints again).
    """

    fps: U64
    offsets: I64
    ts: I64
    vs: F64
    serial: int = field(default_factory=itertools.count().__next__, compare=False)

    @property
    def nbytes(self) -> int:
        return int(self.fps.nbytes + self.offsets.nbytes + self.ts.nbytes + self.vs.nbytes)

    @classmethod
    def from_sorted(cls, fps: U64, ts: I64, vs: F64) -> SampleBlock:
        """From samples ordered by (fingerprint, ts), one row per sample."""
        if len(fps) == 0:
            return cls(np.empty(0, np.uint64), np.zeros(1, np.int64), ts[:0], vs[:0])
        starts = np.flatnonzero(np.concatenate(([True], fps[1:] != fps[:-1])))
        offsets = np.append(starts, len(fps)).astype(np.int64)
        return cls(np.ascontiguousarray(fps[starts]), offsets, ts, vs)


@dataclass(frozen=True, slots=True)
class CacheStats:
    entries: int
    bytes: int
    max_bytes: int
    hits: int
    misses: int
    fills_discarded: int
    fills_failed: int


class SampleCache:
    """An LRU of :class:`SampleBlock` per (metric, hour start in ms), bounded in bytes; thread-safe.

    Example::

        cache = SampleCache(64 << 20)
        gen = cache.generation()              # before reading ClickHouse
        ...                                   # read the hour
        cache.put("gpu_power_watts", hour, block, gen)
        cache.get("gpu_power_watts", hour)
    """

    def __init__(
        self, max_bytes: int, *, settle_ms: int = 120_000, clock: Callable[[], float] = time.time
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"cache size must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self.settle_ms = settle_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, int], SampleBlock] = OrderedDict()
        self._bytes = 0
        self._gen = 0
        # When each recently invalidated pair was invalidated, so a fill that began before then
        # is refused; fills that began before ``_floor`` are refused outright.
        self._touched: dict[tuple[str, int], int] = {}
        self._floor = 0
        self._hits = self._misses = self._discarded = self._failed = 0
        self._oversized: dict[tuple[str, int], float] = {}
        self._pending: dict[Hashable, Future[None]] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    # ---- what may be cached ------------------------------------------------------------

    def cacheable_before(self) -> int:
        """Hours starting before this time (ms) are complete and settled: they may be cached."""
        return int(self._clock() * 1000) - self.settle_ms - BLOCK_MS + 1

    # ---- reads and fills ---------------------------------------------------------------

    def generation(self) -> int:
        """Take this before reading ClickHouse for a fill; hand it to :meth:`put`."""
        with self._lock:
            return self._gen

    def has(self, metric: str, block: int) -> bool:
        """Whether the hour is cached (not counted as a hit or a miss, nor made recently used)."""
        with self._lock:
            return (metric, block) in self._entries

    def get(self, metric: str, block: int) -> SampleBlock | None:
        with self._lock:
            entry = self._entries.get((metric, block))
            if entry is None:
                self._misses += 1
                return None
            self._entries.move_to_end((metric, block))
            self._hits += 1
            return entry

    def put(self, metric: str, block: int, entry: SampleBlock, generation: int) -> bool:
        """Keep ``entry`` unless its hour was written since ``generation`` was taken (a stale read)."""
        key = (metric, block)
        size = entry.nbytes
        with self._lock:
            if generation < self._floor or self._touched.get(key, -1) > generation:
                self._discarded += 1
                return False
            if size > self.max_bytes:
                return False
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._entries[key] = entry
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes
            return True

    def mark_oversized(self, metric: str, block: int) -> None:
        """This hour alone would take more than a quarter of the budget: do not try it for a while."""
        with self._lock:
            self._oversized[metric, block] = self._clock()

    def oversized(self, metric: str, block: int) -> bool:
        with self._lock:
            since = self._oversized.get((metric, block))
            if since is None:
                return False
            if self._clock() - since > OVERSIZED_RETRY_S:
                del self._oversized[metric, block]
                return False
            return True

    # ---- background fills ----------------------------------------------------------------

    def fill_later(self, key: Hashable, fill: Callable[[], object]) -> bool:
        """Run ``fill`` on the background thread unless a fill with the same key is queued or running.

        Failures are counted and logged, never raised: the query that asked has already been
        answered without the cache.
        """
        with self._lock:
            if self._closed or key in self._pending:
                return False
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ki-sample-cache")
            future = self._executor.submit(self._run_fill, fill)
            self._pending[key] = future
        future.add_done_callback(lambda _f: self._done(key))
        return True

    def _run_fill(self, fill: Callable[[], object]) -> None:
        try:
            fill()
        except Exception:
            with self._lock:
                self._failed += 1
            log.warning("sample cache fill failed", exc_info=True)

    def _done(self, key: Hashable) -> None:
        with self._lock:
            self._pending.pop(key, None)

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """Wait until no fill is queued or running; False if some still were after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                pending = list(self._pending.values())
            if not pending:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            wait_futures(pending, timeout=left)

    def close(self) -> None:
        """Stop taking fills, drop queued ones and wait for a running one (it uses the store)."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)

    # ---- writes --------------------------------------------------------------------------

    def invalidate(self, pairs: Iterable[tuple[str, int]]) -> None:
        """Forget these (metric, hour) entries; call after the write to them committed."""
        with self._lock:
            self._gen += 1
            if len(self._touched) > _TOUCHED_MAX:
                self._touched.clear()
                self._floor = self._gen
            for key in pairs:
                self._touched[key] = self._gen
                old = self._entries.pop(key, None)
                if old is not None:
                    self._bytes -= old.nbytes

    def invalidate_samples(self, metrics: list[str], codes: npt.NDArray[np.int64], ts_ms: I64) -> None:
        """Invalidate the hours a batch of samples fell in: sample ``i`` is ``metrics[codes[i]]`` at ``ts_ms[i]``."""
        if len(ts_ms) == 0:
            return
        hours = ts_ms // BLOCK_MS
        # One int64 key per (metric, hour): a 1-D unique sorts numbers, where unique(axis=1)
        # sorted rows as structured values (a large share of ``ki import``'s CPU). Hours since 1970 fit
        # 24 bits until 3883 (the schema ends in 2149).
        keys = np.unique((codes.astype(np.int64) << 24) | (hours & 0xFFFFFF))
        self.invalidate((metrics[k >> 24], (k & 0xFFFFFF) * BLOCK_MS) for k in keys.tolist())

    def clear(self) -> None:
        """Forget everything, and refuse fills already under way (after a write we cannot map to hours)."""
        with self._lock:
            self._gen += 1
            self._floor = self._gen
            self._touched.clear()
            self._entries.clear()
            self._bytes = 0

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                len(self._entries),
                self._bytes,
                self.max_bytes,
                self._hits,
                self._misses,
                self._discarded,
                self._failed,
            )


def gather_series(
    labels: list[Labels], want: npt.NDArray[np.uint64], blocks: list[SampleBlock], start_ms: int, end_ms: int
) -> SeriesColumns:
    """The series ``want`` (in that order, labelled ``labels``) cut out of time-ordered blocks, inside the window.

    Each wanted series' samples inside the window in each block are found by two binary
    searches in C (``_windows.series_ranges``: a series' samples ascend, so those outside the
    window are a prefix and a suffix of its range; numpy took a dozen passes, a large share of an
    instant ``deriv``: ``make bench-kql``). When most of the blocks is wanted they
    are laid side by side and gathered once; otherwise each block's wanted ranges are gathered
    first, so a selective query does not copy whole hours. Series with no sample in the window
    are left out.
    """
    n, k = len(want), len(blocks)
    if n == 0 or k == 0:
        return columns_of([])
    # block-major, so each block's row is contiguous for the C call; used as (n, k) views
    starts_kn = np.zeros((k, n), dtype=np.int64)
    lengths_kn = np.zeros((k, n), dtype=np.int64)
    want = np.ascontiguousarray(want, dtype=np.uint64)
    for j, block in enumerate(blocks):
        if len(block.fps) == 0 or len(block.ts) == 0:
            continue
        _windows.series_ranges(
            block.fps, block.offsets, block.ts, want, start_ms, end_ms, starts_kn[j], lengths_kn[j]
        )
    starts, lengths = starts_kn.T, lengths_kn.T
    if k == 1:  # one block (an instant query's window): its wanted ranges straight out of it
        idx = gather_ranges(starts[:, 0], lengths[:, 0])
        flat_ts, flat_vs = blocks[0].ts, blocks[0].vs
        return _gathered(labels, lengths[:, 0], flat_ts, flat_vs, idx)
    total = int(lengths.sum())
    sizes = np.array([len(block.ts) for block in blocks], dtype=np.int64)
    if 2 * total >= int(sizes.sum()):
        idx = gather_ranges((starts + (np.cumsum(sizes) - sizes)[None, :]).ravel(), lengths.ravel())
        flat_ts = np.concatenate([block.ts for block in blocks])
        flat_vs = np.concatenate([block.vs for block in blocks])
    else:
        pieces = [gather_ranges(starts[:, j], lengths[:, j]) for j in range(k)]
        flat_ts = np.concatenate([block.ts[p] for block, p in zip(blocks, pieces, strict=True)])
        flat_vs = np.concatenate([block.vs[p] for block, p in zip(blocks, pieces, strict=True)])
        piece_base = np.cumsum(lengths.sum(axis=0)) - lengths.sum(axis=0)
        within = np.cumsum(lengths, axis=0) - lengths
        idx = gather_ranges((within + piece_base[None, :]).ravel(), lengths.ravel())
    return _gathered(labels, lengths.sum(axis=1), flat_ts, flat_vs, idx)


def _gathered(labels: list[Labels], counts: I64, flat_ts: I64, flat_vs: F64, idx: I64) -> SeriesColumns:
    """The gathered samples as columns: each series ``counts`` of them in order, the empty ones left out."""
    nonempty = counts > 0
    if nonempty.all():
        kept = counts
        kept_labels = list(labels)  # a list of the caller's own (the selection cache keeps ``labels``)
    else:
        kept = counts[nonempty]
        kept_labels = [lab for lab, keep in zip(labels, nonempty.tolist(), strict=True) if keep]
    offsets = np.zeros(len(kept) + 1, dtype=np.int64)
    np.cumsum(kept, out=offsets[1:])
    return SeriesColumns(kept_labels, flat_ts[idx], flat_vs[idx], offsets)
