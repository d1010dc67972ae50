"""The storage protocol the kql engine reads through, and an in-memory implementation of it.

Two back ends implement :class:`Storage`: the ClickHouse store of the collector and
:class:`MemoryStorage` here (tests, the promqltest runner). Every read takes its window and a
:class:`SelectHints` (what the engine will do with it, and the read budget); what a store can do
beyond ``select``, ``label_names`` and ``label_values`` it declares in ``capabilities``.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ParamSpec, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

from kernel_insight.kql.errors import KqlError, StorageError
from kernel_insight.kql.regex import RegexError, compile_anchored

if TYPE_CHECKING:
    from kernel_insight.kql.histogram import FloatHistogram
    from kernel_insight.kql.pushdown import GridColumns, SeriesColumns

__all__ = [
    "MATCH_OPS",
    "NO_HINTS",
    "STALE_NAN",
    "STALE_NAN_BITS",
    "Capability",
    "Labels",
    "Matcher",
    "MemoryStorage",
    "ReadBudget",
    "SelectHints",
    "SeriesData",
    "Storage",
    "StorageBase",
    "is_stale",
    "is_stale_histogram",
    "is_stale_value",
    "join_start_timestamps",
    "labels_match",
    "normalize_labels",
    "read_within",
]

#: The Prometheus staleness marker: a NaN with this exact bit pattern (``value.StaleNaN``).
STALE_NAN_BITS = 0x7FF0000000000002
STALE_NAN: float = float(np.array([STALE_NAN_BITS], dtype=np.uint64).view(np.float64)[0])

_DOUBLE = struct.Struct("<d")
_DOUBLE_BITS = struct.Struct("<Q")

#: Matcher operators, as PromQL writes them.
MATCH_OPS = ("=", "!=", "=~", "!~")

#: A label set: (name, value) pairs sorted by name, ``__name__`` included when present.
Labels = tuple[tuple[str, str], ...]


def is_stale(values: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
    """Elementwise: which values are staleness markers (not merely NaN)."""
    stale: npt.NDArray[np.bool_] = values.view(np.uint64) == np.uint64(STALE_NAN_BITS)
    return stale


def is_stale_value(value: float) -> bool:
    """Whether one float is the staleness marker."""
    return value != value and _bits(value) == STALE_NAN_BITS  # only a NaN can be one


def _bits(value: float) -> int:
    bits: int = _DOUBLE_BITS.unpack(_DOUBLE.pack(value))[0]
    return bits


@dataclass(frozen=True, slots=True)
class Matcher:
    """One label matcher: ``name op "value"``; a missing label matches as the empty string.

    >>> Matcher("gpu", "=~", "[01]").matches("1")
    True
    """

    name: str
    op: str  # one of "=", "!=", "=~", "!~"
    value: str

    def __post_init__(self) -> None:
        if self.op not in MATCH_OPS:
            raise ValueError(f"unknown matcher operator {self.op!r}")
        if self.op in ("=~", "!~"):
            try:
                compile_anchored(self.value)
            except RegexError as exc:
                raise ValueError(f"invalid regular expression {self.value!r}: {exc}") from None

    def matches(self, value: str) -> bool:
        """Whether a label value (``""`` when the label is absent) satisfies this matcher."""
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        hit = compile_anchored(self.value).matches(value)
        return hit if self.op == "=~" else not hit

    def matches_empty(self) -> bool:
        """Whether this matcher accepts series that lack the label altogether."""
        return self.matches("")


def labels_match(labels: Labels | Mapping[str, str], matchers: Sequence[Matcher]) -> bool:
    """Whether a label set satisfies every matcher."""
    lookup = labels if isinstance(labels, Mapping) else dict(labels)
    return all(m.matches(lookup.get(m.name, "")) for m in matchers)


def is_stale_histogram(h: FloatHistogram) -> bool:
    """Whether a histogram sample is a staleness marker (its sum is the StaleNaN bit pattern, as in Prometheus)."""
    return is_stale_value(h.sum)


def _no_times() -> npt.NDArray[np.int64]:
    return np.empty(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class SeriesData:
    """One series as storage returns it: sorted labels plus samples in time order.

    A series may hold float samples, native-histogram samples or both (a metric that changed
    type); the two kinds are kept apart, each ascending in time, never at the same timestamp.
    """

    labels: Labels  # sorted, includes ("__name__", ...)
    timestamps: npt.NDArray[np.int64]  # ms, ascending
    values: npt.NDArray[np.float64]  # stale markers are the StaleNaN bit pattern 0x7ff0000000000002
    hist_timestamps: npt.NDArray[np.int64] = field(default_factory=_no_times)  # ms, ascending
    histograms: tuple[FloatHistogram, ...] = ()  # one per hist_timestamps entry
    #: Start timestamps (ms, 0 = unset) of the float samples and of the histograms, position for
    #: position; None when the series has none (the usual case: nothing is carried or looked at).
    start_timestamps: npt.NDArray[np.int64] | None = None
    hist_start_timestamps: npt.NDArray[np.int64] | None = None

    def window(self, start_ms: int, end_ms: int) -> SeriesData | None:
        """The samples of both kinds with ``start_ms <= t <= end_ms`` (None when there are none)."""
        a = int(np.searchsorted(self.timestamps, start_ms, side="left"))
        b = int(np.searchsorted(self.timestamps, end_ms, side="right"))
        st, hst = self.start_timestamps, self.hist_start_timestamps
        if not self.histograms:
            if b <= a:
                return None
            return SeriesData(
                self.labels,
                self.timestamps[a:b],
                self.values[a:b],
                start_timestamps=None if st is None else st[a:b],
            )
        ha = int(np.searchsorted(self.hist_timestamps, start_ms, side="left"))
        hb = int(np.searchsorted(self.hist_timestamps, end_ms, side="right"))
        if b <= a and hb <= ha:
            return None
        return SeriesData(
            self.labels,
            self.timestamps[a:b],
            self.values[a:b],
            self.hist_timestamps[ha:hb],
            self.histograms[ha:hb],
            None if st is None else st[a:b],
            None if hst is None else hst[ha:hb],
        )


@dataclass(frozen=True, slots=True)
class ReadBudget:
    """What the running query may still spend on one storage read (:attr:`SelectHints.budget`).

    A back end that can bound a read (the ClickHouse one: by the statement's own time and row
    limits) raises :class:`~kernel_insight.kql.errors.QueryTimeoutError` or
    :class:`~kernel_insight.kql.errors.TooManySamplesError` itself instead of returning more.
    """

    deadline: float  # time.monotonic() value at which the query times out
    timeout_s: float  # the query's whole timeout, for the message
    max_samples: int  # samples the read may return before the query is over its sample limit


@dataclass(frozen=True, slots=True)
class SelectHints:
    """What the engine tells the store about one read, in the shape of Prometheus'
    ``storage.SelectHints``; the window is the read's own ``start_ms``/``end_ms`` arguments
    (Prometheus' ``Start``/``End``), and the deadline travels in ``budget`` (Prometheus' ``ctx``).

    A store may ignore every hint but ``budget`` (which it should honour when it can) and
    ``start_timestamps`` (which says whether to return start timestamps at all).

    >>> SelectHints(step_ms=60_000, func="rate", range_ms=300_000).func
    'rate'
    """

    step_ms: int = 0  # the grid step of a grid read, else the query's step (0: an instant query)
    func: str = ""  # the function or aggregation around the selector ("" under a binary operator)
    range_ms: int = 0  # the range of a matrix selector (0 for an instant-vector selector)
    grouping: tuple[str, ...] = ()  # the labels of the aggregation directly around the selector
    by: bool = False  # True for ``by (grouping)``, False for ``without (grouping)``
    budget: ReadBudget | None = None  # what the read may spend; None outside a query
    #: Whether the read is for a function that reads start timestamps (``FunctionSpec.start_timestamps``:
    #: rate, increase, ... directly over the selector, as Prometheus' ``UseStartTimestamps``; a
    #: subquery cuts them): a back end returns start timestamps (``SeriesData.start_timestamps``)
    #: then only, and only for series that have some, so every other read carries none.
    start_timestamps: bool = False


#: The hints of a read outside a query: no budget, no start timestamps.
NO_HINTS = SelectHints()


class Capability(enum.Enum):
    """What a store can do beyond ``select``, ``label_names`` and ``label_values``, declared in
    its ``capabilities``; the engine calls the matching :class:`Storage` method only then."""

    #: ``select_columns``: the selection as one block (:class:`~kernel_insight.kql.pushdown.SeriesColumns`).
    COLUMNS = "columns"
    #: ``select_last_on_grid``: an instant-vector selector's latest sample at every step of a grid.
    LAST_ON_GRID = "last_on_grid"
    #: ``select_range_on_grid``: ``func(selector[range])`` at every step of a grid, for the
    #: functions whose spec carries a :class:`~kernel_insight.kql.functions.GridPushdown`.
    RANGE_ON_GRID = "range_on_grid"
    #: ``head_covers``: reads from some time on are answered from memory (a head), so a caller
    #: may share them between queries of one evaluation (rules/prefetch.py).
    HEAD = "head"


_T = TypeVar("_T")
_P = ParamSpec("_P")


def read_within(what: str, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Call a storage read; its failures become StorageError.

    kql's own errors (the budget's timeout and sample limit) pass as they are; any other
    failure is wrapped as ``"<what>: <message>"``, and a retryable one stays retryable (read
    from the cause). The engine's reads and the API's series and label listings share it.
    """
    try:
        return fn(*args, **kwargs)
    except StorageError as exc:
        raise StorageError(f"{what}: {exc}") from exc
    except KqlError:
        raise
    except Exception as exc:
        raise StorageError(f"{what}: {exc}") from exc


