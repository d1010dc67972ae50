"""One storage read per metric per group evaluation, instead of one per rule.

A group of a hundred rules over a handful of metrics would otherwise send the store a
hundred queries every interval, each finding and decompressing the same granules. Before a
group runs, :func:`read_windows` works out from the rules' syntax trees how far back each
metric is read; :class:`CycleStorage` then reads each metric's series once, over that window
(on first use), and answers the rules' selects from memory. A select it cannot answer
exactly from what it holds (another metric, a wider window, a name given by regex) goes to
the store, so the answer is always the store's. What the group itself writes (recorded
series, ALERTS) is added to what is held as it is written (:meth:`CycleStorage.absorb`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kernel_insight.kql.ast import Call, MatrixSelector, NumberLiteral, SubqueryExpr, VectorSelector
from kernel_insight.kql.histogram import FloatHistogram
from kernel_insight.kql.pushdown import GridColumns, SeriesColumns, columns_of
from kernel_insight.kql.storage import (
    NO_HINTS,
    Capability,
    Labels,
    Matcher,
    SelectHints,
    SeriesData,
    Storage,
    StorageBase,
    labels_match,
)

__all__ = ["CycleStorage", "read_windows", "served_from_memory"]

#: Metrics whose windows are at most this long are read together, with the longest of them.
MERGE_WINDOW_MS = 30 * 60_000
#: Metric names that need no escaping in a regex alternation.
_PLAIN = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _seconds(expr: Any) -> float | None:
    if expr is None:
        return 0.0
    if isinstance(expr, NumberLiteral) and expr.value >= 0:
        return float(expr.value)
    return None  # a computed or negative duration: not bounded here


def _walk(node: Any, extra_ms: int, lookback_ms: int, out: dict[str, int]) -> None:
    if isinstance(node, (VectorSelector, MatrixSelector)):
        vs = node.vector if isinstance(node, MatrixSelector) else node
        offset = _seconds(vs.offset)
        rng = _seconds(node.range) if isinstance(node, MatrixSelector) else 0.0
        if vs.name is None or vs.at is not None or offset is None or rng is None:
            return
        window = extra_ms + int((offset + rng) * 1000) + lookback_ms
        out[vs.name] = max(out.get(vs.name, 0), window)
        return
    if isinstance(node, SubqueryExpr):
        offset, rng = _seconds(node.offset), _seconds(node.range)
        if node.at is not None or offset is None or rng is None:
            return
        _walk(node.expr, extra_ms + int((offset + rng) * 1000), lookback_ms, out)
        return
    if dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            for child in value if isinstance(value, tuple) else (value,):
                if dataclasses.is_dataclass(child):
                    _walk(child, extra_ms, lookback_ms, out)


def served_from_memory(expr: Any) -> bool:
    """Whether every read of ``expr`` is one :class:`CycleStorage` answers from what it holds
    (named selectors, literal non-negative ranges and offsets, no ``@``), so a write the group
    has not sent to the store yet can be shown to it by :meth:`CycleStorage.absorb` alone."""
    if isinstance(expr, (VectorSelector, MatrixSelector)):
        vs = expr.vector if isinstance(expr, MatrixSelector) else expr
        names = [m for m in vs.all_matchers() if m.name == "__name__" and m.op == "="]
        rng = _seconds(expr.range) if isinstance(expr, MatrixSelector) else 0.0
        return bool(names) and vs.at is None and _seconds(vs.offset) is not None and rng is not None
    if isinstance(expr, SubqueryExpr) and (
        expr.at is not None or _seconds(expr.offset) is None or _seconds(expr.range) is None
    ):
        return False
    if isinstance(expr, Call) and expr.func == "info":
        return False  # reads target_info by a matcher set of its own
    if dataclasses.is_dataclass(expr):
        for f in dataclasses.fields(expr):
            value = getattr(expr, f.name)
            for child in value if isinstance(value, tuple) else (value,):
                if dataclasses.is_dataclass(child) and not served_from_memory(child):
                    return False
    return True


def read_windows(exprs: Iterable[Any], lookback_ms: int = 300_000) -> dict[str, int]:
    """Metric name -> how many ms before the evaluation time the queries read it (lookback included)."""
    out: dict[str, int] = {}
    for e in exprs:
        _walk(e, 0, lookback_ms, out)
    return out


class _Held:
    """One metric's series over the window, with an index of label pairs for ``=`` matchers."""

    def __init__(self, lo: int, series: list[SeriesData]) -> None:
        self.lo = lo
        self.series = series
        self._index: dict[tuple[str, str], list[int]] | None = None
        self._by_labels: dict[Labels, int] | None = None

    def index(self) -> dict[tuple[str, str], list[int]]:
        if self._index is None:
            index: dict[tuple[str, str], list[int]] = {}
            for i, s in enumerate(self.series):
                for pair in s.labels:
                    index.setdefault(pair, []).append(i)
            self._index = index
        return self._index

    def candidates(self, matchers: Sequence[Matcher]) -> Iterable[int]:
        eq = [(m.name, m.value) for m in matchers if m.op == "=" and m.value != ""]
        if not eq:
            return range(len(self.series))
        index = self.index()
        lists = sorted((index.get(pair, []) for pair in eq), key=len)
        if len(lists) == 1:
            return lists[0]
        rest = [set(x) for x in lists[1:]]
        return [i for i in lists[0] if all(i in r for r in rest)]

    def absorb(self, labels: Labels, ts: int, value: float | FloatHistogram) -> None:
        """Add a sample this process just wrote (the group's own output): a float or a native
        histogram, which replaces a sample of either kind at the same time (as the store reads)."""
        if self._by_labels is None:
            self._by_labels = {s.labels: i for i, s in enumerate(self.series)}
        i = self._by_labels.get(labels)
        if i is None:
            self._by_labels[labels] = len(self.series)
            self.series.append(SeriesData(labels, np.empty(0, np.int64), np.empty(0, np.float64)))
            self._index = None
            i = len(self.series) - 1
        s = self.series[i]
        t, v, ht, hs = s.timestamps, s.values, s.hist_timestamps, list(s.histograms)
        if isinstance(value, float):
            t, v = _placed(t, v, ts, value)
            keep = ht != ts
            ht, hs = ht[keep], [h for h, k in zip(hs, keep.tolist(), strict=True) if k]
        else:
            order = np.arange(len(hs) + 1)
            ht, order = _placed(ht, order, ts, len(hs))
            hs = [value if k == len(hs) else hs[k] for k in order.tolist()]
            keep = t != ts
            t, v = t[keep], v[keep]
        self.series[i] = SeriesData(labels, t, v, ht, tuple(hs))


