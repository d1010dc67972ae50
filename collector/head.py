"""The head: recent float samples of the active series and their postings, in memory (docs/storage.md, "The head").

Alert rules, dashboards and the health snapshot read the last minutes of many series; reading
those from ClickHouse means the newest, still unmerged parts and a series-table scan per query.
The head answers them the way Prometheus' head block does: a postings index (label name and value
-> series) finds the few hundred series of a selector among hundreds of thousands, and the
samples since ``coverage_start`` are columns in memory. ClickHouse stays the durable store and
the source of everything older; the head is filled by the same writes after they commit and is
rebuilt from ClickHouse at start, so it is exact: every float sample acknowledged with a timestamp
at or after ``coverage_start`` is in it. Bounded by a window and a memory budget: the oldest
blocks go first, and ``coverage_start`` moves past them (reads before it go to ClickHouse).

Layout: samples are appended to an open block in arrival order (series id, timestamp, value);
a full open block is sealed, sorted by series id, into a :class:`_Block` (per series present:
its id and the offset of its run; per sample: ms since the block's first timestamp as int32 and
the value as float64: 12 bytes a sample). A read gathers the runs of its series from each block
whose time range meets the window (binary search per series, no per-sample Python work).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kernel_insight.kql.errors import QueryTimeoutError, TooManySamplesError, TooManySeriesError
from kernel_insight.kql.pushdown import GridColumns, SeriesColumns, columns_of
from kernel_insight.kql.storage import Labels, Matcher, ReadBudget, is_stale, labels_match

__all__ = ["DEFAULT_HEAD_BYTES", "DEFAULT_HEAD_WINDOW_MS", "Head", "HeadStats", "concat_columns"]

log = logging.getLogger(__name__)

#: How much of the recent past the head keeps, by sample time (``ki collector --head-minutes``).
DEFAULT_HEAD_WINDOW_MS = 30 * 60 * 1000
#: The head's memory budget (``ki collector --head-mb``): past it the oldest blocks are dropped.
DEFAULT_HEAD_BYTES = 1024 * 1024 * 1024
#: Samples an open block takes before it is sealed (sorted by series): a read filters the open
#: block sample by sample, the sealed ones series by series.
OPEN_BLOCK_SAMPLES = 1 << 16
#: Sealed blocks are merged, four or more neighbours at a time, up to this many samples: a read
#: searches each block once per series, so fewer, larger blocks; eviction drops whole blocks.
MAX_BLOCK_SAMPLES = 1 << 24
#: ...and up to this fraction of the window in time: eviction drops a block only once its newest
#: sample has left the window, so a merged block of a long span would keep that much more than
#: the window in memory (at a few thousand samples a second, 2**24 samples are hours).
MAX_BLOCK_SPAN_OF_WINDOW = 1 / 8
#: Estimated bytes a series costs beside its samples (labels, postings entries, ids).
SERIES_OVERHEAD_BYTES = 400
#: Series left by the equality matchers that the other matchers check on their labels rather
#: than through postings (:meth:`Head.matching`): this many, or this share of the head's series
#: when that is more.
FILTER_BY_LABELS_MAX = 256
FILTER_BY_LABELS_SHARE = 1 / 64
_MIN_TS = -(2**63)

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class HeadStats:
    """What the head holds, for ``/metrics`` (docs/metrics.md, ``ki_head_*``)."""

    series: int
    samples: int
    bytes: int
    blocks: int
    coverage_start_ms: int | None  # None: every sample ever written is in the head
    evicted_blocks: int
    evicted_for_budget: int
    late_samples: int  # written with a timestamp before coverage_start: ClickHouse only
    ready: bool


@dataclass(frozen=True, slots=True)
class _Block:
    """Sealed samples, grouped by series id (ascending), each run in arrival order."""

    sids: I32  # series present, ascending
    offsets: I64  # len(sids) + 1: series sids[i] owns samples offsets[i]:offsets[i+1]
    base: int  # ms; every timestamp is base + dt
    dt: I32
    values: F64
    tmin: int
    tmax: int
    #: Whether every run is in time order (a series' last sample is then its newest).
    ordered: bool
    #: series id -> index into ``sids`` (-1: absent), made by the first read (:meth:`runs`).
    run_of: list[I32] = field(default_factory=list, compare=False)

    @property
    def nbytes(self) -> int:
        return int(self.sids.nbytes + self.offsets.nbytes + self.dt.nbytes + self.values.nbytes)

    @staticmethod
    def seal(sid: I32, ts: I64, vs: F64) -> _Block:
        order = np.argsort(sid, kind="stable")  # arrival order kept within a series
        sid, ts, vs = sid[order], ts[order], vs[order]
        starts = np.flatnonzero(np.concatenate(([True], sid[1:] != sid[:-1])))
        offsets = np.append(starts, len(sid)).astype(np.int64)
        tmin, tmax = int(ts.min()), int(ts.max())
        if tmax - tmin >= 2**31:  # not expected: blocks span seconds; keep int64 exactness anyway
            raise ValueError("block spans more than 24 days")
        rising = ts[1:] >= ts[:-1]
        rising[starts[1:] - 1] = True  # where one run ends and the next begins
        ordered = bool(rising.all())
        return _Block(
            sid[starts], offsets, tmin, (ts - tmin).astype(np.int32), vs.copy(), tmin, tmax, ordered
        )

    @staticmethod
    def merge(blocks: Sequence[_Block]) -> _Block:
        """One block of the samples of ``blocks`` (in arrival order): runs stay in arrival order."""
        sid = np.concatenate([np.repeat(b.sids, np.diff(b.offsets)) for b in blocks])
        ts = np.concatenate([b.base + b.dt.astype(np.int64) for b in blocks])
        vs = np.concatenate([b.values for b in blocks])
        return _Block.seal(sid, ts, vs)

    def runs(self, sids: I32) -> I32:
        """The index into ``sids`` of each series of ``sids`` (-1 where the block has none): one
        gather from a map made on the first read (a block is sealed once and read by every
        query after; 4 bytes per series id up to the largest here), not a binary search each."""
        if not self.run_of:
            top = int(self.sids[-1]) + 1 if len(self.sids) else 0
            if len(self.sids) * 8 < top:  # a block of few series: no map the size of every id
                at = np.minimum(np.searchsorted(self.sids, sids), len(self.sids) - 1)
                return np.where(self.sids[at] == sids, at, -1).astype(np.int32)
            run_of = np.full(top, -1, dtype=np.int32)
            run_of[self.sids] = np.arange(len(self.sids), dtype=np.int32)
            self.run_of.append(run_of)
        run_of = self.run_of[0]
        inside = sids < len(run_of)
        if inside.all():
            return run_of[sids]
        out = np.full(len(sids), -1, dtype=np.int32)
        out[inside] = run_of[sids[inside]]
        return out

    def gather(self, sids: I32, ranks: I64, lo: int, hi: int, most: int) -> tuple[I64, I64, I64, F64]:
        """(ranks, lengths, ts, values): the runs of the series of ``sids`` here with samples at
        ``lo <= ts <= hi`` (each series' rank and its count of samples, in ``sids``' order) and
        those samples run after run; TooManySamplesError past ``most`` samples, before
        gathering them when it can."""
        if not len(self.sids):
            return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0)
        at = self.runs(sids)
        hit = at >= 0
        where = at[hit]
        a = self.offsets[where]
        lengths = self.offsets[where + 1] - a
        inside = lo <= self.tmin and self.tmax <= hi
        if inside and int(lengths.sum()) > most:
            raise TooManySamplesError()
        idx = _ranges(a, lengths)
        r, t, v = ranks[hit], self.base + self.dt[idx].astype(np.int64), self.values[idx]
        if not inside:
            keep = (t >= lo) & (t <= hi)
            t, v = t[keep], v[keep]
            if len(t) > most:
                raise TooManySamplesError()
            before = np.zeros(len(keep) + 1, dtype=np.int64)  # samples kept before each place
            np.cumsum(keep, out=before[1:])
            bounds = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=bounds[1:])
            lengths = np.diff(before[bounds])
            some = lengths > 0
            r, lengths = r[some], lengths[some]
        return r, lengths, t, v


def _ranges(starts: I64, lengths: I64) -> I64:
    """Concatenated ``arange(s, s + n)`` for each (s, n), without a Python loop."""
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, np.int64)
    shift = np.repeat(starts - np.cumsum(lengths) + lengths, lengths)
    return shift + np.arange(total, dtype=np.int64)


def _last_grid(labels: list[Labels], ts: I64, vs: F64, sample_times: bool) -> GridColumns:
    """One step's :class:`GridColumns` of series' last samples (a stale marker is not present)."""
    column = vs.reshape(-1, 1)
    return GridColumns(labels, column, ts.reshape(-1, 1) if sample_times else None, ~is_stale(column))


def _place_in(sids: I32, osid: I32) -> I64:
    """Where each of ``osid`` is in ``sids`` (ascending), -1 where it is not: the open block's
    samples of a selection, by a binary search each (the open block is small; no array the size
    of every series id)."""
    if not len(sids):
        return np.full(len(osid), -1, dtype=np.int64)
    at = np.minimum(np.searchsorted(sids, osid), len(sids) - 1)
    return np.where(sids[at] == osid, at, -1)


def _newest(r: I64, t: I64, v: F64) -> tuple[I64, I64, F64]:
    """Per distinct ``r``, its sample with the greatest time (of several at that time the last in
    the arrays): (r's, times, values), ``r`` ascending."""
    if not len(r):
        return r, t, v
    order = np.lexsort((np.arange(len(t)), t, r))
    r, t, v = r[order], t[order], v[order]
    last = np.append(r[1:] != r[:-1], True)
    return r[last], t[last], v[last]


def concat_columns(older: SeriesColumns, newer: SeriesColumns) -> SeriesColumns:
    """Two reads of the same selector over adjacent windows (every sample of ``older`` before every
    sample of ``newer``) as one: each series' samples joined, series sorted by labels. Floats only."""
    if not len(older):
        return newer
    if not len(newer):
        return older
    if older.hist is not None or newer.hist is not None or older.st is not None or newer.st is not None:
        raise ValueError("concat_columns joins float samples only")
    labels = sorted(set(older.labels) | set(newer.labels))
    pos = {lab: i for i, lab in enumerate(labels)}
    a_at = np.array([pos[lab] for lab in older.labels], np.int64)
    b_at = np.array([pos[lab] for lab in newer.labels], np.int64)
    a_len, b_len = np.diff(older.offsets), np.diff(newer.offsets)
    before = np.zeros(len(labels), np.int64)  # each series' samples from the older read
    before[a_at] = a_len
    lengths = before.copy()
    lengths[b_at] += b_len
    offsets = np.zeros(len(labels) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ts = np.empty(int(offsets[-1]), np.int64)
    vs = np.empty(int(offsets[-1]), np.float64)
    a_dst = _ranges(offsets[a_at], a_len)
    ts[a_dst], vs[a_dst] = older.ts, older.vs
    b_dst = _ranges(offsets[b_at] + before[b_at], b_len)
    ts[b_dst], vs[b_dst] = newer.ts, newer.vs
    return SeriesColumns(labels, ts, vs, offsets)


def find_sorted(haystack: npt.NDArray[np.uint64], needles: npt.NDArray[np.uint64]) -> I64:
    """Where each of ``needles`` is in the sorted ``haystack`` (-1: not there).

    Searched in ascending order: random fingerprints into a large array miss the cache at every
    step of a binary search, sorted ones walk it in order (several times faster at 200k series).
    """
    out = np.full(len(needles), -1, dtype=np.int64)
    if not len(haystack) or not len(needles):
        return out
    order = np.argsort(needles)
    ordered = needles[order]
    at = np.minimum(np.searchsorted(haystack, ordered), len(haystack) - 1)
    hit = haystack[at] == ordered
    out[order[hit]] = at[hit]
    return out


class _FpIndex:
    """fingerprint -> series id for a whole batch at once: a sorted array searched with numpy, and
    the series added since it was last sorted in a dict (merged in once they are an eighth)."""

    def __init__(self, fps: npt.NDArray[np.uint64] | None = None) -> None:
        fps = np.empty(0, np.uint64) if fps is None else fps
        order = np.argsort(fps)
        self.fps = fps[order]
        self.sids = order.astype(np.int32)
        self.pending: dict[int, int] = {}

    def lookup(self, fps: npt.NDArray[np.uint64]) -> I32:
        out = np.full(len(fps), -1, dtype=np.int32)
        at = find_sorted(self.fps, fps)
        hit = at >= 0
        out[hit] = self.sids[at[hit]]
        if self.pending:
            for j in np.flatnonzero(out < 0).tolist():
                out[j] = self.pending.get(int(fps[j]), -1)
        return out

    def add(self, fp: int, sid: int) -> None:
        self.add_many([fp], [sid])

    def add_many(self, fps: Sequence[int], sids: Iterable[int]) -> None:
        self.pending.update(zip(fps, sids, strict=True))
        if len(self.pending) > max(4096, len(self.fps) // 8):
            all_fps = np.concatenate(
                [self.fps, np.fromiter(self.pending.keys(), np.uint64, len(self.pending))]
            )
            all_sids = np.concatenate(
                [self.sids, np.fromiter(self.pending.values(), np.int32, len(self.pending))]
            )
            order = np.argsort(all_fps, kind="stable")
            self.fps, self.sids, self.pending = all_fps[order], all_sids[order], {}


class _Postings:
    """label name -> value -> series ids (ascending lists; numpy views made on demand)."""

    def __init__(self) -> None:
        self.by_name: dict[str, dict[str, list[int]]] = {}
        self._arrays: dict[tuple[str, str], tuple[int, I32]] = {}

    def add(self, sid: int, labels: Labels) -> None:
        self.add_many(sid, [labels])

    def add_many(self, first: int, series: Sequence[Labels]) -> None:
        """Series ``first``, ``first + 1``, ... with the labels ``series``, in that order."""
        # Grouped by label pair first: one dict step per pair of a series, then one per distinct pair.
        grouped: defaultdict[tuple[str, str], list[int]] = defaultdict(list)
        for sid, labels in enumerate(series, first):
            for pair in labels:
                grouped[pair].append(sid)
        by_name = self.by_name
        for (name, value), sids in grouped.items():
            values = by_name.get(name)
            if values is None:
                values = by_name[name] = {}
            ids = values.get(value)
            if ids is None:
                values[value] = sids
            else:
                ids.extend(sids)

    def ids(self, name: str, value: str) -> I32:
        ids = self.by_name.get(name, {}).get(value)
        if ids is None:
            return np.empty(0, np.int32)
        cached = self._arrays.get((name, value))
        if cached is not None and cached[0] == len(ids):
            return cached[1]
        arr = np.array(ids, dtype=np.int32)
        self._arrays[(name, value)] = (len(ids), arr)
        return arr

    def union(self, name: str, values: Sequence[str]) -> I32:
        if not values:
            return np.empty(0, np.int32)
        if len(values) == 1:
            return self.ids(name, values[0])
        return np.unique(np.concatenate([self.ids(name, v) for v in values]))


class Head:
    """Recent float samples of every active series, exact from ``coverage_start_ms`` on.

    >>> h = Head(window_ms=60_000)
    >>> h.append([(("__name__", "up"), ("job", "a"))], np.array([1], np.uint64), np.array([0], np.int32),
    ...          np.array([1_000]), np.array([1.0]))
    >>> len(h.select_columns([Matcher("job", "=", "a")], 0, 2_000))
    1
    """

    def __init__(
        self,
        *,
        window_ms: int = DEFAULT_HEAD_WINDOW_MS,
        max_bytes: int = DEFAULT_HEAD_BYTES,
        open_block_samples: int = OPEN_BLOCK_SAMPLES,
        coverage_start_ms: int | None = None,
        ready: bool = True,
    ) -> None:
        self.window_ms = window_ms
        self.max_bytes = max_bytes
        self.open_block_samples = open_block_samples
        self._lock = threading.Lock()
        self._index = _FpIndex()  # fingerprint -> series id
        #: Bumped whenever a series is added or dropped: cached selections of an older one are stale.
        self._series_version = 0
        #: Bumped whenever series ids are renumbered (series dropped, a reset): ids matched before are void.
        self._numbering = 0
        self._selections: dict[tuple[Matcher, ...], tuple[int, I32, I64, list[Labels]]] = {}
        self._labels: list[Labels] = []
        self._fps: list[int] = []  # per series: its fingerprint
        self._postings = _Postings()
        self._blocks: list[_Block] = []  # sealed, in arrival order
        self._open: list[tuple[I32, I64, F64]] = []
        self._open_n = 0
        self._open_cat: tuple[I32, I64, F64] | None = None
        self._coverage = _MIN_TS if coverage_start_ms is None else coverage_start_ms
        self._max_ts = _MIN_TS
        self._bytes = 0
        self._evicted = 0
        self._evicted_budget = 0
        self._late = 0
        self._warned_budget = False
        self.ready = ready
        self._merging = False
        #: Bumped by every reset: a load begun before one is not applied after it.
        self.generation = 0

    # ---- writes ------------------------------------------------------------------------

    def append(
        self,
        series: Sequence[Labels],
        fingerprints: npt.NDArray[np.uint64],
        series_idx: I32,
        ts_ms: I64,
        values: F64,
    ) -> None:
        """Samples just committed to ClickHouse: ``series[series_idx[i]]`` (fingerprint
        ``fingerprints[series_idx[i]]``) has ``values[i]`` at ``ts_ms[i]``."""
        if not len(ts_ms):
            return
        with self._lock:
            local = self._sids(series, np.asarray(fingerprints, np.uint64), np.unique(series_idx))
            sid = local[series_idx]
            ts = np.asarray(ts_ms, dtype=np.int64)
            vs = np.asarray(values, dtype=np.float64)
            late = ts < self._coverage
            if late.any():  # older than what the head covers: ClickHouse answers those times
                self._late += int(late.sum())
                keep = ~late
                sid, ts, vs = sid[keep], ts[keep], vs[keep]
                if not len(ts):
                    return
            self._open.append((sid, ts.copy(), vs.copy()))
            self._open_n += len(ts)
            self._open_cat = None
            self._bytes += len(ts) * 20
            self._max_ts = max(self._max_ts, int(ts.max()))
            if self._open_n >= self.open_block_samples:
                self._seal()
            self._evict()
            run = self._merge_candidates()
        if run:  # on its own thread: the write that sealed the block returns now
            threading.Thread(target=self._merge, args=(run,), name="ki-head-merge", daemon=True).start()

    def _sids(self, series: Sequence[Labels], fps: npt.NDArray[np.uint64], used: I64) -> I32:
        """Series ids of ``series[used]`` (fingerprints ``fps``), new series added; -1 elsewhere."""
        local = np.full(len(series), -1, dtype=np.int32)
        found = self._index.lookup(fps[used])
        missed = np.flatnonzero(found < 0)
        if len(missed):  # new series (one may come twice in the batch)
            found[missed] = self._add_series(series, fps, used[missed])
        local[used] = found
        return local

    def _add_series(self, series: Sequence[Labels], fps: npt.NDArray[np.uint64], idx: I64) -> I32:
        """Ids of ``series[idx]``, which the batch lookup missed: added now, in order of first
        appearance, once each (a fingerprint that comes twice gets one id)."""
        uniq, first, inverse = np.unique(fps[idx], return_index=True, return_inverse=True)
        rank = np.argsort(first, kind="stable")  # the new series in order of first appearance
        base = len(self._labels)
        sid_of = np.empty(len(uniq), dtype=np.int32)
        sid_of[rank] = np.arange(base, base + len(uniq), dtype=np.int32)
        firsts = idx[first[rank]].tolist()
        labels = [series[i] for i in firsts]
        new_fps = fps[firsts].tolist()
        self._series_version += len(firsts)
        self._index.add_many(new_fps, range(base, base + len(firsts)))
        self._labels.extend(labels)
        self._fps.extend(new_fps)
        self._postings.add_many(base, labels)
        self._bytes += SERIES_OVERHEAD_BYTES * len(firsts)
        return sid_of[inverse.reshape(-1)]

    def _seal(self) -> None:
        if not self._open_n:
            return
        sid, ts, vs = self._open_arrays()
        block = _Block.seal(sid, ts, vs)
        self._blocks.append(block)
        self._bytes += block.nbytes - self._open_n * 20
        self._open, self._open_n, self._open_cat = [], 0, None

    def _merge_candidates(self) -> list[_Block]:
        """Four or more neighbouring small blocks to merge (under the lock); [] when none or busy."""
        if self._merging:
            return []
        span = self.window_ms * MAX_BLOCK_SPAN_OF_WINDOW
        run: list[_Block] = []
        for b in self._blocks:
            if len(b.values) * 4 > MAX_BLOCK_SAMPLES or b.tmax - b.tmin > span / 2:
                if len(run) >= 4:
                    break
                run = []
                continue
            if run and max(b.tmax, *(x.tmax for x in run)) - min(b.tmin, *(x.tmin for x in run)) > span:
                if len(run) >= 4:
                    break
                run = [b]
                continue
            run.append(b)
            if len(run) == 8 or sum(len(x.values) for x in run) * 2 >= MAX_BLOCK_SAMPLES:
                break
        if len(run) < 4:
            return []
        self._merging = True
        return run

    def _merge(self, run: list[_Block]) -> None:
        """Merge ``run`` outside the lock (writers and readers go on), then swap it in if its
        blocks are all still there (eviction may have taken the oldest meanwhile)."""
        try:
            merged = _Block.merge(run)
            with self._lock:
                at = next((i for i, b in enumerate(self._blocks) if b is run[0]), -1)
                if at >= 0 and all(
                    at + k < len(self._blocks) and self._blocks[at + k] is b for k, b in enumerate(run)
                ):
                    self._blocks[at : at + len(run)] = [merged]
                    self._bytes += merged.nbytes - sum(b.nbytes for b in run)
        finally:
            with self._lock:
                self._merging = False

    def _open_arrays(self) -> tuple[I32, I64, F64]:
        if self._open_cat is None:
            if not self._open:
                self._open_cat = (np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0))
            else:
                self._open_cat = (
                    np.concatenate([o[0] for o in self._open]),
                    np.concatenate([o[1] for o in self._open]),
                    np.concatenate([o[2] for o in self._open]),
                )
                self._open = [self._open_cat]
        return self._open_cat

    def _evict(self) -> None:
        """Drop the oldest blocks past the window or the budget (the open block too when nothing
        else is left), then the series no block holds any more."""
        horizon = self._max_ts - self.window_ms
        evicted = False
        while True:
            if self._blocks and (self._blocks[0].tmax < horizon or self._bytes > self.max_bytes):
                block = self._blocks.pop(0)
                over_budget = block.tmax >= horizon
                self._bytes -= block.nbytes
                self._evicted += 1
                self._coverage = max(self._coverage, block.tmax + 1)
                evicted = True
                if over_budget:
                    self._evicted_budget += 1
                    if not self._warned_budget:
                        self._warned_budget = True
                        log.warning(
                            "head: over its memory budget of %.0f MiB with %d series; the oldest samples are "
                            "dropped from memory (answered from ClickHouse): raise --head-mb",
                            self.max_bytes / 2**20,
                            len(self._labels),
                        )
                continue
            if self._bytes > self.max_bytes and self._open_n:
                self._seal()  # evicted next round
                continue
            break
        if evicted:
            self._collect_series()

    def _collect_series(self) -> None:
        """Forget the series that no block holds a sample of any more (as Prometheus' head
        garbage-collects series without chunks), renumbering the rest in order, once they are a
        quarter of all, or at once while over the budget."""
        n = len(self._labels)
        live = np.zeros(n, dtype=bool)
        for b in self._blocks:
            live[b.sids] = True
        if self._open_n:
            live[self._open_arrays()[0]] = True
        dead = n - int(live.sum())
        if dead == 0 or (dead * 4 < n and self._bytes <= self.max_bytes):
            return
        renumber = np.cumsum(live, dtype=np.int64) - 1
        self._blocks = [
            _Block(
                renumber[b.sids].astype(np.int32),
                b.offsets,
                b.base,
                b.dt,
                b.values,
                b.tmin,
                b.tmax,
                b.ordered,
            )
            for b in self._blocks
        ]
        if self._open_n:
            osid, ots, ovs = self._open_arrays()
            self._open_cat = (renumber[osid].astype(np.int32), ots, ovs)
            self._open = [self._open_cat]
        kept = np.flatnonzero(live).tolist()
        labels = self._labels
        self._labels = [labels[i] for i in kept]
        self._postings = _Postings()
        self._fps = [self._fps[i] for i in kept]
        self._index = _FpIndex(np.array(self._fps, dtype=np.uint64))
        self._series_version += 1
        self._numbering += 1
        self._postings.add_many(0, self._labels)
        self._bytes -= dead * SERIES_OVERHEAD_BYTES

    def stats(self) -> HeadStats:
        with self._lock:
            samples = self._open_n + sum(len(b.values) for b in self._blocks)
            return HeadStats(
                series=len(self._labels),
                samples=samples,
                bytes=self._bytes,
                blocks=len(self._blocks),
                coverage_start_ms=None if self._coverage == _MIN_TS else self._coverage,
                evicted_blocks=self._evicted,
                evicted_for_budget=self._evicted_budget,
                late_samples=self._late,
                ready=self.ready,
            )

    @property
    def coverage_start_ms(self) -> int:
        """Every float sample written with a timestamp at or after this is in the head."""
        return self._coverage

    def covers(self, start_ms: int) -> bool:
        """Whether a read from ``start_ms`` on can be answered from the head alone."""
        return self.ready and start_ms >= self._coverage

    # ---- reads -------------------------------------------------------------------------

    def _selection(self, matchers: Sequence[Matcher]) -> tuple[I32, I64, list[Labels], int]:
        """The matching series (ascending ids), each one's rank in label order, their labels in
        that order, and the numbering the ids belong to; kept per selector while no series is
        added or dropped (rules and dashboards ask the same ones again and again)."""
        key = tuple(matchers)
        with self._lock:
            version, numbering = self._series_version, self._numbering
            hit = self._selections.get(key)
        if hit is not None and hit[0] == version:
            return hit[1], hit[2], hit[3], numbering
        sids = self.matching(matchers)
        with self._lock:
            if numbering != self._numbering:  # renumbered meanwhile: the caller asks again
                return sids, np.arange(len(sids), dtype=np.int64), [], -1
            if version != self._series_version:  # series added meanwhile: answer, keep nothing
                version = -1
            labels = [self._labels[i] for i in sids.tolist()]
        order = sorted(range(len(labels)), key=labels.__getitem__)
        rank = np.empty(len(labels), dtype=np.int64)
        rank[np.asarray(order, dtype=np.int64)] = np.arange(len(labels), dtype=np.int64)
        in_order = [labels[i] for i in order]
        if version >= 0:
            if len(self._selections) >= 4096:
                self._selections.clear()
            self._selections[key] = (version, sids, rank, in_order)
        return sids, rank, in_order, numbering

    def matching(self, matchers: Sequence[Matcher]) -> I32:
        """Ids of the series that satisfy every matcher, ascending.

        The equality matchers' postings are intersected first. When that leaves no series, the
        other matchers are not looked at; when it leaves few (``FILTER_BY_LABELS_MAX``, or
        ``FILTER_BY_LABELS_SHARE`` of the head), the others are checked on those series' labels
        instead of through postings: ``instance!=""`` beside ``__name__="x"`` (the health
        snapshot's selectors) would otherwise unite the postings of every instance, every time."""
        with self._lock:
            n = len(self._labels)
            postings = self._postings
            equal = sorted(
                (postings.ids(m.name, m.value) for m in matchers if m.op == "=" and m.value), key=len
            )
            rest = [m for m in matchers if not (m.op == "=" and m.value)]
            ids: I32 | None = None
            if equal:
                ids = equal[0]
                for other in equal[1:]:
                    if not len(ids):
                        break
                    ids = ids[np.isin(ids, other, assume_unique=True)]
                if not len(ids) or not rest:
                    return ids
                if len(ids) <= max(FILTER_BY_LABELS_MAX, n * FILTER_BY_LABELS_SHARE):
                    labels = self._labels
                    keep = [i for i in ids.tolist() if labels_match(labels[i], rest)]
                    return np.asarray(keep, dtype=np.int32)
            positive: list[I32] = []
            negative: list[I32] = []
            for m in rest:
                values = postings.by_name.get(m.name, {})
                if m.matches_empty():  # series without the label match: exclude the values it rejects
                    rejected = [v for v in list(values) if not m.matches(v)]
                    negative.append(postings.union(m.name, rejected))
                else:
                    positive.append(postings.union(m.name, [v for v in list(values) if m.matches(v)]))
        if ids is not None:
            positive.append(ids)
        if positive:
            positive.sort(key=len)
            ids = positive[0]
            for other in positive[1:]:
                if not len(ids):
                    break
                ids = ids[np.isin(ids, other, assume_unique=True)]
        else:
            ids = np.arange(n, dtype=np.int32)
        for other in negative:
            if len(ids) and len(other):
                ids = ids[~np.isin(ids, other, assume_unique=True)]
        return ids

    def select_columns(
        self,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        budget: ReadBudget | None = None,
        max_series: int | None = None,
        exclude_metrics: frozenset[str] = frozenset(),
    ) -> SeriesColumns | None:
        """The matching series' samples with ``start_ms <= t <= end_ms``, as the store answers
        them (sorted by labels, time ascending, one sample per timestamp: the last written).

        None when the selector may match a metric of ``exclude_metrics`` (native histograms and start
        timestamps are ClickHouse's to answer: the head holds float values only, and knows nothing
        of series that have none)."""
        names = [m for m in matchers if m.name == "__name__"]
        if any(all(m.matches(x) for m in names) for x in exclude_metrics):
            return None
        for _ in range(8):
            sids, label_rank, in_order, numbering = self._selection(matchers)
            if numbering >= 0:
                break
        else:
            return None  # renumbered under every try: let ClickHouse answer
        if not len(sids) or end_ms < start_ms:
            return columns_of([])
        with self._lock:
            blocks = [b for b in self._blocks if b.tmax >= start_ms and b.tmin <= end_ms]
            if numbering != self._numbering:
                return None  # series renumbered since they were matched: let ClickHouse answer
            osid, ots, ovs = self._open_arrays()
        lo = max(start_ms, self._coverage)
        # Each part (a block's runs, or the open block's samples grouped by series) is placed
        # where its series' samples go in the answer (series in label order, each one's parts in
        # arrival order) by one scatter, without sorting the samples.
        runs: list[tuple[I64, I64, I64, F64]] = []
        most = budget.max_samples if budget is not None else 2**62
        for b in blocks:
            part = b.gather(sids, label_rank, lo, end_ms, most)
            most -= len(part[2])
            runs.append(part)
        if len(osid):
            at = _place_in(sids, osid)
            r = label_rank[np.maximum(at, 0)]
            m = (at >= 0) & (ots >= lo) & (ots <= end_ms)
            if int(m.sum()) > most:
                raise TooManySamplesError()
            r, t, v = r[m], ots[m], ovs[m]
            order = np.argsort(r, kind="stable")  # one series' samples in arrival order
            r, t, v = r[order], t[order], v[order]
            run_ranks, lengths = np.unique(r, return_counts=True)
            runs.append((run_ranks, lengths.astype(np.int64), t, v))
        if budget is not None and time.monotonic() >= budget.deadline:
            raise QueryTimeoutError.after(budget.timeout_s)
        counts = np.zeros(len(sids), dtype=np.int64)
        for run_ranks, lengths, _, _ in runs:
            counts[run_ranks] += lengths  # a series has one run per part
        total = int(counts.sum())
        if total == 0:
            return columns_of([])
        ends = np.cumsum(counts)
        cursor = ends - counts
        if len(runs) == 1 and np.array_equal(runs[0][0], np.arange(len(sids))):
            t, v = runs[0][2], runs[0][3]  # one part, already in label order
        else:
            t = np.empty(total, dtype=np.int64)
            v = np.empty(total, dtype=np.float64)
            for run_ranks, lengths, pt, pv in runs:
                dst = _ranges(cursor[run_ranks], lengths)
                t[dst] = pt
                v[dst] = pv
                cursor[run_ranks] += lengths
        present = np.flatnonzero(counts)
        offsets = np.zeros(len(present) + 1, dtype=np.int64)
        offsets[1:] = ends[present]
        rising = t[1:] > t[:-1]
        rising[offsets[1:-1] - 1] = True  # where one series ends and the next begins
        if not rising.all():  # a late or repeated sample: time order, last write wins
            r = np.repeat(np.arange(len(present), dtype=np.int64), np.diff(offsets))
            order = np.lexsort((np.arange(len(t)), t, r))
            r, t, v = r[order], t[order], v[order]
            last = np.append((r[1:] != r[:-1]) | (t[1:] != t[:-1]), True)
            r, t, v = r[last], t[last], v[last]
            offsets[1:] = np.cumsum(np.bincount(r, minlength=len(present)))
        if max_series is not None and len(present) > max_series:
            raise TooManySeriesError(
                f"query selected {len(present)} series, more than the limit of {max_series}"
            )
        # The selection's own label-set objects: kql remembers groupings and joins by them.
        out_labels = (
            list(in_order) if len(present) == len(in_order) else [in_order[i] for i in present.tolist()]
        )
        return SeriesColumns(out_labels, t, v, offsets)

    def select_last(
        self,
        matchers: Sequence[Matcher],
        time_ms: int,
        first_ms: int,
        budget: ReadBudget | None = None,
        exclude_metrics: frozenset[str] = frozenset(),
        sample_times: bool = True,
    ) -> GridColumns | None:
        """Each matching series' newest sample with ``first_ms <= t <= time_ms`` (of several at
        that time, the last written) as the engine's lookup takes it (a stale marker is not
        present), series sorted by labels, those without one left out: an instant selector's
        read, without gathering every sample of the lookback window (a sealed block whose runs
        are in time order gives each series' last sample). None as for :meth:`select_columns`."""
        names = [m for m in matchers if m.name == "__name__"]
        if any(all(m.matches(x) for m in names) for x in exclude_metrics):
            return None
        for _ in range(8):
            sids, label_rank, in_order, numbering = self._selection(matchers)
            if numbering >= 0:
                break
        else:
            return None
        if not len(sids) or time_ms < first_ms:
            return _last_grid([], np.empty(0, np.int64), np.empty(0), sample_times)
        with self._lock:
            blocks = [b for b in self._blocks if b.tmax >= first_ms and b.tmin <= time_ms]
            if numbering != self._numbering:
                return None
            osid, ots, ovs = self._open_arrays()
        lo = max(first_ms, self._coverage)
        n = len(sids)
        best_t = np.full(n, _MIN_TS, dtype=np.int64)
        best_v = np.zeros(n)
        where = np.arange(n, dtype=np.int64)  # a series' place in sids
        most = budget.max_samples if budget is not None else 2**62
        for b in blocks:  # in arrival order: of two samples at one time the later part's wins
            if b.ordered and b.tmax <= time_ms:
                at = b.runs(sids)
                pos = np.flatnonzero(at >= 0)
                last = b.offsets[at[pos] + 1] - 1
                t = b.base + b.dt[last].astype(np.int64)
                keep = t >= lo
                pos, t, v = pos[keep], t[keep], b.values[last[keep]]
            else:
                r, lengths, t, v = b.gather(sids, where, lo, time_ms, most)
                pos, t, v = _newest(np.repeat(r, lengths), t, v)
            newer = t >= best_t[pos]
            best_t[pos[newer]] = t[newer]
            best_v[pos[newer]] = v[newer]
        if len(osid):
            r = _place_in(sids, osid)
            m = (r >= 0) & (ots >= lo) & (ots <= time_ms)
            pos, t, v = _newest(r[m], ots[m], ovs[m])
            newer = t >= best_t[pos]
            best_t[pos[newer]] = t[newer]
            best_v[pos[newer]] = v[newer]
        if budget is not None and time.monotonic() >= budget.deadline:
            raise QueryTimeoutError.after(budget.timeout_s)
        found = np.flatnonzero(best_t >= lo)
        found = found[np.argsort(label_rank[found], kind="stable")]
        ranks = label_rank[found]
        labels = list(in_order) if len(found) == n else [in_order[i] for i in ranks.tolist()]
        return _last_grid(labels, best_t[found], best_v[found], sample_times)

    def _in_window(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, exclude_metrics: frozenset[str]
    ) -> tuple[npt.NDArray[np.bool_], int] | None:
        """Which series (a mask over ids) match and have a sample with ``start_ms <= t <= end_ms``,
        and the numbering the ids belong to; None as for :meth:`select_columns`."""
        names = [m for m in matchers if m.name == "__name__"]
        if any(all(m.matches(x) for m in names) for x in exclude_metrics):
            return None
        numbering = self._numbering  # no label order wanted: the selection is not sorted (or kept)
        sids = self.matching(matchers)
        with self._lock:
            blocks = [b for b in self._blocks if b.tmax >= start_ms and b.tmin <= end_ms]
            if numbering != self._numbering:
                return None
            osid, ots, _ = self._open_arrays()
            n_series = len(self._labels)
        lo = max(start_ms, self._coverage)
        seen = np.zeros(n_series, dtype=bool)
        if not len(sids) or end_ms < start_ms:
            return seen, numbering
        where = np.arange(len(sids), dtype=np.int64)
        for b in blocks:
            if lo <= b.tmin and b.tmax <= end_ms:  # every run here is inside the window
                seen[sids[b.runs(sids) >= 0]] = True
            else:
                r, _, _, _ = b.gather(sids, where, lo, end_ms, 2**62)
                seen[sids[r]] = True
        if len(osid):
            m = (_place_in(sids, osid) >= 0) & (ots >= lo) & (ots <= end_ms)
            seen[osid[m]] = True
        return seen, numbering

    def label_names(
        self,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        exclude_metrics: frozenset[str] = frozenset(),
    ) -> list[str] | None:
        """Sorted label names of the matching series with a sample in the window (``__name__``
        included), from the postings; None as for :meth:`select_columns`."""

        def names(postings: _Postings, seen: npt.NDArray[np.bool_]) -> list[str]:
            return [
                n
                for n, values in postings.by_name.items()
                if any(seen[postings.ids(n, v)].any() for v in values)
            ]

        return self._from_postings(matchers, start_ms, end_ms, exclude_metrics, names)

    def label_values(
        self,
        name: str,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        exclude_metrics: frozenset[str] = frozenset(),
    ) -> list[str] | None:
        """Sorted distinct non-empty values of label ``name`` among the matching series with a
        sample in the window, from the postings; None as for :meth:`select_columns`."""

        def values(postings: _Postings, seen: npt.NDArray[np.bool_]) -> list[str]:
            return [v for v in postings.by_name.get(name, {}) if v and seen[postings.ids(name, v)].any()]

        return self._from_postings(matchers, start_ms, end_ms, exclude_metrics, values)

    def _from_postings(
        self,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        exclude_metrics: frozenset[str],
        pick: Callable[[_Postings, npt.NDArray[np.bool_]], list[str]],
    ) -> list[str] | None:
        """``pick`` over the postings (under the lock) and the series that match with a sample in
        the window, sorted; None as for :meth:`select_columns`."""
        found = self._in_window(matchers, start_ms, end_ms, exclude_metrics)
        if found is None:
            return None
        seen, numbering = found
        with self._lock:
            if numbering != self._numbering:
                return None
            return sorted(pick(self._postings, seen))

    def reset(self, coverage_start_ms: int | None) -> None:
        """Forget everything (a raw statement may have changed samples): not ready until :meth:`load`."""
        with self._lock:
            self.ready = False
            self.generation += 1
            self._index = _FpIndex()
            self._series_version += 1
            self._numbering += 1
            self._labels.clear()
            self._fps.clear()
            self._postings = _Postings()
            self._blocks.clear()
            self._open, self._open_n, self._open_cat = [], 0, None
            self._coverage = _MIN_TS if coverage_start_ms is None else coverage_start_ms
            self._max_ts = _MIN_TS
            self._bytes = 0

    def load(
        self,
        generation: int,
        series: Sequence[Labels],
        fingerprints: npt.NDArray[np.uint64],
        sid: I32,
        ts: I64,
        vs: F64,
    ) -> bool:
        """Samples read back from ClickHouse at start: placed before everything written since, so
        a write that raced the load (and so is in both) wins as the later one. False (nothing
        done) when the head was reset since ``generation`` was read."""
        with self._lock:
            if generation != self.generation:
                return False
            local = self._sids(series, np.asarray(fingerprints, np.uint64), np.arange(len(series)))
            if len(ts):
                block = _Block.seal(local[sid], ts.astype(np.int64), vs.astype(np.float64))
                self._blocks.insert(0, block)
                self._bytes += block.nbytes
                self._max_ts = max(self._max_ts, int(ts.max()))
            self.ready = True
            return True