@runtime_checkable
class Storage(Protocol):
    """What the engine needs from a store. All bounds are inclusive milliseconds since the epoch.

    ``select``, ``label_names`` and ``label_values`` every store answers; the other methods
    only a store whose ``capabilities`` name them (:class:`StorageBase` refuses them).
    """

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What the store does beyond the three reads every store answers."""
        ...

    def select(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> list[SeriesData]:
        """Series matching every matcher, with their samples where ``start_ms <= t <= end_ms``.

        A series with no sample in the window may be returned with empty arrays or left out.
        """
        ...

    def label_names(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> list[str]:
        """Sorted label names of the matching series (all series when ``matchers`` is empty)."""
        ...

    def label_values(
        self,
        name: str,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        hints: SelectHints = NO_HINTS,
    ) -> list[str]:
        """Sorted distinct values of label ``name`` among the matching series."""
        ...

    def select_columns(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> SeriesColumns:
        """:attr:`Capability.COLUMNS`: what ``select`` returns, as one block of arrays."""
        ...

    def select_last_on_grid(
        self,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        hints: SelectHints,
        lookback_ms: int,
        sample_times: bool = True,
    ) -> GridColumns | None:
        """:attr:`Capability.LAST_ON_GRID`: the latest sample per series at ``start, start + step,
        ... <= end`` (``step`` is ``hints.step_ms``) within ``(t - lookback, t]``.

        With ``sample_times=False`` the store may leave ``sample_ts`` as None. ``None`` when the
        store cannot answer this grid (the engine then reads raw samples).
        """
        ...

    def select_range_on_grid(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints
    ) -> tuple[GridColumns, int] | None:
        """:attr:`Capability.RANGE_ON_GRID`: ``hints.func`` over ``(t - hints.range_ms, t]`` at
        every grid time ``start, start + hints.step_ms, ... <= end``, and how many samples to
        account for.

        ``values`` hold the function's result where ``present``; ``sample_ts`` is unused. The
        count feeds the engine's sample limit and statistics; a store that cannot count window
        samples cheaply may count computed values instead. ``None`` when the store cannot
        compute this function or grid.
        """
        ...

    def head_covers(self, start_ms: int) -> bool:
        """:attr:`Capability.HEAD`: whether reads from ``start_ms`` on are answered from memory."""
        ...


class StorageBase:
    """A :class:`Storage` that declares no capability: its optional methods refuse to run.

    A store subclasses it, implements the three reads and whatever its ``capabilities`` name.
    """

    capabilities: frozenset[Capability] = frozenset()

    def _undeclared(self, capability: Capability) -> NotImplementedError:
        return NotImplementedError(f"{type(self).__name__} does not declare {capability}")

    def select_columns(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> SeriesColumns:
        raise self._undeclared(Capability.COLUMNS)

    def select_last_on_grid(
        self,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        hints: SelectHints,
        lookback_ms: int,
        sample_times: bool = True,
    ) -> GridColumns | None:
        raise self._undeclared(Capability.LAST_ON_GRID)

    def select_range_on_grid(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints
    ) -> tuple[GridColumns, int] | None:
        raise self._undeclared(Capability.RANGE_ON_GRID)

    def head_covers(self, start_ms: int) -> bool:
        raise self._undeclared(Capability.HEAD)


_FloatArrays = tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.int64] | None]
_HistArrays = tuple[npt.NDArray[np.int64], "tuple[FloatHistogram, ...]", npt.NDArray[np.int64] | None]


def tsdb_hints(
    hs: Sequence[FloatHistogram],
    hts: npt.NDArray[np.int64],
    float_ts: npt.NDArray[np.int64],
    resets: Sequence[bool | None] | None = None,
    *,
    in_place: bool = False,
) -> tuple[FloatHistogram, ...]:
    """Counter-reset hints as Prometheus' TSDB returns them on read: a counter histogram that
    follows another in the same chunk says "not a counter reset"; one that starts a chunk (a
    series' first sample, the first after a float sample, or one whose counter went down or that
    was written as a reset) says "unknown", as Go's ``counterResetHint`` reads a chunk's first
    sample; gauge histograms stay gauges.

    ``resets[i]``, when given and not None, is ``hs[i].detect_reset(hs[i - 1])`` computed by the
    caller (the ClickHouse back end does it for whole columns at once); ``in_place`` sets the
    hints on the given objects instead of copies (for a caller that just made them)."""
    out: list[FloatHistogram] = []
    prev: FloatHistogram | None = None
    prev_t = -(2**63)
    floats = float_ts.tolist()
    k = 0
    for i, (h, t) in enumerate(zip(hs, hts.tolist(), strict=True)):
        while k < len(floats) and floats[k] < t:
            if floats[k] > prev_t:
                prev = None  # a float sample between two histograms starts a new chunk
            k += 1
        hint = wanted = h.counter_reset_hint
        if hint != 3 and prev is not None and prev.counter_reset_hint != 3 and not is_stale_histogram(h):
            known = None if resets is None else resets[i]
            wanted = 0 if (hint == 1 or (h.detect_reset(prev) if known is None else known)) else 2
        elif hint == 1 or (hint == 2 and i > 0):
            wanted = 0  # (a series' first sample keeps a stated "not a reset", as a store's window read does)
        if wanted != hint:
            if not in_place:
                h = h.copy()
            h.counter_reset_hint = wanted
        out.append(h)
        prev = None if is_stale_histogram(h) else h
        prev_t = t
    return tuple(out)


class _MemSeries:
    __slots__ = ("_sorted", "hs", "hsts", "hts", "labels", "sts", "ts", "vs")

    def __init__(self, labels: Labels) -> None:
        self.labels = labels
        self.ts: list[int] = []
        self.vs: list[float] = []
        self.sts: list[int] = []  # start timestamps of the floats, 0 = unset
        self.hts: list[int] = []
        self.hs: list[FloatHistogram] = []
        self.hsts: list[int] = []
        self._sorted: tuple[_FloatArrays, _HistArrays] | None = None

    def arrays(self) -> tuple[_FloatArrays, _HistArrays]:
        """Floats and histograms, each sorted by time; at a timestamp both kinds hold, the histogram
        wins. Each kind's start timestamps come with it, None when none is set."""
        if self._sorted is None:
            ts = np.asarray(self.ts, dtype=np.int64)
            vs = np.asarray(self.vs, dtype=np.float64)
            sts = np.asarray(self.sts, dtype=np.int64)
            order = np.argsort(ts, kind="stable")
            ts, vs, sts = ts[order], vs[order], sts[order]
            # A later write at the same timestamp replaces the earlier one.
            if len(ts) > 1:
                keep = np.append(ts[1:] != ts[:-1], True)
                ts, vs, sts = ts[keep], vs[keep], sts[keep]
            hts = np.asarray(self.hts, dtype=np.int64)
            hsts = np.asarray(self.hsts, dtype=np.int64)
            horder = np.argsort(hts, kind="stable")
            hts, hsts = hts[horder], hsts[horder]
            hs = [self.hs[i] for i in horder.tolist()]
            if len(hts) > 1:
                hkeep = np.append(hts[1:] != hts[:-1], True)
                hs = [h for h, k in zip(hs, hkeep.tolist(), strict=True) if k]
                hts, hsts = hts[hkeep], hsts[hkeep]
            if len(hts) and len(ts):
                clash = np.isin(ts, hts)
                ts, vs, sts = ts[~clash], vs[~clash], sts[~clash]
            self._sorted = (
                (ts, vs, sts if sts.any() else None),
                (hts, tsdb_hints(hs, hts, ts), hsts if hsts.any() else None),
            )
        return self._sorted