def _placed(t: npt.NDArray[np.int64], v: npt.NDArray[Any], ts: int, value: Any) -> tuple[Any, Any]:
    """Times and values with ``(ts, value)`` added in time order, replacing a value at ``ts``."""
    t2 = np.append(t, np.int64(ts))
    v2 = np.append(v, np.asarray([value], dtype=v.dtype))
    if len(t) and ts <= int(t[-1]):
        order = np.argsort(t2, kind="stable")
        t2, v2 = t2[order], v2[order]
        keep = np.append(t2[1:] != t2[:-1], True)  # a later write at the same time replaces
        t2, v2 = t2[keep], v2[keep]
    return t2, v2


class CycleStorage(StorageBase):
    """The store as one evaluation at ``ts_ms`` sees it, each metric of ``windows`` read once.

    When the store answers the window from its head (collector/head.py: postings and recent
    samples in memory, ``head_covers``), a metric's series are not copied into per-series Python
    objects: each distinct read (selector, window; the instant selectors' newest samples) goes
    to the head once per evaluation, and the rules that ask it again get the same columns. A
    metric the group itself has written this evaluation is read as above, from what is held.
    """

    #: Its grid read answers one time from the store's head, or declines (:meth:`select_last_on_grid`).
    capabilities = frozenset({Capability.COLUMNS, Capability.LAST_ON_GRID})

    def __init__(self, inner: Storage, ts_ms: int, windows: dict[str, int]) -> None:
        self.inner = inner
        self.ts_ms = ts_ms
        self.windows = windows
        self._held: dict[str, _Held] = {}
        self.reads = 0
        #: Reads answered by the store's head, by (selector, window, ...): this evaluation's.
        self._shared: dict[tuple[Any, ...], Any] = {}
        self._written: set[str] = set()  # metrics the group wrote this evaluation
        self.shared_reads = 0  # reads that went to the store's head (each distinct one once)

    def _direct(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> bool:
        """Whether a read goes straight to the store's head (shared by the group's rules): the
        head covers its window, and it cannot select a metric the group wrote this evaluation
        (those are held: the writer may not have sent them to the store yet)."""
        if (
            Capability.HEAD not in self.inner.capabilities
            or end_ms > self.ts_ms
            or not self._not_written(matchers)
        ):
            return False
        return self.inner.head_covers(start_ms)

    def _not_written(self, matchers: Sequence[Matcher]) -> bool:
        if not self._written:
            return True
        names = [m.value for m in matchers if m.name == "__name__" and m.op == "="]
        return bool(names) and names[0] not in self._written

    def _shared_read(self, key: tuple[Any, ...], read: Any, *args: Any) -> Any:
        if key not in self._shared:
            self.shared_reads += 1
            self._shared[key] = read(*args)
        return self._shared[key]

    def select_columns(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> SeriesColumns:
        if self._direct(matchers, start_ms, end_ms) and Capability.COLUMNS in self.inner.capabilities:
            # The budget of the rule that reads it first bounds the shared read.
            key = ("cols", tuple(matchers), start_ms, end_ms, hints.start_timestamps)
            cols: SeriesColumns = self._shared_read(
                key, self.inner.select_columns, matchers, start_ms, end_ms, hints
            )
            return cols
        return columns_of(self.select(matchers, start_ms, end_ms, hints))

    def select_last_on_grid(
        self,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        hints: SelectHints,
        lookback_ms: int,
        sample_times: bool = True,
    ) -> GridColumns | None:
        """The store's instant-selector read when it comes from the head (shared as above);
        otherwise None: the engine reads the window through :meth:`select_columns`."""
        if (
            start_ms != end_ms
            or Capability.LAST_ON_GRID not in self.inner.capabilities
            or not self._direct(matchers, start_ms - lookback_ms + 1, end_ms)
        ):
            return None
        key = ("last", tuple(matchers), end_ms, lookback_ms, sample_times, hints.start_timestamps)
        grid: GridColumns | None = self._shared_read(
            key, self.inner.select_last_on_grid, matchers, start_ms, end_ms, hints, lookback_ms, sample_times
        )
        return grid

    def absorb(
        self, samples: Iterable[tuple[Labels, int, float | FloatHistogram]], *, load: bool = False
    ) -> None:
        """Samples the group wrote (or is about to write) to the store: added to what is held of
        their metrics, so the rules after see them without a read (only the group's evaluator
        writes its output). ``load``: read a metric of the windows first if not held yet (the
        samples are not in the store yet, so a later read would miss them)."""
        for labels, ts, value in samples:
            name = next((v for k, v in labels if k == "__name__"), "")
            if name not in self._written:
                self._written.add(name)
                self._shared.clear()  # a shared read may hold the metric's samples before this write
            if load and name in self.windows and name not in self._held:
                self._series(name)
            held = self._held.get(name)
            if held is not None and held.lo <= ts <= self.ts_ms:
                held.absorb(labels, ts, value)

    def _series(self, name: str, hints: SelectHints = NO_HINTS) -> _Held:
        """The metric's series over its window (read now when not held yet, under ``hints``'
        budget: the first rule that reads it)."""
        held = self._held.get(name)
        if held is not None:
            return held
        window = self.windows[name]

        # Every metric not yet read that needs the same window (or, for short windows, any
        # window up to MERGE_WINDOW_MS) comes in the same read: one query instead of one per
        # metric, at the price of a few more minutes of samples for some of them.
        def together(w: int) -> bool:
            return w == window or (w <= MERGE_WINDOW_MS and window <= MERGE_WINDOW_MS)

        names = [name]
        if _PLAIN.fullmatch(name):
            names += [
                n
                for n, w in self.windows.items()
                if together(w) and n != name and n not in self._held and _PLAIN.fullmatch(n)
            ]
        lo = self.ts_ms - max(self.windows[n] for n in names)
        self.reads += 1
        # What is held answers every later select, rate's too: read with start timestamps (a
        # back end returns them for series that have some only; other functions ignore them).
        hints = SelectHints(budget=hints.budget, start_timestamps=True)  # read for every rule
        if len(names) == 1:
            self._held[name] = _Held(
                lo, self.inner.select([Matcher("__name__", "=", name)], lo, self.ts_ms, hints)
            )
        else:
            by_name: dict[str, list[SeriesData]] = {n: [] for n in names}
            for data in self.inner.select(
                [Matcher("__name__", "=~", "|".join(names))], lo, self.ts_ms, hints
            ):
                by_name[dict(data.labels)["__name__"]].append(data)
            for n, series in by_name.items():
                self._held[n] = _Held(lo, series)
        return self._held[name]

    def select(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> list[SeriesData]:
        names = [m.value for m in matchers if m.name == "__name__" and m.op == "="]
        if len(names) == 1 and names[0] in self.windows and end_ms <= self.ts_ms:
            held = self._series(names[0], hints)
            if start_ms >= held.lo:
                rest = [m for m in matchers if not (m.name == "__name__" and m.op == "=")]
                out = []
                for i in held.candidates(rest):
                    s = held.series[i]
                    if rest and not labels_match(s.labels, rest):
                        continue
                    part = s.window(start_ms, end_ms)  # floats and native histograms
                    if part is not None:
                        out.append(part)
                out.sort(key=lambda d: d.labels)
                return out
        return self.inner.select(matchers, start_ms, end_ms, hints)

    def label_names(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> list[str]:
        return self.inner.label_names(matchers, start_ms, end_ms, hints)

    def label_values(
        self,
        name: str,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        hints: SelectHints = NO_HINTS,
    ) -> list[str]:
        return self.inner.label_values(name, matchers, start_ms, end_ms, hints)
