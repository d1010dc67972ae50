"""kql's storage protocol over the store: label matchers and time windows become SQL filters.

The series table answers which series match (by day, so old series cost nothing); the
samples table is read only for those fingerprints and only inside the window.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from kernel_insight.collector.clickhouse.sql import Params, qualified
from kernel_insight.collector.clickhouse.store import StorageError as StoreError
from kernel_insight.collector.head import Head, concat_columns
from kernel_insight.collector.rows import MAX_TS_MS, MIN_TS_MS
from kernel_insight.collector.sample_cache import BLOCK_MS, SampleBlock, SampleCache, gather_series
from kernel_insight.kql import _windows
from kernel_insight.kql.errors import QueryTimeoutError, TooManySamplesError
from kernel_insight.kql.functions import FUNCTIONS
from kernel_insight.kql.histogram import HISTOGRAM_MIN_WEIGHT
from kernel_insight.kql.pushdown import GridColumns, HistColumns, SeriesColumns, columns_of, gather_ranges
from kernel_insight.kql.regex import anchored, compile_anchored
from kernel_insight.kql.sparsehists import Ragged, SparseHists, tsdb_pending
from kernel_insight.kql.storage import (
    NO_HINTS,
    STALE_NAN_BITS,
    Capability,
    Labels,
    Matcher,
    ReadBudget,
    SelectHints,
    SeriesData,
    StorageBase,
    is_stale,
    labels_match,
)

if TYPE_CHECKING:
    from kernel_insight.collector.clickhouse.store import Store

__all__ = ["RANGE_GRID_AGGREGATES", "ClickHouseStorage", "GridAggregate", "matcher_sql"]

# DateTime64 holds 1900-01-01 .. 2299-12-31; Date holds 1970-01-01 .. 2149-06-06.
_MIN_MS = -2_208_988_800_000
_MAX_MS = 10_413_791_999_999
_MAX_DATE = dt.date(2149, 6, 6)
_EPOCH = dt.date(1970, 1, 1)
_MS_PER_DAY = 86_400_000
_LABELS_CACHE_MAX = 1_000_000
#: Selectors whose matching series are remembered (store.selection_cache), then forgotten at once.
_SELECTIONS_CACHE_MAX = 4096

#: Memory per cached sample: fingerprint-free ts and value, plus slack for offsets and copies.
_CACHED_BYTES_PER_SAMPLE = 24

#: Windows longer than this many hours bypass the sample cache (a month-long query would
#: otherwise flush what dashboards keep re-reading).
CACHE_MAX_HOURS = 48

_GRID_SETTING = "allow_experimental_ts_to_grid_aggregate_function = 1"
#: The server's error code in a refused statement's message.
_CODE = re.compile(r"Code:\s*(\d+)")


@dataclass(frozen=True, slots=True)
class GridAggregate:
    """How ClickHouse computes one of kql's range functions at every step of a grid.

    ``aggregate`` is its ``timeSeries*ToGrid`` aggregate function; ``beats_cache`` when ClickHouse
    computes a grid of more than one step faster than the engine does over samples already
    decoded in memory (bench/kql), so such a grid is pushed down even when the cache holds it.
    """

    aggregate: str
    beats_cache: bool = False


#: The push-down table, keyed by kql's function names: the range functions whose spec allows a
#: store to compute them on a grid (``FunctionSpec.pushdown``) that ClickHouse computes, and how.
#: ``tests/kql/test_pushdown.py`` runs each both ways and holds the keys to kql's flags.
RANGE_GRID_AGGREGATES: dict[str, GridAggregate] = {
    "rate": GridAggregate("timeSeriesRateToGrid"),
    "increase": GridAggregate("timeSeriesIncreaseToGrid"),
    "delta": GridAggregate("timeSeriesDeltaToGrid"),
    "irate": GridAggregate("timeSeriesInstantRateToGrid"),
    "idelta": GridAggregate("timeSeriesInstantDeltaToGrid"),
    "deriv": GridAggregate("timeSeriesDerivToGrid", beats_cache=True),
    "changes": GridAggregate("timeSeriesChangesToGrid"),
    "resets": GridAggregate("timeSeriesResetsToGrid"),
    "sum_over_time": GridAggregate("timeSeriesSumToGrid"),
    "avg_over_time": GridAggregate("timeSeriesAvgToGrid"),
    "count_over_time": GridAggregate("timeSeriesCountToGrid"),
    "min_over_time": GridAggregate("timeSeriesMinToGrid"),
    "max_over_time": GridAggregate("timeSeriesMaxToGrid"),
    "last_over_time": GridAggregate("timeSeriesLastToGrid"),
}

#: A series' labels and the string that sorts like them (None when one cannot be built).
_Known = tuple[Labels, str | None]
#: A selector's answer over cached hours: (fingerprints present, matching labels, their fingerprints).
_Selection = tuple[tuple[int, ...], npt.NDArray[np.uint64], list[Labels], npt.NDArray[np.uint64]]

#: An instant read of the metrics' latest samples holds at most this many series (matching or
#: not); past it the selector is read the general way (the series first), and remembered as such.
INSTANT_READ_MAX_ROWS = 1_000_000
#: Past this many series read, a selector whose other matchers keep under 1 in
#: INSTANT_SELECTIVE_SHARE of them is read the general way from then on: the series query
#: narrows the samples read more than the instant read's one pass saves.
INSTANT_SELECTIVE_MIN_ROWS = 50_000
INSTANT_SELECTIVE_SHARE = 16


@dataclass(slots=True)
class _InstantSelection:
    """What an instant selector over named metrics matched last time (``ClickHouseStorage._last_instant``).

    ``present``: the fingerprints read, ascending; ``labels`` and ``pick``: the matching ones in
    label order, as positions in ``present``; ``matched``: each fingerprint's verdict seen so far
    (labels never change for a fingerprint, so neither does the verdict). ``general``: the
    selector is read the general way (its metrics hold more series than an instant read may
    take, or its other matchers keep few of many).
    """

    present: npt.NDArray[np.uint64]
    labels: list[Labels]
    pick: npt.NDArray[np.int64]
    matched: dict[int, bool]
    general: bool = False


def _label_expr(name: str, p: Params, prefix: str = "") -> str:
    return f"{prefix}metric" if name == "__name__" else f"{prefix}labels[{p(name, 'String')}]"


def matcher_sql(m: Matcher, p: Params) -> str:
    """One matcher as a SQL condition on the series table; a missing label reads as ``''`` as in PromQL.

    The label name and value become parameters in ``p``. Regexes are anchored and ``.`` matches
    newlines, as in Prometheus; ``match()`` is RE2 like Prometheus.
    """
    x = _label_expr(m.name, p)
    if m.op == "=":
        return f"{x} = {p(m.value, 'String')}"
    if m.op == "!=":
        return f"{x} != {p(m.value, 'String')}"
    pattern = p(anchored(m.value), "String")
    if m.op == "=~":
        return f"match({x}, {pattern})"
    if m.op == "!~":
        return f"NOT match({x}, {pattern})"
    raise ValueError(f"unknown matcher operator {m.op!r}")


def _date(day: int) -> str:
    return (_EPOCH + dt.timedelta(days=day)).isoformat()


def _clamp(ms: int) -> int:
    return max(_MIN_MS, min(_MAX_MS, int(ms)))


def _day(ms: int) -> dt.date:
    day = dt.datetime.fromtimestamp(max(0, _clamp(ms)) / 1000, tz=dt.UTC).date()
    return min(day, _MAX_DATE)


class ClickHouseStorage(StorageBase):
    """:class:`kernel_insight.kql.storage.Storage` backed by a :class:`Store`.

    Example::

        storage = store.storage()
        storage.select([Matcher("__name__", "=", "up")], 0, 60_000)
    """

    capabilities = frozenset(
        {Capability.COLUMNS, Capability.LAST_ON_GRID, Capability.RANGE_ON_GRID, Capability.HEAD}
    )

    def __init__(self, store: Store, *, use_cache: bool = True) -> None:
        self._store = store
        self._series_table = qualified(store.database, "series")
        self._samples_table = qualified(store.database, "samples")
        self._histograms_table = qualified(store.database, "histograms")
        self._use_cache = use_cache
        self._labels_cache: dict[int, _Known] = store.labels_cache
        self._selection_cache: dict[tuple[str, tuple[Matcher, ...]], _Selection] = store.selection_cache
        # The cache plan a grid read just made before declining (the cache serves the window
        # better): the engine reads that same window through ``select_columns`` next, which takes
        # the plan over instead of making it again (a visible share of a cached range ``absent``).
        self._declined: tuple[tuple[Matcher, ...], int, int, tuple[str, range]] | None = None

    @property
    def sample_cache(self) -> SampleCache | None:
        """The store's decoded-hours cache that reads go through (None when it is off)."""
        return self._store.sample_cache if self._use_cache else None

    def _series_sql(
        self, p: Params, matchers: Sequence[Matcher], start_ms: int, end_ms: int, *, with_samples: bool
    ) -> str:
        """The series matching ``matchers`` with a row in the window's days; their values go into ``p``."""
        conds = [f"`date` BETWEEN '{_day(start_ms).isoformat()}' AND '{_day(end_ms).isoformat()}'"]
        conds += [matcher_sql(m, p) for m in matchers]
        if with_samples:
            conds.append(self._had_samples(start_ms, end_ms))
        where = " AND ".join(f"({c})" for c in conds)
        return (
            "SELECT fingerprint, any(metric) AS s_metric, any(labels) AS s_labels "
            f"FROM {self._series_table} WHERE {where} GROUP BY fingerprint"
        )

    def _had_samples(self, start_ms: int, end_ms: int) -> str:
        """Series with a sample in the window, reading samples only for the window's partial days.

        A series row exists for exactly the UTC days the series had samples on, so a day the
        window covers whole needs no sample scan: a week of label names costs two partial days.
        """
        lo, hi = max(start_ms, MIN_TS_MS), min(end_ms, MAX_TS_MS)
        if hi < lo:
            return "0"
        first, last = lo // _MS_PER_DAY, hi // _MS_PER_DAY
        full_lo = first if lo == first * _MS_PER_DAY else first + 1
        full_hi = last if hi == (last + 1) * _MS_PER_DAY - 1 else last - 1
        parts = []
        if full_lo <= full_hi:
            parts.append(f"`date` BETWEEN '{_date(full_lo)}' AND '{_date(full_hi)}'")
        for day in sorted({first, last}):
            if full_lo <= day <= full_hi:
                continue
            window = self._window(max(lo, day * _MS_PER_DAY), min(hi, (day + 1) * _MS_PER_DAY - 1))
            # Histogram series have their samples in the histograms table (docs/storage.md); a store
            # known to hold none reads as before.
            hists = (
                ""
                if self._store.histogram_metrics() == frozenset()
                else f" UNION ALL SELECT fingerprint FROM {self._histograms_table} WHERE {window}"
            )
            parts.append(
                f"(`date` = '{_date(day)}' AND fingerprint IN (SELECT fingerprint FROM {self._samples_table} "
                f"WHERE {window}{hists}))"
            )
        return " OR ".join(parts)

    @staticmethod
    def _window(start_ms: int, end_ms: int) -> str:
        return (
            f"ts >= fromUnixTimestamp64Milli(toInt64({_clamp(start_ms)}), 'UTC') "
            f"AND ts <= fromUnixTimestamp64Milli(toInt64({_clamp(end_ms)}), 'UTC')"
        )

    def select(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> list[SeriesData]:
        return self.select_columns(matchers, start_ms, end_ms, hints).series()

    def select_columns(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> SeriesColumns:
        """``select`` as one block of arrays: no Python work per sample, little per series."""
        if end_ms < start_ms:
            return columns_of([])
        # Start timestamps: for rate, increase, irate and resets of a selector only, and only of
        # metrics known to have some, or of every metric when the store cannot know them (a
        # server store: the st column comes along with the read; the cache holds none).
        starts = self._store.start_timestamp_metrics() if hints.start_timestamps else frozenset()
        budget = hints.budget
        head = self._store.head
        if head is not None and starts is not None and head.ready and end_ms >= head.coverage_start_ms:
            answered = self._from_head(head, matchers, start_ms, end_ms, starts, budget)
            if answered is not None:
                return answered
        return self._select_columns_sql(matchers, start_ms, end_ms, starts, budget)

    def _from_head(
        self,
        head: Head,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        starts: frozenset[str],
        budget: ReadBudget | None,
    ) -> SeriesColumns | None:
        """The window from the head (collector/head.py), the part before its coverage from
        ClickHouse; None when the head cannot answer (histograms or start timestamps wanted)."""
        histograms = self._store.histogram_metrics()
        if histograms is None:
            return None
        coverage = head.coverage_start_ms
        recent = head.select_columns(
            matchers, max(start_ms, coverage), end_ms, budget, exclude_metrics=histograms | starts
        )
        if recent is None or start_ms >= coverage:
            return recent
        older = self._select_columns_sql(matchers, start_ms, coverage - 1, starts, budget)
        return concat_columns(older, recent)

    def _select_columns_sql(
        self,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        starts: frozenset[str] | None,
        budget: ReadBudget | None,
    ) -> SeriesColumns:
        plan = self._declined_plan(matchers, start_ms, end_ms)
        if plan is not None and (starts is None or plan[0] in starts):
            plan = None
        if plan is not None and plan[1].stop > end_ms:
            cols = self._select_cached_metric(matchers, start_ms, end_ms, budget, *plan)
            if cols is not None:
                return cols
        p = Params()
        sub = self._series_sql(p, matchers, start_ms, end_ms, with_samples=False)
        series = self._read(budget, sub, p)
        if series.num_rows == 0:
            return columns_of([])
        labels_by_fp = self._labels(series)
        if plan is not None:  # never a metric with histograms (_cache_plan)
            return self._columns_from_cache(series, sub, p, labels_by_fp, start_ms, end_ms, budget, *plan)
        where = f"{_fingerprints_in(series, sub, p)} AND {self._window(start_ms, end_ms)}"
        with_st = starts is None or bool(starts and _metrics(series) & starts)
        samples = self._samples(budget, where, p, with_st)
        cols = _columns(samples, labels_by_fp)
        with_hists = self._histogram_metrics_of(budget, series, start_ms, end_ms)
        if starts is None:
            self._note_starts(_started(samples), series)
        if not with_hists:
            return cols  # floats only: the path every float query keeps, no histogram read
        hp = Params()
        where = (
            f"{_fingerprints_in(series, sub, hp)} AND metric IN {hp(sorted(with_hists), 'Array(String)')} "
            f"AND {self._window(start_ms, end_ms)}"
        )
        hists = self._histograms(budget, where, hp, with_st)
        if starts is None:
            self._note_starts(_started(hists), series)
        return _merge_histograms(cols, hists, labels_by_fp)

    def _note_starts(self, fingerprints: pa.Array, series: pa.Table) -> None:
        """Tell the store the metrics of the series read (``series``) whose ``fingerprints`` have
        start timestamps, so that their next rate skips the grid pushdown at once
        (``Store.saw_start_timestamps``; for a server store, which cannot know them otherwise)."""
        if len(fingerprints) == 0:
            return
        mask = pc.is_in(series.column("fingerprint"), value_set=pc.unique(fingerprints))
        self._store.saw_start_timestamps(
            str(m) for m in pc.unique(pc.filter(series.column("s_metric"), mask)).to_pylist()
        )

    def _histogram_metrics_of(
        self, budget: ReadBudget | None, series: pa.Table, start_ms: int, end_ms: int
    ) -> frozenset[str]:
        """Which metrics of the series just found have native histogram samples (maybe in the window)."""
        return self._histogram_metrics_among(budget, _metrics(series), start_ms, end_ms)

    def _histogram_metrics_among(
        self, budget: ReadBudget | None, metrics: frozenset[str], start_ms: int, end_ms: int
    ) -> frozenset[str]:
        """Which of ``metrics`` have native histogram samples (maybe in the window).

        The embedded store knows its histogram metrics (``Store.histogram_metrics``): no query.
        Otherwise one small read of the histograms table, whose key leads with the metric.
        """
        known = self._store.histogram_metrics()
        if known is not None:
            return metrics & known
        p = Params()
        found = self._read(
            budget,
            f"SELECT DISTINCT metric FROM {self._histograms_table} WHERE metric IN "
            f"{p(sorted(metrics), 'Array(String)')} AND {self._window(start_ms, end_ms)}",
            p,
        )
        return frozenset(str(m) for m in found.column("metric").to_pylist())

    def _histograms(
        self, budget: ReadBudget | None, where: str, p: Params, with_st: bool = False
    ) -> pa.Table:
        """Native histogram samples matching ``where``, ordered by (fingerprint, t); one bucket list
        per side; ``with_st``: their start timestamps too."""
        st = ", st" if with_st else ""
        return self._read(
            budget,
            f"SELECT fingerprint, toUnixTimestamp64Milli(ts) AS t, {_HISTOGRAM_COLUMNS}{st} "
            f"FROM {self._histograms_table} WHERE {where} ORDER BY fingerprint, t",
            p,
            rows_per_sample=HISTOGRAM_MIN_WEIGHT,  # a histogram counts as at least 11 samples
        )

    def _samples(self, budget: ReadBudget | None, where: str, p: Params, with_st: bool = False) -> pa.Table:
        """Raw samples ``(fingerprint, t, value)`` matching ``where``, ordered by (fingerprint, t);
        ``with_st``: their start timestamps too (column ``st``)."""
        st = ", st" if with_st else ""
        return self._read(
            budget,
            f"SELECT fingerprint, toUnixTimestamp64Milli(ts) AS t, value{st} FROM {self._samples_table} "
            f"WHERE {where} ORDER BY fingerprint, t",
            p,
            rows_per_sample=1,
        )

    def _read(
        self,
        budget: ReadBudget | None,
        sql: str,
        p: Params | None = None,
        rows_per_sample: int = 0,
        settings: str = "",
    ) -> pa.Table:
        """A read bounded by the running kql query's budget (``SelectHints.budget``), if there is one.

        ClickHouse stops it at the query's deadline (``max_execution_time``) and, for reads whose
        rows hold samples (``rows_per_sample`` samples or grid cells a row), once it has more rows
        than the query may still hold (``max_result_rows``): a 200k-series read ends in ClickHouse
        with the query's own timeout or sample-limit error instead of filling memory. Both stop
        with ``break`` (a partial result this method refuses), not ``throw``: a statement that
        fails mid-stream in chDB hands its rows to the session's next query (collector/clickhouse/store.py).
        """
        extra = [settings] if settings else []
        rows = 0
        if budget is not None:
            remaining = budget.deadline - time.monotonic()
            if remaining <= 0:
                raise QueryTimeoutError.after(budget.timeout_s)
            extra.append(f"max_execution_time = {remaining:.3f}, timeout_overflow_mode = 'break'")
            if rows_per_sample:
                rows = budget.max_samples // rows_per_sample
                extra.append(f"max_result_rows = {rows + 1}, result_overflow_mode = 'break'")
        if extra:
            sql = f"{sql} SETTINGS {', '.join(extra)}"
        try:
            table: pa.Table = self._store.query(sql, p)
        except StoreError as exc:
            code = _CODE.search(str(exc))
            if budget is not None and code is not None and code.group(1) == "159":  # TIMEOUT_EXCEEDED
                raise QueryTimeoutError.after(budget.timeout_s) from exc
            if budget is not None and code is not None and code.group(1) == "396":  # TOO_MANY_ROWS_OR_BYTES
                raise TooManySamplesError() from exc
            raise
        if budget is not None:
            if time.monotonic() >= budget.deadline:
                raise QueryTimeoutError.after(budget.timeout_s)  # the result may have been cut short
            if rows_per_sample and table.num_rows > rows:
                raise TooManySamplesError()
        return table

    # ---- the sample cache (collector/sample_cache.py) ------------------------------------

    def _cached_hours(self, start_ms: int, end_ms: int) -> range | None:
        """The hours of the window the cache may serve, when they are at least half of it; else None.

        They are a prefix of the window's hours: only settled hours are cached, and the rest
        (the hours still being written) are read from ClickHouse. Windows reaching back past the
        retention horizon, or longer than CACHE_MAX_HOURS, are not served from the cache.
        """
        cache = self.sample_cache
        if cache is None or end_ms < start_ms or start_ms < 0 or end_ms > MAX_TS_MS:
            return None
        first, last = start_ms // BLOCK_MS, end_ms // BLOCK_MS
        if last - first + 1 > CACHE_MAX_HOURS:
            return None
        settled = cache.cacheable_before()
        days = self._store.retention.samples_days
        if days and start_ms < settled - (days - 1) * _MS_PER_DAY:
            return None
        # Hour h is settled when h * BLOCK_MS < settled.
        stop = max(first, min(last + 1, -(-settled // BLOCK_MS)))
        cached_ms = min(stop * BLOCK_MS, end_ms + 1) - start_ms
        if stop == first or 2 * cached_ms < end_ms - start_ms + 1:
            return None
        return range(first * BLOCK_MS, stop * BLOCK_MS, BLOCK_MS)

    def _declined_plan(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int
    ) -> tuple[str, range] | None:
        """:meth:`_cache_plan`, taken over from the grid read that declined this very window just
        before (:meth:`_decline_grid`), else made here. Handed over once: a later read of the
        window plans afresh. Another thread may take it first (the storage is shared): a plan
        is only used for the same matchers and window, and is as good for either."""
        declined, self._declined = self._declined, None
        if (
            declined is not None
            and declined[1] == start_ms
            and declined[2] == end_ms
            and declined[0] == tuple(matchers)
        ):
            return declined[3]
        return self._cache_plan(matchers, start_ms, end_ms)

    def _decline_grid(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> bool:
        """Whether a grid read of the window should leave it to the cache (``_cache_plan`` found
        every settled hour cached; the plan is kept for the ``select_columns`` that follows) or
        to the head (it covers the window: samples in memory beat any grid ClickHouse computes)."""
        head = self._store.head
        if head is not None and head.covers(start_ms):
            return True
        plan = self._cache_plan(matchers, start_ms, end_ms)
        if plan is None:
            return False
        self._declined = (tuple(matchers), start_ms, end_ms, plan)
        return True

    def _cache_plan(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int
    ) -> tuple[str, range] | None:
        """(metric, settled hours) when the cache holds every settled hour of the window for the
        metric the selector names; else None, after queueing a background fill of what is missing.

        Only selectors that name their metric (``__name__="..."``) go through the cache: a cache
        entry is one metric's hour.
        """
        hours = self._cached_hours(start_ms, end_ms)
        cache = self.sample_cache
        if hours is None or cache is None:
            return None
        names = {m.value for m in matchers if m.name == "__name__" and m.op == "="}
        if len(names) != 1:
            return None
        metric = names.pop()
        known = self._store.histogram_metrics()
        if known is None or metric in known:
            return None  # the cache holds floats only; a store that cannot tell reads every time
        missing = [hour for hour in hours if not cache.has(metric, hour)]
        if not missing:
            return metric, hours
        wanted = [hour for hour in missing if not cache.oversized(metric, hour)]
        if wanted:
            cache.fill_later((metric, tuple(wanted)), lambda: self._fill(cache, metric, wanted))
        return None

    def _columns_from_cache(
        self,
        series: pa.Table,
        sub: str,
        p: Params,
        labels_by_fp: dict[int, _Known],
        start_ms: int,
        end_ms: int,
        budget: ReadBudget | None,
        metric: str,
        hours: range,
    ) -> SeriesColumns:
        """``select_columns`` from the cached hours plus the unsettled rest from ClickHouse."""
        fps = series.column("fingerprint").to_numpy().tolist()
        labels, rows = _sorted_rows(fps, labels_by_fp)
        want = np.asarray(fps, dtype=np.uint64)[rows]
        blocks = self._hour_blocks(budget, metric, hours)
        tail_start = hours.stop
        if tail_start <= end_ms:
            tail = self._samples(
                budget, f"{_fingerprints_in(series, sub, p)} AND {self._window(tail_start, end_ms)}", p
            )
            blocks.append(_sorted_block(tail))
        return gather_series(labels, want, blocks, start_ms, end_ms)

    def _select_cached_metric(
        self,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        budget: ReadBudget | None,
        metric: str,
        hours: range,
    ) -> SeriesColumns | None:
        """``select_columns`` without asking ClickHouse which series match: every hour is cached.

        The cached hours of a metric hold every series of it with samples then, so the other
        matchers run on their labels here. None when
        some series' labels are unknown (samples without a series row): the SQL path decides.
        """
        selection = self._cached_selection(matchers, start_ms, end_ms, budget, metric, hours)
        if selection is None:
            return None
        blocks, labels, want = selection
        return gather_series(labels, want, blocks, start_ms, end_ms)

    def _cached_selection(
        self,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        budget: ReadBudget | None,
        metric: str,
        hours: range,
    ) -> tuple[list[SampleBlock], list[Labels], npt.NDArray[np.uint64]] | None:
        """The cached blocks of the hours, and the series of them the selector matches (labels in
        order, their fingerprints); None when some series' labels are unknown."""
        blocks = self._hour_blocks(budget, metric, hours)
        others = tuple(m for m in matchers if not (m.name == "__name__" and m.op == "="))
        # Which series match depends only on which are present (labels never change): the last
        # answer for the same selector holds while the same series are (label matching in Python
        # grows with the series, per query). The very same blocks hold the same series: known
        # without merging their fingerprints (np.unique over a long window's blocks dominated a
        # range query over a selector that matches nothing; ``make bench-kql``).
        key = (metric, others)
        serials = tuple(b.serial for b in blocks)
        hit = self._selection_cache.get(key)
        if hit is not None and hit[0] == serials:
            return blocks, hit[2], hit[3]
        present = blocks[0].fps if len(blocks) == 1 else np.unique(np.concatenate([b.fps for b in blocks]))
        if hit is not None and np.array_equal(hit[1], present):
            self._selection_cache[key] = (serials, hit[1], hit[2], hit[3])
            return blocks, hit[2], hit[3]
        known = self._known_labels(budget, metric, present.tolist(), start_ms, end_ms)
        if known is None:
            return None
        matched = (
            {fp: entry for fp, entry in known.items() if labels_match(entry[0], others)} if others else known
        )
        labels, rows = _sorted_rows(list(matched), matched)
        want = np.fromiter(matched, dtype=np.uint64, count=len(matched))[rows]
        if len(self._selection_cache) >= _SELECTIONS_CACHE_MAX:
            self._selection_cache.clear()
        self._selection_cache[key] = (serials, present, labels, want)
        return blocks, labels, want

    def head_covers(self, start_ms: int) -> bool:
        """Whether reads from ``start_ms`` on are the head's to answer (the floats of metrics
        without native histograms; rules/prefetch.py shares such reads across a rule group)."""
        head = self._store.head
        return head is not None and self._store.histogram_metrics() is not None and head.covers(start_ms)

    def _head_last(
        self, matchers: Sequence[Matcher], first_ms: int, time_ms: int, hints: SelectHints, sample_times: bool
    ) -> GridColumns | None:
        """:meth:`select_last_on_grid` at one time from the head (``Head.select_last``): each
        series' newest sample in the lookback window, not the window's samples; None where
        :meth:`_from_head` would not answer (the head does not cover the window, a histogram
        or start-timestamp metric may be selected)."""
        head = self._store.head
        histograms = self._store.histogram_metrics()
        if head is None or histograms is None or hints.start_timestamps or not head.covers(first_ms):
            return None
        return head.select_last(
            matchers,
            time_ms,
            first_ms,
            hints.budget,
            exclude_metrics=histograms,
            sample_times=sample_times,
        )

    def _cached_last(
        self,
        matchers: Sequence[Matcher],
        time_ms: int,
        lookback_ms: int,
        hints: SelectHints,
        sample_times: bool,
    ) -> GridColumns | None:
        """:meth:`select_last_on_grid` at one time from the cached hours (the plan :meth:`_decline_grid`
        just made): each matching series' last sample in ``(t - lookback, t]`` found in the blocks
        by the window search of ``gather_series``, without gathering the window's samples into
        columns for the engine to search again (an instant selector's lookup). Series without
        a sample in the window are left out, as ``select_columns`` leaves them out. None when
        some series' labels are unknown: ``select_columns`` decides.
        """
        first = time_ms - lookback_ms + 1
        plan = self._declined_plan(matchers, first, time_ms)
        if plan is None or plan[1].stop <= time_ms or hints.start_timestamps:
            # Not every hour of the window settled (the rest is ClickHouse's), or start timestamps
            # wanted (the cache holds none): as select_columns, the SQL path answers.
            return None
        selection = self._cached_selection(matchers, first, time_ms, hints.budget, *plan)
        if selection is None:
            return None
        blocks, labels, want = selection
        if len(want) == 0:
            return _empty_grid(1)
        want = np.ascontiguousarray(want, dtype=np.uint64)
        n = len(want)
        starts, lengths = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        if len(blocks) == 1:  # a lookback inside one hour (most instants): no per-block bookkeeping
            block = blocks[0]
            if len(block.fps):
                _windows.series_ranges(
                    block.fps, block.offsets, block.ts, want, first, time_ms, starts, lengths
                )
            else:
                lengths[:] = 0
            rows = np.flatnonzero(lengths > 0)
            at = starts[rows] + lengths[rows] - 1
            return _last_grid(labels, rows, block.vs[at], block.ts[at], sample_times)
        at = np.zeros(n, dtype=np.int64)  # the last sample's position in its block
        block_of = np.full(n, -1, dtype=np.int64)  # which block holds it
        for j in range(len(blocks) - 1, -1, -1):  # the latest hour first
            block = blocks[j]
            if len(block.fps) == 0:
                continue
            _windows.series_ranges(block.fps, block.offsets, block.ts, want, first, time_ms, starts, lengths)
            found = (block_of < 0) & (lengths > 0)
            at[found] = starts[found] + lengths[found] - 1
            block_of[found] = j
        rows = np.flatnonzero(block_of >= 0)
        values = np.empty(len(rows))
        ts = np.empty(len(rows), dtype=np.int64)
        for j, block in enumerate(blocks):
            mine = block_of[rows] == j
            if mine.any():
                values[mine] = block.vs[at[rows[mine]]]
                ts[mine] = block.ts[at[rows[mine]]]
        return _last_grid(labels, rows, values, ts, sample_times)

    def _known_labels(
        self, budget: ReadBudget | None, metric: str, fps: list[int], start_ms: int, end_ms: int
    ) -> dict[int, _Known] | None:
        """Labels of these series of ``metric``, from the labels cache or else from the series table."""
        cache = self._labels_cache
        if any(fp not in cache for fp in fps):
            p = Params()
            sub = self._series_sql(
                p, [Matcher("__name__", "=", metric)], start_ms, end_ms, with_samples=False
            )
            self._labels(self._read(budget, sub, p))
        out = {fp: known for fp in fps if (known := cache.get(fp)) is not None}
        return out if len(out) == len(fps) else None

    def _hour_blocks(self, budget: ReadBudget | None, metric: str, hours: range) -> list[SampleBlock]:
        """The metric's block for every hour; one evicted since the plan is read again, here."""
        cache = self.sample_cache
        assert cache is not None
        found = {hour: block for hour in hours if (block := cache.get(metric, hour)) is not None}
        missing = [hour for hour in hours if hour not in found]
        if missing:
            found.update(self._fill(cache, metric, missing, budget, check_size=False))
        return [found[hour] for hour in hours]

    def _fill(
        self,
        cache: SampleCache,
        metric: str,
        hours: list[int],
        budget: ReadBudget | None = None,
        *,
        check_size: bool = True,
    ) -> dict[int, SampleBlock]:
        """Read these hours of the metric (all its series) and offer them to the cache.

        One read for all of them: the samples key is (metric, fingerprint, ts), so a read per
        hour would scan the metric's granules once per hour. With ``check_size`` a count comes
        first, and hours that would take over a quarter of the budget are not read.
        """
        generation = cache.generation()
        lo, hi = hours[0], hours[-1] + BLOCK_MS - 1
        p = Params()
        where = f"metric = {p(metric, 'String')} AND {self._window(lo, hi)}"
        if check_size:
            counted = self._store.query(f"SELECT count() AS n FROM {self._samples_table} WHERE {where}", p)
            rows = int(counted.column("n")[0].as_py())
            if rows * _CACHED_BYTES_PER_SAMPLE > cache.max_bytes // 4:
                for hour in hours:
                    cache.mark_oversized(metric, hour)
                return {}
        fps, ts, vs, _ = _deduplicated(self._samples(budget, where, p))
        # Stable by hour keeps (fingerprint, t) order inside each hour; as int16 (a window
        # spans at most CACHE_MAX_HOURS) numpy sorts by radix, in linear time.
        hour_of = (ts // BLOCK_MS - lo // BLOCK_MS).astype(np.int16)
        order = np.argsort(hour_of, kind="stable")
        fps, ts, vs, hour_of = fps[order], ts[order], vs[order], hour_of[order]
        rel = np.array([(hour - lo) // BLOCK_MS for hour in hours], dtype=np.int16)
        firsts = np.searchsorted(hour_of, rel, side="left")
        lasts = np.searchsorted(hour_of, rel, side="right")
        out = {}
        for hour, a, b in zip(hours, firsts.tolist(), lasts.tolist(), strict=True):
            # Copies, so an hour evicted later frees its memory (a view would pin the whole read).
            block = SampleBlock.from_sorted(fps[a:b].copy(), ts[a:b].copy(), vs[a:b].copy())
            cache.put(metric, hour, block, generation)
            out[hour] = block
        return out

    def select_last_on_grid(
        self,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        hints: SelectHints,
        lookback_ms: int,
        sample_times: bool = True,
    ) -> GridColumns | None:
        """An instant-vector selector at every grid step, computed by ClickHouse's ``timeSeriesLastToGrid``.

        The window ``(t - lookback, t]`` is left-open like the engine's (and Prometheus 3.x);
        stale markers stay in the input, so a series whose latest sample is one is absent at
        that step, and a second aggregate over ``ts`` itself gives each value's sample time
        (only when asked for: it makes the query markedly slower, ``make bench-kql``).
        """
        step_ms, budget = hints.step_ms, hints.budget
        first = start_ms - lookback_ms + 1
        if step_ms <= 0 or lookback_ms <= 0 or end_ms < start_ms or first < 0 or end_ms > MAX_TS_MS:
            return None
        if self._decline_grid(matchers, first, end_ms):
            # Decoded samples in memory beat any grid ClickHouse computes: one time is answered
            # from them here, a grid by the engine over select_columns.
            if start_ms != end_ms:
                return None
            return self._head_last(matchers, first, end_ms, hints, sample_times) or self._cached_last(
                matchers, end_ms, lookback_ms, hints, sample_times
            )
        steps = (end_ms - start_ms) // step_ms + 1
        if steps == 1:
            instant = self._last_instant(matchers, end_ms, lookback_ms, budget, sample_times)
            if instant is not None:
                return instant
        p = Params()
        sub = self._series_sql(p, matchers, first, end_ms, with_samples=False)
        series = self._read(budget, sub, p)
        if series.num_rows == 0:
            return _empty_grid(steps)
        if self._histogram_metrics_of(budget, series, first, end_ms):
            return None  # the grid aggregates read floats only: the engine computes histograms
        labels_by_fp = self._labels(series)
        grid = _grid_params(start_ms, steps, step_ms, lookback_ms)
        times = f", timeSeriesLastToGrid({grid})(ts, toFloat64(toUnixTimestamp64Milli(ts))) AS t"
        result = self._read(
            budget,
            f"SELECT fingerprint, timeSeriesLastToGrid({grid})(ts, value) AS v{times if sample_times else ''} "
            f"FROM {self._samples_table} WHERE {_fingerprints_in(series, sub, p)} "
            f"AND {self._window(first, end_ms)} GROUP BY fingerprint",
            p,
            rows_per_sample=steps,
            settings=_GRID_SETTING,
        )
        if result.num_rows == 0:
            return _empty_grid(steps)
        labels, rows = _grid_order(result, labels_by_fp)
        v = _grid_column(result, "v", steps, rows)
        t = _grid_column(result, "t", steps, rows) if sample_times else None
        if v is None or (sample_times and t is None):
            return None  # not the grid we asked for: let the engine compute it
        has, values = v
        sample_ts = None if t is None else np.where(t[0], t[1], 0).astype(np.int64)
        return GridColumns(labels, values, sample_ts, has & ~is_stale(values))

    def _last_instant(
        self,
        matchers: Sequence[Matcher],
        time_ms: int,
        lookback_ms: int,
        budget: ReadBudget | None,
        sample_times: bool,
    ) -> GridColumns | None:
        """:meth:`select_last_on_grid` at one time for a selector that names its metrics, without
        asking the series table which series match; None when it cannot answer so.

        One read of the samples: each series' latest sample in ``(t - lookback, t]`` (``argMax``)
        among the named metrics, whose granules the samples key (metric first) picks out. Which
        of those series match the other matchers is decided here on their labels, by kql's own
        :func:`labels_match` (labels from the labels cache; the unknown ones are read once), and
        the answer is kept while the same series are present. Stale markers are left to the
        caller's ``present`` as on the grid. The health snapshot asks this every few seconds
        for every GPU's gauges: through the series query and ``timeSeriesLastToGrid`` that cost
        many times the CPU of this one read (``make bench-api``, bench/results/api.md).
        """
        named = _named_metrics(matchers)
        if named is None:
            return None
        metrics, others = named
        key = (tuple(sorted(metrics)), others)
        cache: dict[tuple[tuple[str, ...], tuple[Matcher, ...]], _InstantSelection] = self._selection_cache  # type: ignore[assignment]
        hit = cache.get(key)
        if hit is not None and hit.general:
            return None
        first = time_ms - lookback_ms + 1
        if self._histogram_metrics_among(budget, metrics, first, time_ms):
            return None  # the engine computes histograms from raw samples (the general path)
        p = Params()
        times = ", toUnixTimestamp64Milli(max(ts)) AS t" if sample_times else ""
        result = self._read(
            budget,
            f"SELECT fingerprint, argMax(value, ts) AS v{times} FROM {self._samples_table} "
            f"WHERE metric IN {p(list(key[0]), 'Array(String)')} AND {self._window(first, time_ms)} "
            "GROUP BY fingerprint",
            p,
            settings=f"max_result_rows = {INSTANT_READ_MAX_ROWS + 1}, result_overflow_mode = 'break'",
        )
        if result.num_rows > INSTANT_READ_MAX_ROWS:
            if len(cache) >= _SELECTIONS_CACHE_MAX:
                cache.clear()
            cache[key] = _InstantSelection(np.empty(0, np.uint64), [], np.empty(0, np.int64), {}, True)
            return None
        fps = result.column("fingerprint").to_numpy().astype(np.uint64, copy=False)
        order = np.argsort(fps)
        present = fps[order]
        # Judge again when the series changed, or when some were left unjudged (their samples
        # were stored before their series-table row): else they stay unselected until the
        # present series change, which in a steady fleet may be never.
        if hit is None or len(hit.matched) < len(present) or not np.array_equal(hit.present, present):
            hit = self._instant_selection(budget, metrics, others, present, first, time_ms, hit)
            hit.general = len(present) > INSTANT_SELECTIVE_MIN_ROWS and len(
                hit.pick
            ) * INSTANT_SELECTIVE_SHARE < len(present)
            if len(cache) >= _SELECTIONS_CACHE_MAX:
                cache.clear()
            cache[key] = hit
        rows = order[hit.pick]
        values = result.column("v").to_numpy().astype(np.float64, copy=False)[rows].reshape(-1, 1)
        sample_ts = (
            result.column("t").to_numpy().astype(np.int64, copy=False)[rows].reshape(-1, 1)
            if sample_times
            else None
        )
        return GridColumns(hit.labels, values, sample_ts, ~is_stale(values))

    def _instant_selection(
        self,
        budget: ReadBudget | None,
        metrics: frozenset[str],
        others: tuple[Matcher, ...],
        present: npt.NDArray[np.uint64],
        start_ms: int,
        end_ms: int,
        last: _InstantSelection | None,
    ) -> _InstantSelection:
        """Which of the ``present`` series match ``others``, in label order: the verdicts known
        from ``last``, labels (and verdicts) worked out for the new series only."""
        fps = present.tolist()
        previous = last.matched if last is not None else {}
        matched = {fp: seen for fp in fps if (seen := previous.get(fp)) is not None}
        new = [fp for fp in fps if fp not in matched]
        if new:  # a series without a row in the series table stays unjudged: not selected, asked again
            for fp, known in self._labels_of(budget, metrics, new, start_ms, end_ms).items():
                matched[fp] = labels_match(known[0], others)
        labels_by_fp = self._labels_of(
            budget, metrics, [fp for fp in fps if matched.get(fp)], start_ms, end_ms
        )
        labels, rows = _sorted_rows(list(labels_by_fp), labels_by_fp)
        chosen = np.fromiter(labels_by_fp, dtype=np.uint64, count=len(labels_by_fp))[rows]
        pick = np.searchsorted(present, chosen).astype(np.int64)
        return _InstantSelection(present, labels, pick, matched)

    def _labels_of(
        self, budget: ReadBudget | None, metrics: frozenset[str], fps: list[int], start_ms: int, end_ms: int
    ) -> dict[int, _Known]:
        """Labels of these series (of ``metrics``, with a row in the window's days): cache, else the series table."""
        cache = self._labels_cache
        out = {fp: known for fp in fps if (known := cache.get(fp)) is not None}
        missing = [fp for fp in fps if fp not in out]
        if missing:
            p = Params()
            # Few: by fingerprint; many (a first read): every series of the metrics those days.
            only = (
                f" AND fingerprint IN {p(missing, 'Array(UInt64)')}"
                if len(missing) <= FINGERPRINT_LIST_MAX
                else ""
            )
            series = self._read(
                budget,
                "SELECT fingerprint, any(metric) AS s_metric, any(labels) AS s_labels "
                f"FROM {self._series_table} WHERE `date` BETWEEN '{_day(start_ms).isoformat()}' AND "
                f"'{_day(end_ms).isoformat()}' AND metric IN {p(sorted(metrics), 'Array(String)')}{only} "
                "GROUP BY fingerprint",
                p,
            )
            wanted = set(missing)
            out.update((fp, known) for fp, known in self._labels(series).items() if fp in wanted)
        return out

    def select_range_on_grid(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints
    ) -> tuple[GridColumns, int] | None:
        """A range function at every grid step, computed by ClickHouse's ``timeSeries*ToGrid`` aggregates.

        Stale markers are filtered out in SQL, as the engine drops them before range functions.
        The samples never reach the engine, so the count returned is of computed values (a
        ``timeSeriesCountToGrid`` for the exact window count made the query markedly slower).
        """
        func, step_ms, range_ms, budget = hints.func, hints.step_ms, hints.range_ms, hints.budget
        spec = FUNCTIONS.get(func)
        pushdown = RANGE_GRID_AGGREGATES.get(func) if spec is not None and spec.pushdown is not None else None
        first = start_ms - range_ms + 1
        if (
            pushdown is None
            or step_ms <= 0
            or range_ms <= 0
            or end_ms < start_ms
            or first < 0
            or end_ms > MAX_TS_MS
            or (
                # One window (an instant query) is read faster from the cache even for these.
                (not pushdown.beats_cache or start_ms == end_ms)
                and self._decline_grid(matchers, first, end_ms)
            )
        ):
            return None
        p = Params()
        sub = self._series_sql(p, matchers, first, end_ms, with_samples=False)
        series = self._read(budget, sub, p)
        steps = (end_ms - start_ms) // step_ms + 1
        if series.num_rows == 0:
            return _empty_grid(steps), 0
        if self._histogram_metrics_of(budget, series, first, end_ms):
            return None  # the grid aggregates read floats only: the engine computes histograms
        # Nor start timestamps: the engine reads them (docs/kql.md). A store that cannot know
        # which metrics have them (a server store) has the grid ask: a series with any in the
        # window sends the query to the engine's read, and its metric skips the grid next time.
        ask_st = False
        if spec is not None and spec.start_timestamps:
            starts = self._store.start_timestamp_metrics()
            if starts is None:
                starts, ask_st = self._store.start_timestamp_metrics_seen(), True
            if starts and _metrics(series) & starts:
                return None
        labels_by_fp = self._labels(series)
        grid = _grid_params(start_ms, steps, step_ms, range_ms)
        result = self._read(
            budget,
            f"SELECT fingerprint, {pushdown.aggregate}({grid})(ts, value) AS v"
            f"{', max(st != 0) AS st_set' if ask_st else ''} "
            f"FROM {self._samples_table} WHERE {_fingerprints_in(series, sub, p)} "
            f"AND {self._window(first, end_ms)} AND reinterpretAsUInt64(value) != {STALE_NAN_BITS} "
            "GROUP BY fingerprint",
            p,
            rows_per_sample=steps,
            settings=_GRID_SETTING,
        )
        if result.num_rows == 0:
            return _empty_grid(steps), 0
        if ask_st:
            started = pc.filter(result.column("fingerprint"), pc.not_equal(result.column("st_set"), 0))
            if len(started):
                self._note_starts(started, series)
                return None
        labels, rows = _grid_order(result, labels_by_fp)
        v = _grid_column(result, "v", steps, rows)
        if v is None:
            return None
        present, values = v
        return GridColumns(labels, values, None, present), int(present.sum())

    def _labels(self, series: pa.Table) -> dict[int, _Known]:
        """Labels (and sort key) per fingerprint; a fingerprint names one label set forever, so both are kept."""
        fps = series.column("fingerprint").to_numpy().tolist()
        cache = self._labels_cache
        out: dict[int, _Known] = {}
        missing = []
        for i, fp in enumerate(fps):
            known = cache.get(fp)
            if known is None:
                missing.append(i)
            else:
                out[fp] = known
        if missing:
            if len(cache) + len(missing) > _LABELS_CACHE_MAX:
                cache.clear()
            metrics = series.column("s_metric").to_pylist()
            maps = series.column("s_labels").to_pylist()
            for i in missing:
                labels = tuple(sorted([("__name__", metrics[i]), *((k, v) for k, v in maps[i])]))
                out[fps[i]] = cache[fps[i]] = (labels, _sort_key(labels))
        return out

    def label_names(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> list[str]:
        if end_ms < start_ms:
            return []
        head = self._store.head
        histograms = self._store.histogram_metrics()
        if head is not None and histograms is not None and head.covers(start_ms):
            names = head.label_names(matchers, start_ms, end_ms, histograms)  # from its postings
            if names is not None:
                return names
        p = Params()
        sub = self._series_sql(p, matchers, start_ms, end_ms, with_samples=True)
        result = self._read(
            hints.budget,
            f"SELECT DISTINCT arrayJoin(arrayConcat(['__name__'], mapKeys(s_labels))) AS name FROM ({sub}) ORDER BY name",
            p,
        )
        return [str(v) for v in result.column("name").to_pylist()]

    def label_values(
        self,
        name: str,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        hints: SelectHints = NO_HINTS,
    ) -> list[str]:
        if end_ms < start_ms:
            return []
        head = self._store.head
        histograms = self._store.histogram_metrics()
        if head is not None and histograms is not None and head.covers(start_ms):
            values = head.label_values(name, matchers, start_ms, end_ms, histograms)  # from its postings
            if values is not None:
                return values
        p = Params()
        sub = self._series_sql(p, matchers, start_ms, end_ms, with_samples=True)
        result = self._read(
            hints.budget,
            f"SELECT DISTINCT {_label_expr(name, p, 's_')} AS v FROM ({sub}) WHERE v != '' ORDER BY v",
            p,
        )
        return [str(v) for v in result.column("v").to_pylist()]


#: Up to this many series the samples query names the fingerprints found (one Array(UInt64)
#: parameter, ~21 bytes each) instead of running the series query again.
FINGERPRINT_LIST_MAX = 4_000


def _fingerprints_in(series: pa.Table, sub: str, p: Params) -> str:
    """The samples filter for the series just found: their metrics and fingerprints, or the series query itself.

    The samples key leads with ``metric``, so naming the metrics lets the primary key skip every
    other metric's granules before the fingerprints are looked at.
    """
    if series.num_rows > FINGERPRINT_LIST_MAX:
        return f"(metric, fingerprint) IN (SELECT s_metric, fingerprint FROM ({sub}))"
    metrics = [str(m) for m in pc.unique(series.column("s_metric")).to_pylist()]
    fps = series.column("fingerprint").to_numpy().tolist()
    return f"metric IN {p(metrics, 'Array(String)')} AND fingerprint IN {p(fps, 'Array(UInt64)')}"


def _named_metrics(matchers: Sequence[Matcher]) -> tuple[frozenset[str], tuple[Matcher, ...]] | None:
    """The metrics a selector names (``__name__="m"`` or ``__name__=~"a|b"``, literals only) and
    its other matchers; None when it names no such set."""
    for i, m in enumerate(matchers):
        if m.name != "__name__":
            continue
        names = (
            frozenset({m.value})
            if m.op == "="
            else compile_anchored(m.value).literals
            if m.op == "=~"
            else None
        )
        if names:
            return names, tuple(matchers[:i]) + tuple(matchers[i + 1 :])
    return None


def _grid_params(start_ms: int, steps: int, step_ms: int, window_ms: int) -> str:
    """The (start, end, step, window) parameters of a ``timeSeries*ToGrid`` aggregate."""
    return (
        f"fromUnixTimestamp64Milli(toInt64({start_ms}), 'UTC'), "
        f"fromUnixTimestamp64Milli(toInt64({start_ms + (steps - 1) * step_ms}), 'UTC'), "
        f"{_seconds(step_ms)}, {_seconds(window_ms)}"
    )


def _grid_order(
    result: pa.Table, labels_by_fp: dict[int, _Known]
) -> tuple[list[Labels], npt.NDArray[np.int64]]:
    """Sorted labels of a grid result's rows, and the row order that sorts them (unknown series left out)."""
    return _sorted_rows(result.column("fingerprint").to_numpy().tolist(), labels_by_fp)


def _sort_key(labels: Labels) -> str | None:
    """A string that sorts as the label tuple does (None if a label holds a separator character).

    Python compares tuples of tuples element by element; one string per label set compares in
    one C call, so a fleet's label sets sort many times faster (``make bench-kql``).
    """
    if any(c in part for pair in labels for part in pair for c in "\x00\x01"):
        return None
    return "\x00".join(f"{k}\x01{v}" for k, v in labels)


def _sorted_rows(
    fps: list[int], labels_by_fp: dict[int, _Known]
) -> tuple[list[Labels], npt.NDArray[np.int64]]:
    """Rows (positions in ``fps``) of known series ordered by their labels, and those labels."""
    found = [(known, i) for i, fp in enumerate(fps) if (known := labels_by_fp.get(fp)) is not None]
    if all(known[1] is not None for known, _ in found):
        found.sort(key=lambda item: item[0][1])  # type: ignore[arg-type,return-value]
    else:
        found.sort(key=lambda item: item[0][0])
    rows = np.fromiter((i for _, i in found), dtype=np.int64, count=len(found))
    return [known[0] for known, _ in found], rows


def _grid_column(
    result: pa.Table, name: str, steps: int, rows: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.float64]] | None:
    """An Array(Nullable(Float64)) column as (not null, values) of shape (series, steps); None if not that shape."""
    flat = result.column(name).combine_chunks().flatten()
    if len(flat) != result.num_rows * steps:
        return None
    valid = flat.is_valid().to_numpy(zero_copy_only=False).reshape(-1, steps)[rows]
    values = flat.to_numpy(zero_copy_only=False).astype(np.float64).reshape(-1, steps)[rows]
    return valid, values


def _seconds(ms: int) -> str:
    """Milliseconds as the Decimal64(3) seconds the *ToGrid functions take for step and window."""
    return f"toDecimal64('{ms // 1000}.{ms % 1000:03d}', 3)"


def _last_grid(
    labels: list[Labels],
    rows: npt.NDArray[np.intp],
    values: npt.NDArray[np.float64],
    ts: npt.NDArray[np.int64],
    sample_times: bool,
) -> GridColumns:
    """:meth:`ClickHouseStorage._cached_last`'s answer: the series ``rows`` of ``labels`` with their
    last samples (``values``, ``ts``), a stale marker not present."""
    column = values.reshape(-1, 1)
    return GridColumns(
        [labels[i] for i in rows.tolist()],
        column,
        ts.reshape(-1, 1) if sample_times else None,
        ~is_stale(column),
    )


def _empty_grid(steps: int) -> GridColumns:
    return GridColumns(
        [], np.empty((0, steps)), np.empty((0, steps), dtype=np.int64), np.empty((0, steps), dtype=bool)
    )


def _metrics(series: pa.Table) -> frozenset[str]:
    """The metric names of a series read (``_series_sql``'s ``s_metric``)."""
    return frozenset(str(m) for m in pc.unique(series.column("s_metric")).to_pylist())


def _starts_of(rows: pa.Table, keep: npt.NDArray[np.bool_] | None = None) -> npt.NDArray[np.int64] | None:
    """A read's start timestamps (its ``st`` column, the rows in ``keep``), None when it has none
    or all are unset: then nothing downstream looks at them."""
    if "st" not in rows.column_names:
        return None
    st = rows.column("st").to_numpy().astype(np.int64, copy=False)
    if keep is not None:
        st = st[keep]
    return st if st.any() else None


def _started(rows: pa.Table) -> pa.Array:
    """The fingerprints of a read's rows (samples or histograms) that have a start timestamp
    (none when it read no ``st``)."""
    if "st" not in rows.column_names:
        return pa.array([], pa.uint64())
    return pc.filter(rows.column("fingerprint"), pc.not_equal(rows.column("st"), 0))


def _columns(samples: pa.Table, labels_by_fp: dict[int, _Known]) -> SeriesColumns:
    """Samples ordered by (fingerprint, t) as :class:`SeriesColumns` sorted by labels, with their
    start timestamps when the read has some."""
    if samples.num_rows == 0:
        return columns_of([])
    fps, ts, vs, keep = _deduplicated(samples)
    st = _starts_of(samples, keep)
    starts = np.flatnonzero(np.concatenate(([True], fps[1:] != fps[:-1])))
    lengths = np.diff(np.append(starts, len(fps)))
    heads = fps[starts].tolist()
    labels, order = _sorted_rows(heads, labels_by_fp)
    starts, lengths = starts[order], lengths[order]
    offsets = np.zeros(len(labels) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if not np.array_equal(order, np.arange(len(heads))):
        idx = gather_ranges(starts, lengths)
        ts, vs = ts[idx], vs[idx]
        st = None if st is None else st[idx]
    return SeriesColumns(labels, ts, vs, offsets, st=st)


#: The histograms table's columns as one histogram: each side's counts from whichever of its two
#: columns (integer, float) the row filled (docs/storage.md, "Native histograms").
_HISTOGRAM_COLUMNS = (
    "schema, zero_threshold, zero_count, count, sum, counter_reset_hint, "
    "positive_span_offsets, positive_span_lengths, "
    "if(empty(positive_float_counts), CAST(positive_counts, 'Array(Float64)'), positive_float_counts) AS pb, "
    "negative_span_offsets, negative_span_lengths, "
    "if(empty(negative_float_counts), CAST(negative_counts, 'Array(Float64)'), negative_float_counts) AS nb, "
    "custom_values"
)


def _ragged(rows: pa.Table, name: str, pair: str | None = None) -> Ragged:
    """A list column (with ``pair``: two list columns of the same lengths, as (offset, length)
    pairs) as flat values and row offsets: Arrow's to_pylist of lists makes Python objects a row."""
    arr = rows.column(name).combine_chunks()
    offsets = arr.offsets.to_numpy().astype(np.int64)
    flat = arr.flatten().to_numpy(zero_copy_only=False)
    if pair is not None:
        other = rows.column(pair).combine_chunks().flatten().to_numpy(zero_copy_only=False)
        flat = np.stack([flat.astype(np.int64), other.astype(np.int64)], axis=1)
    else:
        flat = flat.astype(np.float64, copy=False)
    return Ragged(offsets - offsets[0], flat)


def _histogram_columns(rows: pa.Table) -> SparseHists:
    """The histogram rows as columns, in their order, hints as stored (none pending yet)."""
    return SparseHists(
        rows.column("schema").to_numpy().astype(np.int64),
        rows.column("zero_threshold").to_numpy().astype(np.float64, copy=False),
        rows.column("zero_count").to_numpy().astype(np.float64, copy=False),
        rows.column("count").to_numpy().astype(np.float64, copy=False),
        rows.column("sum").to_numpy().astype(np.float64, copy=False),
        rows.column("counter_reset_hint").to_numpy().astype(np.int64),
        np.zeros(rows.num_rows, dtype=bool),
        _ragged(rows, "positive_span_offsets", "positive_span_lengths"),
        _ragged(rows, "pb"),
        _ragged(rows, "negative_span_offsets", "negative_span_lengths"),
        _ragged(rows, "nb"),
        _ragged(rows, "custom_values"),
    )


def _merge_histograms(cols: SeriesColumns, hists: pa.Table, labels_by_fp: dict[int, _Known]) -> SeriesColumns:
    """Float columns plus the histogram samples of the same selection, as one :class:`SeriesColumns`.

    Series are every series with a sample of either kind, sorted by labels; a series' float
    sample at a timestamp where it also has a histogram is dropped (the histogram wins, as in
    ``MemoryStorage``); two histogram rows at one timestamp count once.
    """
    if hists.num_rows == 0:
        return cols
    fps = hists.column("fingerprint").to_numpy().astype(np.uint64, copy=False)
    ts = hists.column("t").to_numpy().astype(np.int64, copy=False)
    keep = np.ones(len(ts), dtype=bool)
    keep[:-1] = (fps[1:] != fps[:-1]) | (ts[1:] != ts[:-1])
    if not keep.all():
        hists = hists.filter(pa.array(keep))
        fps, ts = fps[keep], ts[keep]
    data = _histogram_columns(hists)
    h_st = _starts_of(hists)
    starts = np.flatnonzero(np.concatenate(([True], fps[1:] != fps[:-1])))
    ends = np.append(starts[1:], len(fps))
    by_labels: dict[Labels, tuple[int, int]] = {}
    for fp, a, b in zip(fps[starts].tolist(), starts.tolist(), ends.tolist(), strict=True):
        known = labels_by_fp.get(fp)
        if known is not None:
            by_labels[known[0]] = (a, b)
    floats = {labels: i for i, labels in enumerate(cols.labels)}
    keys = {known[0]: known[1] for known in labels_by_fp.values()}
    union = list({*floats, *by_labels})
    if all(keys.get(labels) is not None for labels in union):
        union.sort(key=lambda labels: keys[labels])  # type: ignore[arg-type,return-value]
    else:
        union.sort()
    f_off = cols.offsets
    f_starts, f_lens, h_starts, h_lens = [], [], [], []
    for labels in union:
        i = floats.get(labels)
        f_starts.append(0 if i is None else int(f_off[i]))
        f_lens.append(0 if i is None else int(f_off[i + 1] - f_off[i]))
        a, b = by_labels.get(labels, (0, 0))
        h_starts.append(a)
        h_lens.append(b - a)
    fi = gather_ranges(np.asarray(f_starts, dtype=np.int64), np.asarray(f_lens, dtype=np.int64))
    hi = gather_ranges(np.asarray(h_starts, dtype=np.int64), np.asarray(h_lens, dtype=np.int64))
    fts, fvs = cols.ts[fi], cols.vs[fi]
    f_st = None if cols.st is None else cols.st[fi]
    f_lengths = np.asarray(f_lens, dtype=np.int64)
    h_lengths = np.asarray(h_lens, dtype=np.int64)
    hts = ts[hi]
    h_st = None if h_st is None else h_st[hi]
    # The histogram wins at a timestamp both kinds hold: same series, same time.
    f_series = np.repeat(np.arange(len(union)), f_lengths)
    h_series = np.repeat(np.arange(len(union)), h_lengths)
    if len(fts) and len(hts):
        clash = np.isin(f_series.astype(np.int64) << 42 | fts, h_series.astype(np.int64) << 42 | hts)
        if clash.any():
            fts, fvs = fts[~clash], fvs[~clash]
            f_st = None if f_st is None else f_st[~clash]
            f_lengths = np.bincount(f_series[~clash], minlength=len(union)).astype(np.int64)
    f_offsets = np.zeros(len(union) + 1, dtype=np.int64)
    np.cumsum(f_lengths, out=f_offsets[1:])
    h_offsets = np.zeros(len(union) + 1, dtype=np.int64)
    np.cumsum(h_lengths, out=h_offsets[1:])
    # Counter-reset hints as Prometheus' TSDB returns them (as MemoryStorage's tsdb_hints), within
    # the window: the window's first histogram of a series keeps its stored hint. Columns: the
    # engine's dense paths read them as they are, objects are made only where asked for.
    if not np.array_equal(hi, np.arange(len(data))):
        data = data.take_ranges(np.asarray(h_starts, dtype=np.int64), h_lengths)
    data = tsdb_pending(data, hts, h_offsets, fts, f_offsets)
    return SeriesColumns(union, fts, fvs, f_offsets, HistColumns(hts, data, h_offsets, h_st), f_st)


def _deduplicated(
    samples: pa.Table,
) -> tuple[
    npt.NDArray[np.uint64], npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.bool_] | None
]:
    """Samples ordered by (fingerprint, t) as arrays, two writes at one timestamp counted once (as
    Prometheus); the rows kept, None when all were."""
    if samples.num_rows == 0:
        return np.empty(0, np.uint64), np.empty(0, np.int64), np.empty(0, np.float64), None
    fps = samples.column("fingerprint").to_numpy().astype(np.uint64, copy=False)
    ts = samples.column("t").to_numpy().astype(np.int64, copy=False)
    vs = samples.column("value").to_numpy().astype(np.float64, copy=False)
    keep = np.ones(len(ts), dtype=bool)
    keep[:-1] = (fps[1:] != fps[:-1]) | (ts[1:] != ts[:-1])
    if keep.all():
        return fps, ts, vs, None
    return fps[keep], ts[keep], vs[keep], keep


def _sorted_block(samples: pa.Table) -> SampleBlock:
    return SampleBlock.from_sorted(*_deduplicated(samples)[:3])