def join_start_timestamps(
    parts: Sequence[tuple[npt.NDArray[np.int64] | None, int]],
) -> npt.NDArray[np.int64] | None:
    """Start timestamps of joined runs of samples: ``(starts or None, samples)`` per run, zeros
    (unset) where a run has none; None when no run has any, so the usual case carries nothing."""
    if all(st is None for st, _ in parts):
        return None
    return np.concatenate([np.zeros(n, np.int64) if st is None else st for st, n in parts]).astype(
        np.int64, copy=False
    )


def _extend_starts(into: list[int], starts: Iterable[int] | None, want: int) -> None:
    """Start timestamps appended beside samples just appended (zeros, unset, when not given)."""
    if starts is None:
        into.extend([0] * (want - len(into)))
        return
    into.extend(int(s) for s in starts)
    if len(into) != want:
        raise ValueError("start timestamps and timestamps differ in length")


def normalize_labels(labels: Mapping[str, str] | Iterable[tuple[str, str]]) -> Labels:
    """Sorted label tuple without empty values (an empty label value means "no label")."""
    items = labels.items() if isinstance(labels, Mapping) else labels
    return tuple(sorted((k, v) for k, v in items if v != ""))


class MemoryStorage(StorageBase):
    """An in-memory :class:`Storage`, for tests and the promqltest runner.

    >>> s = MemoryStorage()
    >>> s.add({"__name__": "up", "gpu": "0"}, [0, 15_000], [1.0, 1.0])
    >>> [d.labels for d in s.select([Matcher("__name__", "=", "up")], 0, 10_000)]
    [(('__name__', 'up'), ('gpu', '0'))]
    """

    def __init__(self) -> None:
        self._series: dict[Labels, _MemSeries] = {}
        self._by_name: dict[str, list[_MemSeries]] = {}

    def add(
        self,
        labels: Mapping[str, str] | Iterable[tuple[str, str]],
        timestamps: Iterable[int],
        values: Iterable[float],
        start_timestamps: Iterable[int] | None = None,
    ) -> None:
        """Append samples to a series (created on first use); order of appends does not matter.
        ``start_timestamps``: each sample's (ms, 0 = unset), as remote_write 2.0 sends them."""
        series = self._series_for(labels)
        series.ts.extend(int(t) for t in timestamps)
        series.vs.extend(float(v) for v in values)
        _extend_starts(series.sts, start_timestamps, len(series.ts))
        if len(series.ts) != len(series.vs):
            raise ValueError("timestamps and values differ in length")
        series._sorted = None

    def add_histograms(
        self,
        labels: Mapping[str, str] | Iterable[tuple[str, str]],
        timestamps: Iterable[int],
        histograms: Iterable[FloatHistogram],
        start_timestamps: Iterable[int] | None = None,
    ) -> None:
        """Append native-histogram samples to a series (created on first use), as :meth:`add` does floats."""
        series = self._series_for(labels)
        series.hts.extend(int(t) for t in timestamps)
        series.hs.extend(histograms)
        _extend_starts(series.hsts, start_timestamps, len(series.hts))
        if len(series.hts) != len(series.hs):
            raise ValueError("timestamps and histograms differ in length")
        series._sorted = None

    def _series_for(self, labels: Mapping[str, str] | Iterable[tuple[str, str]]) -> _MemSeries:
        key = normalize_labels(labels)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _MemSeries(key)
            self._by_name.setdefault(dict(key).get("__name__", ""), []).append(series)
        return series

    def clear(self) -> None:
        """Drop every series."""
        self._series.clear()
        self._by_name.clear()

    def __len__(self) -> int:
        return len(self._series)

    def _matching(self, matchers: Sequence[Matcher]) -> list[_MemSeries]:
        names = [m.value for m in matchers if m.name == "__name__" and m.op == "="]
        candidates = self._by_name.get(names[0], []) if names else self._series.values()
        return [s for s in candidates if labels_match(s.labels, matchers)]

    def select(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> list[SeriesData]:
        out = []
        wanted = hints.start_timestamps
        for series in self._matching(matchers):
            (ts, vs, sts), (hts, hs, hsts) = series.arrays()
            if not wanted:
                sts = hsts = None
            lo = int(np.searchsorted(ts, start_ms, side="left"))
            hi = int(np.searchsorted(ts, end_ms, side="right"))
            if not len(hts):
                if hi > lo:
                    out.append(
                        SeriesData(
                            series.labels,
                            ts[lo:hi],
                            vs[lo:hi],
                            start_timestamps=None if sts is None else sts[lo:hi],
                        )
                    )
                continue
            hlo = int(np.searchsorted(hts, start_ms, side="left"))
            hhi = int(np.searchsorted(hts, end_ms, side="right"))
            if hi > lo or hhi > hlo:
                out.append(
                    SeriesData(
                        series.labels,
                        ts[lo:hi],
                        vs[lo:hi],
                        hts[hlo:hhi],
                        hs[hlo:hhi],
                        None if sts is None else sts[lo:hi],
                        None if hsts is None else hsts[hlo:hhi],
                    )
                )
        out.sort(key=lambda d: d.labels)
        return out

    def _in_window(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[Labels]:
        return [d.labels for d in self.select(matchers, start_ms, end_ms)]

    def label_names(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> list[str]:
        return sorted({k for labels in self._in_window(matchers, start_ms, end_ms) for k, _ in labels})

    def label_values(
        self,
        name: str,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        hints: SelectHints = NO_HINTS,
    ) -> list[str]:
        values = {dict(labels).get(name, "") for labels in self._in_window(matchers, start_ms, end_ms)}
        values.discard("")
        return sorted(values)
