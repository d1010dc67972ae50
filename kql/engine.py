"""The kql evaluator: one handler per AST node type, every expression evaluated at all steps at once.

>>> from kernel_insight.kql.storage import MemoryStorage
>>> s = MemoryStorage()
>>> s.add({"__name__": "kernel_launches_total", "gpu": "0"}, [0, 60_000, 120_000], [0.0, 60.0, 120.0])
>>> Engine(s).instant_query("rate(kernel_launches_total[2m])", 120_000).value.samples[0].value
1.0
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

import numpy as np
import numpy.typing as npt

from kernel_insight.kql import _windows
from kernel_insight.kql.aggregation import aggregate
from kernel_insight.kql.ast import (
    AggregateExpr,
    At,
    BinaryExpr,
    Call,
    Expr,
    MatrixSelector,
    Node,
    NumberLiteral,
    ParenExpr,
    PosRange,
    StringLiteral,
    SubqueryExpr,
    UnaryExpr,
    ValueType,
    VectorSelector,
    children,
)
from kernel_insight.kql.binary import ARITHMETIC, evaluate_binary
from kernel_insight.kql.checker import value_type
from kernel_insight.kql.errors import (
    KqlEvaluationError,
    KqlParseError,
    KqlTypeError,
    QueryCancelledError,
    QueryTimeoutError,
    TooManySamplesError,
    TooManySeriesError,
)
from kernel_insight.kql.functions import FUNCTIONS
from kernel_insight.kql.functions._common import labels_from_equal_matchers, unwrap
from kernel_insight.kql.functions.range_histograms import smoothed_selector
from kernel_insight.kql.histcells import Hists, SparseCells, object_cells
from kernel_insight.kql.histogram import COUNTER_RESET, NOT_COUNTER_RESET, UNKNOWN_COUNTER_RESET
from kernel_insight.kql.histsamples import cells, hmul
from kernel_insight.kql.lexical import MAX_DURATION_MS
from kernel_insight.kql.limits import DEFAULT_LOOKBACK_MS, EngineLimits
from kernel_insight.kql.parser import TRIM_OPS, parse
from kernel_insight.kql.printer import format_expr
from kernel_insight.kql.pushdown import (
    GRID_MIN_STEP_MS,
    GridColumns,
    HistColumns,
    SeriesColumns,
    columns_of,
    grid_step,
)
from kernel_insight.kql.sparsehists import stats_read_hints
from kernel_insight.kql.storage import (
    Capability,
    Matcher,
    SelectHints,
    SeriesData,
    Storage,
    is_stale,
    is_stale_histogram,
    read_within,
)
from kernel_insight.kql.values import (
    Annotation,
    Arg,
    CallContext,
    HistRange,
    Matrix,
    QueryResult,
    QueryStats,
    RangeInput,
    Sample,
    Scalar,
    Series,
    StepVector,
    String,
    Value,
    Vector,
    as_operand,
    as_scalar,
    as_vector,
    drop_name,
    float_samples,
    hist_mask,
    hist_weight,
)
from kernel_insight.kql.vectors import consolidate, finalize_names

__all__ = ["DEFAULT_LOOKBACK_MS", "CancelToken", "Engine", "EngineLimits"]

#: Parsed queries kept by text. Dashboards and rules send the same texts over and over, and
#: parsing a join takes about as long as evaluating it at one step; the tree is immutable.
PARSE_CACHE_SIZE = 1024
#: Python loops over series check the deadline once per this many iterations (a monotonic clock read).
_CHECK_EVERY = 1024
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
_T = TypeVar("_T")
_P = ParamSpec("_P")


class CancelToken:
    """Set it from any thread to stop a running query at its next checkpoint."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


# --------------------------------------------------------------------------------- helpers


def batched_searchsorted(ts: I64, offsets: I64, queries: I64, side: str) -> I64:
    """For every series (rows) and query time (columns): ``searchsorted`` within that series' slice.

    Returned indices are global positions in ``ts``. One walk through each series' samples and
    the sorted query times together, in C (``_windows.searchsorted``): numpy's way, placing
    every sample among the query times and counting per series, took five passes over all the
    samples (a large part of an instant ``avg_over_time(x[1h])``; ``make bench-kql``).
    """
    n = len(offsets) - 1
    out = np.empty((n, len(queries)), dtype=np.int64)
    if n == 0 or len(queries) == 0:
        return out
    order = np.argsort(queries, kind="stable")
    ascending = bool((order[1:] > order[:-1]).all())
    found = out if ascending else np.empty_like(out)
    _windows.searchsorted(
        np.ascontiguousarray(ts, dtype=np.int64),
        np.ascontiguousarray(offsets, dtype=np.int64),
        np.ascontiguousarray(queries[order], dtype=np.int64),
        side == "right",
        found,
    )
    if not ascending:
        out[:, order] = found
    return out


def window_bounds(ts: I64, offsets: I64, refs: I64, range_ms: int) -> tuple[I64, I64]:
    """Global [lo, hi) sample indices of every series' window ``(ref - range, ref]`` at every ref.

    One search for both ends: the series-major keys are built once.
    """
    both = batched_searchsorted(ts, offsets, np.concatenate([refs - range_ms, refs]), "right")
    steps = len(refs)
    return np.ascontiguousarray(both[:, :steps]), np.ascontiguousarray(both[:, steps:])


@functools.lru_cache(maxsize=PARSE_CACHE_SIZE)
def _parsed(text: str) -> Expr:
    """:func:`parse`, remembered (a query that fails to parse raises every time: nothing is kept)."""
    return parse(text)


def _held_size(value: Value) -> int:
    """Samples a node's result holds, as Prometheus counts them: present points, one per scalar
    step, a histogram by its size (:func:`hist_weight`)."""
    if isinstance(value, StepVector):
        floats = int(np.count_nonzero(value.present))
        return floats + value.hist_weight() if value.has_hists else floats
    if isinstance(value, RangeInput):
        return len(value.ts) + (0 if value.hist is None else value.hist.weight())
    if isinstance(value, np.ndarray):
        return len(value)
    return 0


# --------------------------------------------------------------------------------- evaluation


class _Evaluator:
    """State of one query: times, limits, annotations, counters."""

    def __init__(
        self,
        storage: Storage,
        query: str,
        start: int,
        end: int,
        step: int,
        is_range_query: bool,
        limits: EngineLimits,
        cancel: CancelToken | None,
    ) -> None:
        self.storage = storage
        self.capabilities = storage.capabilities
        self.query = query
        self.query_start = start
        self.query_end = end
        self.query_step = step
        self.is_range_query = is_range_query
        #: The query's own step times (an instant query's one time): the ``times`` of the top
        #: expression, and the reference times of every selector under it without @ or offset
        #: (:meth:`reference_times` hands this very array on), whose grid step is then known.
        self.times: I64 = (
            np.arange(start, end + 1, step, dtype=np.int64)
            if is_range_query
            else np.array([start], dtype=np.int64)
        )
        self.limits = limits
        self.cancel = cancel
        self.deadline = time.monotonic() + limits.timeout_s
        self.samples = 0  # loaded from storage over the whole query (stats)
        self.held = 0  # held in memory now: live intermediate results (Prometheus' currentSamples)
        self.peak = 0
        self.sample_times_wanted = 0  # > 0 while evaluating the argument of timestamp()
        #: While evaluating the selector argument of a function that reads start timestamps
        #: (SelectHints.start_timestamps).
        self.starts_wanted = False
        #: The nodes being evaluated, outermost first: the reads' hints name the function or
        #: aggregation around the selector from it (SelectHints.func, grouping).
        self.path: list[Node] = []
        # Enclosing calls that read only histogram counts and sums, and enclosing expressions that
        # need whole histograms (subqueries, histogram_quantile, trim): while the first is > 0 and
        # the second 0, selectors read hints as Prometheus' HistogramStatsIterator gives them.
        self.stats_readers = 0
        self.bucket_readers = 0
        self.annotations: list[Annotation] = []
        self._seen: set[tuple[str, str, int, int]] = set()
        self._grid_declined: tuple[tuple[Matcher, ...], int, int, bool] | None = None
        self.handlers: dict[type, Callable[[Any, I64], Any]] = {
            NumberLiteral: self.eval_number,
            StringLiteral: self.eval_string,
            VectorSelector: self.eval_vector_selector,
            MatrixSelector: self.eval_matrix_selector,
            SubqueryExpr: self.eval_subquery,
            ParenExpr: self.eval_paren,
            UnaryExpr: self.eval_unary,
            BinaryExpr: self.eval_binary,
            AggregateExpr: self.eval_aggregate,
            Call: self.eval_call,
        }

    # ------------------------------------------------------------------ bookkeeping

    def annotate(self, level: str, message: str, pos: PosRange) -> None:
        key = (level, message, pos.start, pos.end)
        if key not in self._seen:
            self._seen.add(key)
            self.annotations.append(Annotation(level, message, pos))  # type: ignore[arg-type]

    def checkpoint(self) -> None:
        if self.cancel is not None and self.cancel.cancelled:
            raise QueryCancelledError("query was canceled in expression evaluation")
        if time.monotonic() > self.deadline:
            raise QueryTimeoutError.after(self.limits.timeout_s)

    def hold(self, n: int) -> None:
        """Count ``n`` more samples as held in memory; refuse past ``max_samples`` (Prometheus' text)."""
        held = self.held + n
        if held > self.limits.max_samples:
            raise TooManySamplesError()
        self.held = held
        if held > self.peak:
            self.peak = held

    def count_samples(self, n: int) -> None:
        """Samples loaded from storage: held until the expression that reads them has its result."""
        self.samples += n
        self.hold(n)

    def dense(self, series: int, steps: int) -> None:
        """Refuse before allocating ``series x steps`` arrays that would not fit the sample limit.

        kql stores step vectors densely, so the cells count even where a series has no sample.
        """
        if self.held + series * steps > self.limits.max_samples:
            raise TooManySamplesError()

    def grid_step(self, refs: I64) -> int | None:
        """:func:`grid_step` of ``refs``, without comparing every step when they are the query's
        own steps (:attr:`times`: a range selector without @ or offset), which every selector asks."""
        if refs is self.times and len(refs) > 1:
            return self.query_step
        return grid_step(refs)

    def read(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Call the storage; its failures become StorageError.

        A back end that honours the budget of its hints (:meth:`hints`) raises the query's own
        timeout or sample-limit error.
        """
        self.checkpoint()
        return read_within("storage select failed", fn, *args, **kwargs)

    def hints(self, step_ms: int | None = None, range_ms: int = 0, func: str | None = None) -> SelectHints:
        """The hints of a read made now: the budget left to the query, the function or
        aggregation around the selector being read (``func`` when given, else as Prometheus'
        extractFuncFromPath and extractGroupsFromPath find them), and ``step_ms`` (default:
        the query's step)."""
        grouping: tuple[str, ...] = ()
        by = False
        path = self.path
        for i in range(len(path) - 1, -1, -1) if func is None else ():
            node = path[i]
            if isinstance(node, AggregateExpr):
                func = node.op
                if i == len(path) - 2:  # directly around the selector
                    grouping, by = node.grouping, not node.without
                break
            if isinstance(node, Call):
                func = node.func
                break
            if isinstance(node, BinaryExpr):
                break
        return SelectHints(
            step_ms=(self.query_step if self.is_range_query else 0) if step_ms is None else step_ms,
            func=func or "",
            range_ms=range_ms,
            grouping=grouping,
            by=by,
            budget=self.limits.read_budget(self.deadline, self.held),
            start_timestamps=self.starts_wanted,
        )

    def select(
        self, matchers: Sequence[Matcher], start: int, end: int, range_ms: int = 0
    ) -> list[SeriesData]:
        series = self.read(self.storage.select, matchers, start, end, self.hints(range_ms=range_ms))
        if len(series) > self.limits.max_series:
            raise TooManySeriesError(
                f"query selected {len(series)} series, more than the limit of {self.limits.max_series}"
            )
        return series

    def select_columns(
        self, matchers: Sequence[Matcher], start: int, end: int, range_ms: int = 0
    ) -> SeriesColumns:
        """Like :meth:`select`, as one block; a store declaring ``Capability.COLUMNS`` answers so
        without per-series work."""
        if Capability.COLUMNS not in self.capabilities:
            return self._stats_hinted(columns_of(self.select(matchers, start, end, range_ms)))
        cols = self.read(self.storage.select_columns, matchers, start, end, self.hints(range_ms=range_ms))
        if len(cols) > self.limits.max_series:
            raise TooManySeriesError(
                f"query selected {len(cols)} series, more than the limit of {self.limits.max_series}"
            )
        return self._stats_hinted(cols)

    def _stats_hinted(self, cols: SeriesColumns) -> SeriesColumns:
        hist = cols.hist
        if hist is None or self.stats_readers == 0 or self.bucket_readers > 0:
            return cols
        stats = HistColumns(hist.ts, stats_read_hints(hist, hist.offsets), hist.offsets, hist.st)
        return dataclasses.replace(cols, hist=stats)

    # ------------------------------------------------------------------ durations and times

    def duration_seconds(self, node: Node) -> float:
        """Evaluate a duration expression (numbers are seconds)."""
        if isinstance(node, NumberLiteral):
            return node.value
        if isinstance(node, ParenExpr):
            return self.duration_seconds(node.expr)
        if isinstance(node, UnaryExpr):
            value = self.duration_seconds(node.expr)
            return -value if node.op == "-" else value
        if isinstance(node, BinaryExpr):
            lhs, rhs = self.duration_seconds(node.lhs), self.duration_seconds(node.rhs)
            return float(ARITHMETIC[node.op](np.float64(lhs), np.float64(rhs)))
        if isinstance(node, Call):
            if node.func == "step":
                return self.query_step / 1000
            if node.func == "range":
                return (self.query_end - self.query_start) / 1000
            a, b = (self.duration_seconds(arg) for arg in node.args)
            if np.isnan(a) or np.isnan(b):
                return float("nan")
            return min(a, b) if node.func == "min_of" else max(a, b)
        raise KqlEvaluationError(f"invalid duration expression {node}")

    def duration_ms(self, node: Node | None, what: str, positive: bool = False) -> int:
        if node is None:
            return 0
        seconds = self.duration_seconds(node)
        if not np.isfinite(seconds):
            raise KqlEvaluationError(f"{what} must be a finite duration, got {seconds}")
        ms = round(seconds * 1000)
        if abs(ms) > MAX_DURATION_MS:
            # A client's mistake, as for a duration literal out of range: 400 with its position.
            raise KqlParseError(
                f"{what} out of range: {seconds:g}s", self.query, node.pos.start, node.pos.end
            )
        if positive and ms <= 0:
            raise KqlEvaluationError(f"{what} must be greater than 0, got {seconds:g}s")
        return ms

    def reference_times(self, times: I64, at: At | None, offset: Node | None) -> I64:
        """The time each step reads data at: the step (or the @ time) minus the offset; ``times``
        itself without either (read only, as every caller treats it)."""
        offset_ms = self.duration_ms(offset, "offset")
        if at is None and offset_ms == 0:
            return times
        if at is None:
            base = times
        else:
            ms = {"time": at.ms, "start": self.query_start, "end": self.query_end}[at.kind]
            base = np.full(len(times), ms, dtype=np.int64)
        refs: I64 = base - offset_ms
        return refs

    def data_times(self, node: Node, times: I64) -> I64:
        """When the selectors under ``node`` read their data, per step (follows @, offset, subqueries)."""
        while isinstance(node, ParenExpr):
            node = node.expr
        if isinstance(node, VectorSelector):
            return self.reference_times(times, node.at, node.offset)
        if isinstance(node, MatrixSelector):
            return self.reference_times(times, node.vector.at, node.vector.offset)
        if isinstance(node, SubqueryExpr):
            return self.data_times(node.expr, self.reference_times(times, node.at, node.offset))
        for child in children(node):
            if not isinstance(child, NumberLiteral | StringLiteral):
                return self.data_times(child, times)
        return times

    # ------------------------------------------------------------------ dispatch

    def eval(self, node: Node, times: I64) -> Value:
        """Evaluate ``node`` at ``times``; its inputs are released once its result is counted."""
        self.checkpoint()
        before = self.held
        loaded = self.samples
        self.path.append(node)
        value: Value = self.handlers[type(node)](node, times)
        self.path.pop()  # (a failure ends the query: nothing reads the path after one)
        if isinstance(node, VectorSelector | MatrixSelector):
            # A selector's result is the samples it loaded (already counted), not a second copy:
            # Prometheus' peak for ``x`` is x's samples once.
            size = self.samples - loaded
            self.held = before
        else:
            size = _held_size(value)
        # The result and the inputs it was built from are in memory together at this point.
        self.hold(size)
        self.held = before + size
        return value

    def eval_number(self, node: NumberLiteral, times: I64) -> F64:
        return np.full(len(times), node.value)

    def eval_string(self, node: StringLiteral, times: I64) -> str:
        return node.value

    def eval_paren(self, node: ParenExpr, times: I64) -> Value:
        return self.eval(node.expr, times)

    def eval_unary(self, node: UnaryExpr, times: I64) -> Value:
        value = self.eval(node.expr, times)
        if node.op == "+":
            return value
        if isinstance(value, StepVector):
            hists = value.hist_objects()
            if hists is not None:
                for i, j, h in cells(hists):
                    hists[i, j] = hmul(h, -1.0)
            return StepVector(
                value.labels,
                -value.values,
                value.present,
                np.ones(len(value), dtype=bool),
                None,
                object_cells(hists),
            )
        return -as_scalar(value)

    def eval_binary(self, node: BinaryExpr, times: I64) -> Value:
        trim = node.op in TRIM_OPS
        self.bucket_readers += trim
        try:
            lhs = self.eval(node.lhs, times)
            rhs = self.eval(node.rhs, times)
        finally:
            self.bucket_readers -= trim
        return evaluate_binary(self, node, as_operand(lhs), as_operand(rhs))

    def eval_aggregate(self, node: AggregateExpr, times: I64) -> StepVector:
        param = self.eval(node.param, times) if node.param is not None else None
        if isinstance(param, RangeInput | StepVector):  # pragma: no cover - the checker rules it out
            raise TypeError(f"{node.op}: the parameter is a {type(param).__name__}")
        return aggregate(self, node, as_vector(self.eval(node.expr, times)), param)

    def eval_call(self, node: Call, times: I64) -> Value:
        pushed = self._range_on_grid(node, times)
        if pushed is not None:
            return pushed
        spec = FUNCTIONS[node.func]
        # Only timestamp() and start_timestamp() read the sample times of their selector; a grid
        # read skips them otherwise.
        wants_times = spec.sample_times
        self.sample_times_wanted += wants_times
        stats, buckets = spec.histogram_reads == "stats", spec.histogram_reads == "buckets"
        self.stats_readers += stats
        self.bucket_readers += buckets
        # Start timestamps are read for rate, increase, irate and resets of a selector only.
        starts = self.starts_wanted
        self.starts_wanted = spec.start_timestamps and isinstance(unwrap(node.args[0]), MatrixSelector)
        try:
            args: list[Arg] = [
                arg if i in spec.unevaluated else self.eval(arg, times) for i, arg in enumerate(node.args)
            ]
        finally:
            self.sample_times_wanted -= wants_times
            self.stats_readers -= stats
            self.bucket_readers -= buckets
            self.starts_wanted = starts
        return spec.evaluate(CallContext(self, node, times), args)

    def start_timestamps(self, node: VectorSelector, times: I64, vec: StepVector) -> F64:
        """The start timestamp (ms, 0 = unset) of the sample behind each cell of ``vec``, the
        selector ``node``'s value at ``times`` with its sample times (``start_timestamp()``)."""
        out = np.zeros(vec.values.shape)
        if vec.sample_ts is None or not len(vec):
            return out
        refs = self.reference_times(times, node.at, node.offset)
        wanted, self.starts_wanted = self.starts_wanted, True
        try:
            cols = self.select_columns(
                node.all_matchers(), int(refs.min()) - self.limits.lookback_ms + 1, int(refs.max())
            )
        finally:
            self.starts_wanted = wanted
        row_of = {labels: i for i, labels in enumerate(cols.labels)}
        for ts, st, offsets in (
            (cols.ts, cols.st, cols.offsets),
            (None, None, None) if cols.hist is None else (cols.hist.ts, cols.hist.st, cols.hist.offsets),
        ):
            if st is None or ts is None or offsets is None:
                continue
            for i, labels in enumerate(vec.labels):
                j = row_of.get(labels)
                if j is None:
                    continue
                a, b = int(offsets[j]), int(offsets[j + 1])
                at = np.searchsorted(ts[a:b], vec.sample_ts[i], side="left")
                hit = (
                    (at < b - a) & (ts[a:b][np.minimum(at, max(b - a - 1, 0))] == vec.sample_ts[i])
                    if b > a
                    else None
                )
                if hit is not None:
                    out[i] = np.where(hit, st[a:b][np.minimum(at, b - a - 1)], out[i])
        return out

    def eval_vector_selector(self, node: VectorSelector, times: I64) -> StepVector:
        refs = self.reference_times(times, node.at, node.offset)
        if node.smoothed:
            return self._smoothed_selector(node, refs)
        return self.lookup(node.all_matchers(), refs, self.sample_times_wanted > 0)

    def lookup(self, matchers: Sequence[Matcher], refs: I64, sample_times: bool = True) -> StepVector:
        """The latest sample of every matching series at each reference time (lookback, staleness).

        ``sample_times=False`` lets a grid read leave out the sample timestamps (``sample_ts``).
        """
        lookback = self.limits.lookback_ms
        pushed = self._lookup_on_grid(matchers, refs, sample_times)
        if pushed is not None:
            return pushed
        cols = self.select_columns(matchers, int(refs.min()) - lookback + 1, int(refs.max()))
        if cols.hist is not None:
            return self._lookup_mixed(cols, refs)
        ts, vs, offsets = cols.ts, cols.vs, cols.offsets
        n, steps = len(cols), len(refs)
        if n == 0 or len(ts) == 0:
            empty = StepVector.empty(steps)
            if sample_times:  # as asked, even with no row (a grid store answers so too)
                empty.sample_ts = np.empty((0, steps), dtype=np.int64)
            return empty
        self.dense(n, steps)
        last = batched_searchsorted(ts, offsets, refs, "right") - 1
        has = last >= offsets[:-1, None]
        idx = np.where(has, last, 0)
        sample_ts = ts[idx]
        values = vs[idx]
        present = has & (sample_ts > refs[None, :] - lookback) & ~is_stale(values)
        self.count_samples(int(present.sum()))
        labels = cols.labels
        return StepVector(labels, values, present, np.zeros(n, dtype=bool), sample_ts).compact()

    def _lookup_mixed(self, cols: SeriesColumns, refs: I64) -> StepVector:
        """:meth:`lookup` over series holding native histograms: the later of each series' latest
        float and latest histogram is its sample (a stale marker of either kind ends both)."""
        hist = cols.hist
        assert hist is not None
        lookback = self.limits.lookback_ms
        n, steps = len(cols), len(refs)
        if n == 0:
            return StepVector.empty(steps)
        self.dense(n, steps)
        window_start = refs[None, :] - lookback
        if len(cols.ts):
            last = batched_searchsorted(cols.ts, cols.offsets, refs, "right") - 1
            has = last >= cols.offsets[:-1, None]
            idx = np.where(has, last, 0)
            f_ts, values = cols.ts[idx], cols.vs[idx]
        else:
            has = np.zeros((n, steps), dtype=bool)
            f_ts, values = np.zeros((n, steps), dtype=np.int64), np.zeros((n, steps))
        if len(hist.ts):
            hlast = batched_searchsorted(hist.ts, hist.offsets, refs, "right") - 1
            hhas = hlast >= hist.offsets[:-1, None]
            hidx = np.where(hhas, hlast, 0)
            h_ts = hist.ts[hidx]
        else:
            hhas = np.zeros((n, steps), dtype=bool)
            hidx, h_ts = np.zeros((n, steps), dtype=np.int64), np.zeros((n, steps), dtype=np.int64)
        use_hist = hhas & (~has | (h_ts > f_ts))
        present = has & ~use_hist & (f_ts > window_start) & ~is_stale(values)
        shown = use_hist & (h_ts > window_start)
        sample_ts = np.where(use_hist, h_ts, f_ts)
        if hist.data is not None:  # a columnar read: the cells stay columns (SparseCells)
            cells = SparseCells.at(hist.data, hidx, shown)
            self.count_samples(int(present.sum()) + cells.weight())
            return StepVector(
                cols.labels,
                values,
                present,
                np.zeros(n, dtype=bool),
                sample_ts,
                Hists.of((n, steps), sparse=cells if len(cells) else None),
            ).compact()
        hists: npt.NDArray[np.object_] = np.full((n, steps), None, dtype=object)
        if shown.any():
            hists[shown] = hist.hs[hidx[shown]]
            for i, j in zip(*np.nonzero(shown), strict=True):
                if is_stale_histogram(hists[i, j]):
                    hists[i, j] = None
        hp = hist_mask(hists)
        self.count_samples(int(present.sum()) + hist_weight(hists))
        return StepVector(
            cols.labels,
            values,
            present,
            np.zeros(n, dtype=bool),
            sample_ts,
            object_cells(hists if hp.any() else None),
        ).compact()

    def _lookup_on_grid(
        self, matchers: Sequence[Matcher], refs: I64, sample_times: bool
    ) -> StepVector | None:
        """:meth:`lookup` computed by the store (``Capability.LAST_ON_GRID``) when the reference
        times form a grid."""
        grid = self._grid_last(matchers, refs, sample_times)
        if grid is None:
            return None
        self.count_samples(int(grid.present.sum()))
        n = len(grid)
        return StepVector(
            grid.labels, grid.values, grid.present, np.zeros(n, dtype=bool), grid.sample_ts
        ).compact()

    def _grid_last(self, matchers: Sequence[Matcher], refs: I64, sample_times: bool) -> GridColumns | None:
        """The store's grid answer (``Capability.LAST_ON_GRID``) for the selector at the reference
        times (series limit checked, samples not yet counted); None when it declines, or declined
        these very times before (:meth:`instant_selector`: the general path that follows does not
        ask again)."""
        if Capability.LAST_ON_GRID not in self.capabilities:
            return None
        step = self.grid_step(refs)
        if step is None or (len(refs) > 1 and step < GRID_MIN_STEP_MS):
            return None
        first, last = int(refs[0]), int(refs[-1])
        if self._grid_declined is not None:
            declined, self._grid_declined = self._grid_declined, None
            if declined == (tuple(matchers), first, last, sample_times):
                return None
        grid = self.read(
            self.storage.select_last_on_grid,
            matchers,
            first,
            last,
            self.hints(step),
            self.limits.lookback_ms,
            sample_times,
        )
        if grid is None:
            self._grid_declined = (tuple(matchers), first, last, sample_times)
            return None
        if len(grid) > self.limits.max_series:
            raise TooManySeriesError(
                f"query selected {len(grid)} series, more than the limit of {self.limits.max_series}"
            )
        return grid

    def instant_selector(self, node: VectorSelector, absent: bool, time_ms: int) -> Vector | None:
        """The instant query ``node`` (or ``absent(node)``) at ``time_ms`` straight from the grid
        read's columns: the answer :meth:`Engine._result` gives for the general evaluation (same
        samples, same order, same counts and peak), without the step vector, the call machinery
        and the name finalisation (some forty small steps: an instant ``absent`` or ``up`` spent
        more in them than in its read). None when the storage declines (the general path
        then does not ask it again) or two answered series share labels (the general path says
        what that means)."""
        refs = np.array([time_ms], dtype=np.int64)
        matchers = node.all_matchers()
        grid = self._grid_last(matchers, refs, False)
        if grid is None:
            return None
        rows = np.flatnonzero(grid.present[:, 0]).tolist()
        labels = grid.labels
        shown = labels if len(rows) == len(labels) else [labels[i] for i in rows]
        if len(set(shown)) != len(shown):
            return None
        self.count_samples(len(rows))
        if absent:
            if rows:
                return Vector(time_ms, ())
            self.hold(1)  # absent's one sample, held with what its argument loaded (none)
            return Vector(time_ms, (Sample(labels_from_equal_matchers(matchers), time_ms, 1.0),))
        return Vector(time_ms, float_samples(labels, time_ms, rows, grid.values[rows, 0].tolist()))

    def range_selector(self, node: VectorSelector, absent: bool) -> StepVector | Matrix:
        """The range query ``node`` (or ``absent(node)``) over the query's steps without the call
        machinery: the selector's step vector as :meth:`eval` gives it (the same reads, counts
        and peak), and ``absent``'s one series straight from where it is empty (Engine._result's
        answer for the general evaluation). A selector that matches nothing is known so from
        the storage's series selection (a cached metric's, kept while its blocks are the same)
        and answered with one series of 1 at every step; the call, ``absent``'s step vector,
        ``compact`` and ``finalize_names`` took half of a range ``absent``."""
        matchers = node.all_matchers()
        vec = self.lookup(matchers, self.times, False)
        if not absent:
            return vec
        times = self.times
        if len(vec):
            empty = ~(vec.any_present() if vec.has_hists else vec.present).any(axis=0)
            times = times[empty]
        self.hold(len(times))  # absent's samples, held with what its argument loaded
        if not len(times):
            return Matrix(())
        labels = labels_from_equal_matchers(matchers)
        return Matrix((Series(labels, times.copy() if times is self.times else times, np.ones(len(times))),))

    def _range_on_grid(self, node: Call, times: I64) -> StepVector | None:
        """``func(selector[range])`` computed by the store (``Capability.RANGE_ON_GRID``) when the
        steps form a grid."""
        pushdown = FUNCTIONS[node.func].pushdown
        if pushdown is None or len(node.args) != 1 or Capability.RANGE_ON_GRID not in self.capabilities:
            return None
        arg = node.args[0]
        while isinstance(arg, ParenExpr):
            arg = arg.expr
        if not isinstance(arg, MatrixSelector) or arg.anchored or arg.smoothed:
            return None
        refs = self.reference_times(times, arg.vector.at, arg.vector.offset)
        step = self.grid_step(refs)
        if step is None or (len(refs) > 1 and step < GRID_MIN_STEP_MS):
            return None
        range_ms = self.duration_ms(arg.range, "range", positive=True)
        answer = self.read(
            self.storage.select_range_on_grid,
            arg.vector.all_matchers(),
            int(refs[0]),
            int(refs[-1]),
            self.hints(step, range_ms, node.func),
        )
        if answer is None:
            return None
        grid, samples = answer
        if len(grid) > self.limits.max_series:
            raise TooManySeriesError(
                f"query selected {len(grid)} series, more than the limit of {self.limits.max_series}"
            )
        self.count_samples(samples)
        drop = np.full(len(grid), not pushdown.keeps_name, dtype=bool)
        return StepVector(grid.labels, np.where(grid.present, grid.values, 0.0), grid.present, drop).compact()

    def _smoothed_selector(self, node: VectorSelector, refs: I64) -> StepVector:
        """Each step's value interpolated linearly between the samples just before and after it."""
        lookback = self.limits.lookback_ms
        cols = self.select_columns(
            node.all_matchers(), int(refs.min()) - lookback + 1, int(refs.max()) + lookback
        )
        ts, vs, offsets = cols.ts, cols.vs, cols.offsets
        n, steps = len(cols), len(refs)
        if n == 0 or (len(ts) == 0 and cols.hist is None):
            return StepVector.empty(steps)
        self.dense(n, steps)
        if len(ts) == 0:
            return smoothed_selector(self, node, StepVector.empty(steps), cols, refs)
        nxt = batched_searchsorted(ts, offsets, refs, "right")
        last = nxt - 1
        has_prev = last >= offsets[:-1, None]
        has_next = nxt < offsets[1:, None]
        p_idx, n_idx = np.where(has_prev, last, 0), np.where(has_next, nxt, 0)
        pt, pv, nt, nv = ts[p_idx], vs[p_idx], ts[n_idx], vs[n_idx]
        has_prev &= (pt > refs[None, :] - lookback) & ~is_stale(pv)
        has_next &= (nt <= refs[None, :] + lookback) & ~is_stale(nv)
        exact = has_prev & (pt == refs[None, :])
        span = np.where(has_next & has_prev, nt - pt, 1).astype(np.float64)
        interpolated = pv + (nv - pv) * (refs[None, :] - pt) / span
        values = np.where(exact | ~has_next, pv, interpolated)
        present = has_prev
        self.count_samples(int(present.sum()))
        labels = cols.labels
        out = StepVector(labels, values, present, np.zeros(n, dtype=bool))
        if cols.hist is not None:
            return smoothed_selector(self, node, out, cols, refs)
        return out.compact()

    def eval_matrix_selector(self, node: MatrixSelector, times: I64) -> RangeInput:
        vec = node.vector
        refs = self.reference_times(times, vec.at, vec.offset)
        range_ms = self.duration_ms(node.range, "range", positive=True)
        extra = self.limits.lookback_ms if (node.anchored or node.smoothed) else 0
        after = self.limits.lookback_ms if node.smoothed else 0
        cols = self.select_columns(
            vec.all_matchers(), int(refs.min()) - range_ms - extra + 1, int(refs.max()) + after, range_ms
        ).without_stale()
        ts, vs, offsets = cols.ts, cols.vs, cols.offsets
        # What is held is each loaded sample once, however many steps' windows share it (Prometheus
        # holds one series' window at a time); the windows' (lo, hi) bounds are dense arrays,
        # refused first if they alone would not fit.
        self.dense(len(cols), len(refs))
        self.count_samples(len(ts) + (0 if cols.hist is None else cols.hist.weight()))
        lo, hi = window_bounds(ts, offsets, refs, range_ms)
        hist = None
        if cols.hist is not None:
            hlo, hhi = window_bounds(cols.hist.ts, cols.hist.offsets, refs, range_ms)
            hist = HistRange(cols.hist.ts, cols.hist.source(), cols.hist.offsets, hlo, hhi, cols.hist.st)
        return RangeInput(
            labels=cols.labels,
            drop_name=np.zeros(len(cols), dtype=bool),
            ts=ts,
            vs=vs,
            offsets=offsets,
            lo=lo,
            hi=hi,
            end=refs,
            range_ms=range_ms,
            anchored=node.anchored,
            smoothed=node.smoothed,
            checkpoint=self.checkpoint,
            hist=hist,
            st=cols.st,
        )

    def eval_subquery(self, node: SubqueryExpr, times: I64) -> RangeInput:
        refs = self.reference_times(times, node.at, node.offset)
        range_ms = self.duration_ms(node.range, "subquery range", positive=True)
        step_ms = (
            self.duration_ms(node.step, "subquery step", positive=True)
            if node.step is not None
            else self.limits.subquery_step_ms
        )
        first = int(refs.min()) - range_ms
        start = (first // step_ms) * step_ms
        if start <= first:
            start += step_ms
        # Every inner step holds at least a value per series: refuse before allocating the steps.
        self.dense(1, max(0, (int(refs.max()) - start) // step_ms + 1))
        inner_times = np.arange(start, int(refs.max()) + 1, step_ms, dtype=np.int64)
        if len(inner_times) == 0:
            inner = StepVector.empty(0)
        else:
            self.bucket_readers += 1
            try:
                inner = consolidate(as_vector(self.eval(node.expr, inner_times)))
            finally:
                self.bucket_readers -= 1
        n = len(inner)
        self.dense(n, len(refs))
        # Row-major order of the present cells is series by series, in time order.
        rows, cols = np.nonzero(inner.present)
        ts = inner_times[cols]
        vs = inner.values[rows, cols]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.count_nonzero(inner.present, axis=1), out=offsets[1:])
        lo, hi = window_bounds(ts, offsets, refs, range_ms)
        hist = None
        inner_hists = inner.hist_objects()
        if inner_hists is not None:
            hmask = hist_mask(inner_hists)
            hrows, hcols = np.nonzero(hmask)
            hoffsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(np.count_nonzero(hmask, axis=1), out=hoffsets[1:])
            hts = inner_times[hcols]
            hlo, hhi = window_bounds(hts, hoffsets, refs, range_ms)
            hist = HistRange(hts, _unknown_resets(inner_hists[hrows, hcols]), hoffsets, hlo, hhi)
        return RangeInput(
            labels=inner.labels,
            drop_name=inner.drop_name.copy(),
            ts=ts,
            vs=vs,
            offsets=offsets,
            lo=lo,
            hi=hi,
            end=refs,
            range_ms=range_ms,
            checkpoint=self.checkpoint,
            hist=hist,
        )


def _unknown_resets(hs: npt.NDArray[np.object_]) -> npt.NDArray[np.object_]:
    """A subquery's histograms with their ``CounterReset``/``NotCounterReset`` hints made unknown,
    as Prometheus' evalSubquery does: the subquery may skip the sample that reset the counter or
    return it several times, so its consumers (``rate``, ``increase``, ``resets``) detect resets
    between the samples they are given instead of trusting hints written for other neighbours."""
    out = hs.copy()
    for k, h in enumerate(out.tolist()):
        if h.counter_reset_hint in (COUNTER_RESET, NOT_COUNTER_RESET):
            out[k] = h.copy(counter_reset_hint=UNKNOWN_COUNTER_RESET)
    return out


# --------------------------------------------------------------------------------- engine


class Engine:
    """Evaluates kql over a :class:`Storage`.

    >>> from kernel_insight.kql.storage import MemoryStorage
    >>> Engine(MemoryStorage()).instant_query("1 + 1", 0).value
    Scalar(timestamp_ms=0, value=2.0)
    """

    def __init__(self, storage: Storage, limits: EngineLimits | None = None) -> None:
        self.storage = storage
        self.limits = limits or EngineLimits()

    def instant_query(
        self,
        query: str | Expr,
        time_ms: int,
        *,
        cancel: CancelToken | None = None,
        limits: EngineLimits | None = None,
    ) -> QueryResult:
        """Evaluate ``query`` at one time; the value is a Vector, Matrix, Scalar or String."""
        return self._run(query, time_ms, time_ms, 0, False, cancel, limits)

    def latest(self, matchers: Sequence[Matcher], time_ms: int) -> StepVector:
        """Each matching series' newest sample at ``time_ms``, as a bare selector evaluates (lookback,
        staleness), with the sample's own timestamp in ``sample_ts``: for callers that combine the
        samples themselves, so the instant-selector rules stay here (the health snapshot)."""
        ev = _Evaluator(self.storage, "", time_ms, time_ms, 0, False, self.limits, None)
        with np.errstate(all="ignore"):
            return ev.lookup(matchers, np.array([time_ms], dtype=np.int64), sample_times=True)

    def range_query(
        self,
        query: str | Expr,
        start_ms: int,
        end_ms: int,
        step_ms: int,
        *,
        cancel: CancelToken | None = None,
        limits: EngineLimits | None = None,
    ) -> QueryResult:
        """Evaluate ``query`` at ``start, start+step, ... <= end``; the value is a Matrix."""
        if step_ms <= 0:
            raise ValueError("zero or negative query resolution step widths are not accepted")
        if end_ms < start_ms:
            raise ValueError("end timestamp must not be before start time")
        return self._run(query, start_ms, end_ms, step_ms, True, cancel, limits)

    def _run(
        self,
        query: str | Expr,
        start: int,
        end: int,
        step: int,
        is_range: bool,
        cancel: CancelToken | None,
        limits: EngineLimits | None,
    ) -> QueryResult:
        began = time.monotonic()
        # A tree built in code has no positions in any text: print it and parse that, so that
        # annotations point into the query they are reported with.
        text = query if isinstance(query, str) else format_expr(query)
        expr = _parsed(text)
        kind = value_type(expr)
        if is_range and kind not in (ValueType.SCALAR, ValueType.VECTOR):
            raise KqlTypeError(
                f'invalid expression type "{kind}" for range query, must be scalar or instant vector',
                text,
                expr.pos.start,
                expr.pos.end,
            )
        ev = _Evaluator(self.storage, text, start, end, step, is_range, limits or self.limits, cancel)
        times = ev.times
        lean = _lean_selector(expr)
        with np.errstate(all="ignore"):
            if lean is None:
                value = self._result(ev, ev.eval(expr, times), times, is_range)
            elif is_range:
                raw = ev.range_selector(*lean)
                value = raw if isinstance(raw, Matrix) else self._result(ev, raw, times, True)
            else:
                lean_value = ev.instant_selector(lean[0], lean[1], start)
                value = (
                    self._result(ev, ev.eval(expr, times), times, False) if lean_value is None else lean_value
                )
        series = len(value) if isinstance(value, Vector | Matrix) else 1
        if series > ev.limits.max_series:
            raise TooManySeriesError(
                f"query returned {series} series, more than the limit of {ev.limits.max_series}"
            )
        stats = QueryStats(
            samples=ev.samples, series=series, seconds=time.monotonic() - began, peak_samples=ev.peak
        )
        return QueryResult(value, text, tuple(ev.annotations), stats)

    def _result(
        self, ev: _Evaluator, raw: Value, times: I64, is_range: bool
    ) -> Vector | Matrix | Scalar | String:
        t0 = int(times[0])
        if isinstance(raw, str):
            return String(t0, raw)
        if isinstance(raw, RangeInput):
            return _range_to_matrix(raw)
        if isinstance(raw, StepVector):
            vec = finalize_names(raw)
            hists = vec.hist_objects()
            if not is_range:
                if hists is None:
                    # Indices and values as Python lists: a numpy scalar read per series cost more
                    # than the Sample it goes into.
                    rows = np.flatnonzero(vec.present[:, 0])
                    samples = float_samples(vec.labels, t0, rows.tolist(), vec.values[rows, 0].tolist())
                else:
                    samples = tuple(
                        Sample(vec.labels[i], t0, float(vec.values[i, 0]))
                        if vec.present[i, 0]
                        else Sample(vec.labels[i], t0, float("nan"), hists[i, 0])
                        for i in np.flatnonzero(vec.any_present()[:, 0])
                    )
                return Vector(t0, samples)
            order = sorted(range(len(vec)), key=lambda i: vec.labels[i])
            hmask = None if hists is None else hist_mask(hists)
            out = []
            for k, i in enumerate(order):
                if k % _CHECK_EVERY == _CHECK_EVERY - 1:
                    ev.checkpoint()
                row = vec.present[i]
                if hists is None or hmask is None:
                    if row.any():
                        out.append(Series(vec.labels[i], times[row], vec.values[i][row]))
                    continue
                hrow = hmask[i]
                if row.any() or hrow.any():
                    out.append(
                        Series(
                            vec.labels[i], times[row], vec.values[i][row], times[hrow], tuple(hists[i][hrow])
                        )
                    )
            return Matrix(tuple(out))
        scalar = np.asarray(raw, dtype=np.float64)
        if not is_range:
            return Scalar(t0, float(scalar[0]))
        return Matrix((Series((), times.copy(), scalar.copy()),))


def _lean_selector(expr: Expr) -> tuple[VectorSelector, bool] | None:
    """(selector, under ``absent``) when the query is a bare instant-vector selector or ``absent``
    of one, without @, offset or smoothing: the shapes :meth:`_Evaluator.instant_selector`
    answers from the grid read's columns, and :meth:`_Evaluator.range_selector` over a range. Not in parentheses: the general evaluation counts a
    parenthesised result as held twice (its peak, in the stats), and ``absent`` of a
    parenthesised selector reports no labels."""
    node: Node = expr
    absent = isinstance(node, Call) and node.func == "absent" and len(node.args) == 1
    if absent:
        assert isinstance(node, Call)
        node = node.args[0]
    if isinstance(node, VectorSelector) and node.at is None and node.offset is None and not node.smoothed:
        return node, absent
    return None


def _range_to_matrix(r: RangeInput) -> Matrix:
    out = []
    for i in range(len(r)):
        if i % _CHECK_EVERY == _CHECK_EVERY - 1:
            r.checkpoint()
        lo, hi = int(r.lo[i, 0]), int(r.hi[i, 0])
        labels = drop_name(r.labels[i]) if r.drop_name[i] else r.labels[i]
        if r.hist is not None:
            hlo, hhi = int(r.hist.lo[i, 0]), int(r.hist.hi[i, 0])
            if hi > lo or hhi > hlo:
                out.append(
                    Series(
                        labels,
                        r.ts[lo:hi].copy(),
                        r.vs[lo:hi].copy(),
                        r.hist.ts[hlo:hhi].copy(),
                        tuple(r.hist.hs[hlo:hhi]),
                    )
                )
        elif hi > lo:
            out.append(Series(labels, r.ts[lo:hi].copy(), r.vs[lo:hi].copy()))
    out.sort(key=lambda s: s.labels)
    return Matrix(tuple(out))
