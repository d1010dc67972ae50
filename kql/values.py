"""Values: the engine's internal step-wise forms and the typed results queries return.

Inside the engine an instant vector is evaluated at every step at once (a :class:`StepVector`:
one row per series, one column per step, with a presence mask) and a range vector is a
:class:`RangeInput` (every series' samples plus the window of each step). Queries return
:class:`Vector`, :class:`Matrix`, :class:`Scalar` or :class:`String` inside a
:class:`QueryResult`, which :func:`to_prometheus_json` turns into the HTTP API's ``data``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt
import orjson

from kernel_insight.kql import _windows
from kernel_insight.kql.ast import PosRange
from kernel_insight.kql.gocompat import go_float_fixed
from kernel_insight.kql.lexical import go_quote
from kernel_insight.kql.sparsehists import HistSamples, SparseHists
from kernel_insight.kql.storage import Labels

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kernel_insight.kql.ast import Call, Expr, Node, VectorSelector
    from kernel_insight.kql.engine import _Evaluator as Evaluator
    from kernel_insight.kql.histcells import Hists
    from kernel_insight.kql.histogram import FloatHistogram
    from kernel_insight.kql.storage import Matcher

__all__ = [
    "Annotation",
    "Arg",
    "CallContext",
    "HistRange",
    "Matrix",
    "Operand",
    "Param",
    "QueryResult",
    "QueryStats",
    "RangeInput",
    "Sample",
    "Scalar",
    "Series",
    "StepVector",
    "String",
    "Value",
    "Vector",
    "almost_equal",
    "almost_equal_array",
    "as_operand",
    "as_range",
    "as_scalar",
    "as_string",
    "as_vector",
    "format_json_float",
    "format_sample_value",
    "labels_to_str",
    "prometheus_json_bytes",
    "to_prometheus_json",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
BOOL = npt.NDArray[np.bool_]
OBJ = npt.NDArray[np.object_]
_T = TypeVar("_T")

#: What an expression evaluates to at every step: an instant vector, a range vector, a scalar
#: (one float per step) or a string.
Value: TypeAlias = "StepVector | RangeInput | F64 | str"
#: A binary operator's operand: an instant vector or a scalar per step.
Operand: TypeAlias = "StepVector | F64"
#: A function's argument: its value, or the expression itself for the arguments a function reads
#: unevaluated (``FunctionSpec.unevaluated``: absent's selector, for one).
Arg: TypeAlias = "Value | Expr"
#: An aggregation's parameter as evaluated: a scalar per step (topk, quantile, ...), a label name
#: (count_values), or None (the aggregations without one).
Param: TypeAlias = "F64 | str | None"


def hist_mask(hists: OBJ) -> BOOL:
    """Which cells of an object array hold a histogram (not None)."""
    if hists.size == 0:
        return np.zeros(hists.shape, dtype=bool)
    # Truth in C: None is false, a histogram (no __len__ or __bool__) is true.
    mask: BOOL = hists.astype(bool)
    return mask


def hist_weight(hists: OBJ) -> int:
    """Samples the histograms of an object array count as toward ``max_samples`` (None cells
    count nothing): each its :meth:`FloatHistogram.sample_weight`, as Prometheus counts them."""
    flat = hists.ravel()
    return sum(h.sample_weight() for h in flat[flat.astype(bool)]) if flat.size else 0


#: Labels dropped together with the metric name (Prometheus type-and-unit metadata).
NAME_LABELS = ("__name__", "__type__", "__unit__")


def drop_name(labels: Labels) -> Labels:
    """The label set without ``__name__`` (and the ``__type__``/``__unit__`` metadata that goes with it)."""
    # Sorted labels that start with the name and go on past "__unit__" hold no metadata: a slice.
    if labels and labels[0][0] == "__name__" and (len(labels) == 1 or labels[1][0] > "__unit__"):
        return labels[1:]
    return tuple(p for p in labels if p[0] not in NAME_LABELS)


def labels_to_str(labels: Labels) -> str:
    """Prometheus' ``labels.String()``: ``{__name__="up", job="a"}``."""
    from kernel_insight.kql.lexical import go_quote

    return "{" + ", ".join(f"{k}={go_quote(v)}" for k, v in labels) + "}"


# ------------------------------------------------------------------------------ internal forms


def _no_checkpoint() -> None:
    pass


@dataclass(slots=True)
class StepVector:
    """An instant vector at every step: ``values[i, j]`` is series ``i`` at step ``j`` if ``present[i, j]``.

    Rows may share labels as long as they are never present at the same step (a series that
    changes provenance over time); ``drop_name[i]`` marks rows whose metric name is removed
    when the result is returned (Prometheus' delayed name removal). ``sample_ts`` holds the
    sample timestamps for rows that come straight from a selector (``timestamp()`` needs them).

    Native histograms live beside the floats: ``hists`` holds the histogram cells
    (:class:`kernel_insight.kql.histcells.Hists`: objects, dense blocks or a store's columns,
    one interface for all), ``present`` covers float samples only, and a cell is never both.
    ``hists`` is None when the vector holds no histogram at all, so float queries never look at
    it, and code written for floats drops histogram samples (as Prometheus' float-only
    functions do) instead of misreading them.
    """

    labels: list[Labels]
    values: F64
    present: BOOL
    drop_name: BOOL
    sample_ts: I64 | None = None
    hists: Hists | None = None

    @property
    def has_hists(self) -> bool:
        """Whether the vector holds histogram cells."""
        return self.hists is not None

    def hist_objects(self) -> OBJ | None:
        """The histogram cells as ``FloatHistogram`` objects (None cells elsewhere), a new array
        the caller owns; None without histograms."""
        return None if self.hists is None else self.hists.objects()

    @classmethod
    def empty(cls, steps: int) -> StepVector:
        return cls([], np.empty((0, steps)), np.empty((0, steps), dtype=bool), np.empty(0, dtype=bool))

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, rows: npt.NDArray[np.intp] | list[int]) -> StepVector:
        """A new vector of the given rows, in the given order."""
        idx = np.asarray(rows, dtype=np.intp)
        return StepVector(
            [self.labels[i] for i in idx],
            self.values[idx],
            self.present[idx],
            self.drop_name[idx],
            None if self.sample_ts is None else self.sample_ts[idx],
            None if self.hists is None else self.hists.take(idx),
        )

    def where(self, keep: BOOL) -> StepVector:
        """The samples of either kind where ``keep`` (every row kept)."""
        return StepVector(
            self.labels,
            self.values,
            self.present & keep,
            self.drop_name,
            self.sample_ts,
            None if self.hists is None else self.hists.where(keep),
        )

    def hist_present(self) -> BOOL:
        """Where a histogram sample is (all False without histograms)."""
        return np.zeros(self.present.shape, dtype=bool) if self.hists is None else self.hists.mask()

    def hist_weight(self) -> int:
        """What the histogram cells count as toward ``max_samples`` (:func:`hist_weight`)."""
        return 0 if self.hists is None else self.hists.weight()

    def any_present(self) -> BOOL:
        """Where a sample of either kind is."""
        return self.present | self.hist_present() if self.has_hists else self.present

    def floats_only(self) -> StepVector:
        """The same vector without its histogram samples."""
        if not self.has_hists:
            return self
        return StepVector(self.labels, self.values, self.present, self.drop_name, self.sample_ts).compact()

    def compact(self) -> StepVector:
        """Without the rows that are absent at every step."""
        keep = np.flatnonzero(self.any_present().any(axis=1))
        return self if len(keep) == len(self.labels) else self.take(keep)


class HistRange(HistSamples):
    """The native-histogram samples of a range vector, indexed as :class:`RangeInput` indexes floats.

    Series ``i`` owns ``ts[offsets[i]:offsets[i + 1]]`` (and the same positions of ``hs``); its
    window at step ``j`` is ``lo[i, j]:hi[i, j]``. Built over columns (``data``, a store's
    :class:`SparseHists`), ``hs`` makes its objects the first time it is read: rate's dense
    path reads the columns and never does.
    """

    __slots__ = ("hi", "lo", "offsets", "st", "ts")

    def __init__(
        self, ts: I64, hs: OBJ | SparseHists, offsets: I64, lo: I64, hi: I64, st: I64 | None = None
    ) -> None:
        super().__init__(hs)
        self.ts, self.offsets, self.lo, self.hi = ts, offsets, lo, hi
        self.st = st  # start timestamps beside ts (RangeInput.st)

    @property
    def counts(self) -> I64:
        counts: I64 = self.hi - self.lo
        return counts


@dataclass(slots=True)
class RangeInput:
    """A range vector at every step: the samples of each series and each step's window.

    All series' samples are concatenated in ``ts``/``vs``; series ``i`` owns
    ``ts[offsets[i]:offsets[i + 1]]``. The window of series ``i`` at step ``j`` is
    ``ts[lo[i, j]:hi[i, j]]``, i.e. samples with ``end[j] - range_ms < t <= end[j]``. Stale markers
    are already removed. ``before`` and ``after`` hold the extra samples anchored/smoothed
    selectors may look at outside the window. Native-histogram samples, when there are any,
    are in ``hist`` (``ts``/``vs`` hold the floats only, so float functions ignore them).
    """

    labels: list[Labels]
    drop_name: BOOL
    ts: I64
    vs: F64
    offsets: I64
    lo: I64
    hi: I64
    end: I64
    range_ms: int
    anchored: bool = False
    smoothed: bool = False
    checkpoint: Callable[[], None] = _no_checkpoint  # raises when the query timed out or was cancelled
    hist: HistRange | None = None
    #: Start timestamps (ms, 0 = unset) beside ``ts``: only a matrix selector's, and only when a
    #: selected series has some (Prometheus passes them to rate, irate, increase and resets; a
    #: subquery has none). None otherwise, and the functions take their usual path.
    st: I64 | None = None

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def steps(self) -> int:
        return len(self.end)

    @property
    def counts(self) -> I64:
        counts: I64 = self.hi - self.lo
        return counts


# -------------------------------------------------------- what an argument or operand holds
# The checker guarantees each argument's type before anything runs (a function's registry entry
# declares them); these narrow a value to that type for the type checker, and a value of another
# type is a bug in kql, not in the query.


def _narrowed(value: Arg, kind: type[_T], what: str) -> _T:
    if not isinstance(value, kind):  # pragma: no cover - the checker rules it out
        raise TypeError(f"expected {what}, got {type(value).__name__}")
    return value


def as_vector(value: Arg) -> StepVector:
    """``value`` where the checker guarantees an instant vector."""
    return _narrowed(value, StepVector, "an instant vector")


def as_range(value: Arg) -> RangeInput:
    """``value`` where the checker guarantees a range vector."""
    return _narrowed(value, RangeInput, "a range vector")


def as_scalar(value: Arg) -> F64:
    """``value`` where the checker guarantees a scalar (one float per step)."""
    return _narrowed(value, np.ndarray, "a scalar")


def as_string(value: Arg) -> str:
    """``value`` where the checker guarantees a string."""
    return _narrowed(value, str, "a string")


def as_operand(value: Arg) -> Operand:
    """``value`` where the checker guarantees a binary operator's operand (a vector or a scalar)."""
    return value if isinstance(value, StepVector) else as_scalar(value)


def start_timestamp_resets(prev_st: I64, prev_t: I64, cur_st: I64, cur_t: I64) -> BOOL:
    """Elementwise Prometheus' isStartTimestampReset: whether the current sample's start timestamp
    says its counter started again after the previous sample (rate, increase, irate, resets).

    Unset (0), at or after its own time (OTel's "unknown start") or before the previous sample:
    no reset. After the previous sample: a reset. At it: a reset for a delta series (the previous
    start timestamp known and before its own sample), not for a cumulative series whose start
    was unknown (the previous one unset, equal to its time, or invalid after it)."""
    valid = (cur_st != 0) & (cur_st < cur_t)
    at_prev = (cur_st == prev_t) & (prev_st <= prev_t) & (prev_st != 0) & (prev_st != prev_t)
    out: BOOL = valid & ((cur_st > prev_t) | at_prev)
    return out


def start_time_overlaps(prev_st: I64, prev_t: I64, cur_st: I64) -> BOOL:
    """Elementwise Prometheus' checkStartTimeOverlap: a start timestamp before the previous
    sample's time that is not the previous one's (neither a delta's nor a cumulative's)."""
    out: BOOL = (cur_st != 0) & (cur_st < prev_t) & (cur_st != prev_st)
    return out


def start_time_overlap_warning(name: str) -> str:
    """Prometheus' NewStartTimeOverlapWarning."""
    return f"sample has start time that overlaps with previous sample timestamp for metric {go_quote(name)}"


@dataclass(frozen=True, slots=True)
class Annotation:
    """A warning or info raised while evaluating, with the position of the expression it is about."""

    level: Literal["warning", "info"]
    message: str
    pos: PosRange

    def format(self, query: str) -> str:
        """``PromQL warning: <message> (1:7)``, as Prometheus words it."""
        line, col = self.pos.line_col(query)
        return f"PromQL {self.level}: {self.message} ({line}:{col})"


class Annotator(Protocol):
    """What takes a query's warnings and infos: a :class:`CallContext`, or the evaluator's
    annotations wrapped for code shared between functions and selectors."""

    def warn(self, message: str, pos: PosRange | None = None) -> None: ...

    def info(self, message: str, pos: PosRange | None = None) -> None: ...


class CallContext:
    """What a function implementation may ask the engine for."""

    __slots__ = ("_eval", "node", "times")

    def __init__(self, evaluator: Evaluator, node: Call, times: I64) -> None:
        self._eval = evaluator
        self.node = node
        self.times = times

    @property
    def steps(self) -> int:
        return len(self.times)

    @property
    def query_start_ms(self) -> int:
        start: int = self._eval.query_start
        return start

    @property
    def query_end_ms(self) -> int:
        end: int = self._eval.query_end
        return end

    @property
    def query_step_ms(self) -> int:
        step: int = self._eval.query_step
        return step

    @property
    def is_range_query(self) -> bool:
        is_range: bool = self._eval.is_range_query
        return is_range

    def lookup(self, matchers: Sequence[Matcher], refs: I64) -> StepVector:
        """Select series and take their latest sample at each reference time, like a selector."""
        result: StepVector = self._eval.lookup(matchers, refs)
        return result

    def data_times(self, node: Node) -> I64:
        """When the selectors under an argument read their data, per step (after @ and offset)."""
        result: I64 = self._eval.data_times(node, self.times)
        return result

    @property
    def lookback_ms(self) -> int:
        lookback: int = self._eval.limits.lookback_ms
        return lookback

    def start_timestamps(self, node: VectorSelector, vec: StepVector) -> F64:
        """Per cell of ``vec`` (selector ``node``'s value with its sample times): the start
        timestamp of the sample behind it, ms, 0 where unset (``start_timestamp()``)."""
        result: F64 = self._eval.start_timestamps(node, self.times, vec)
        return result

    def warn(self, message: str, pos: PosRange | None = None) -> None:
        self._eval.annotate("warning", message, pos or self.node.pos)

    def info(self, message: str, pos: PosRange | None = None) -> None:
        self._eval.annotate("info", message, pos or self.node.pos)

    def check(self) -> None:
        """Raise if the query timed out or was cancelled (call it in long loops)."""
        self._eval.checkpoint()


# ------------------------------------------------------------------------------ public results


_MIN_NORMAL = 2.2250738585072014e-308
_MAX_FLOAT = 1.7976931348623157e308


def almost_equal(a: float, b: float, epsilon: float) -> bool:
    """Prometheus' ``almost.Equal``: relative tolerance ``epsilon``, near-zero values compared absolutely."""
    if a == b:
        return True
    abs_sum = abs(a) + abs(b)
    diff = abs(a - b)
    if a == 0 or b == 0 or abs_sum < _MIN_NORMAL:
        return diff < epsilon * _MIN_NORMAL
    return diff / min(abs_sum, _MAX_FLOAT) < epsilon


def almost_equal_array(
    a: npt.NDArray[np.float64], b: npt.NDArray[np.float64], epsilon: float
) -> npt.NDArray[np.bool_]:
    """:func:`almost_equal` element by element (call it under ``np.errstate(invalid="ignore")``:
    infinities of one sign subtract to NaN, which compares unequal as in Go)."""
    abs_sum = np.abs(a) + np.abs(b)
    diff = np.abs(a - b)
    tiny = (a == 0) | (b == 0) | (abs_sum < _MIN_NORMAL)
    relative = diff / np.minimum(abs_sum, _MAX_FLOAT) < epsilon
    out: npt.NDArray[np.bool_] = (a == b) | np.where(tiny, diff < epsilon * _MIN_NORMAL, relative)
    return out


#: A float as Go's ``strconv.FormatFloat(v, 'f', -1, 64)`` writes it: a ``count_values`` label, a
#: value in an error message (the HTTP API's values are :func:`format_json_float`).
format_sample_value = go_float_fixed


@dataclass(frozen=True, slots=True)
class Scalar:
    timestamp_ms: int
    value: float


@dataclass(frozen=True, slots=True)
class String:
    timestamp_ms: int
    value: str


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample of an instant vector: a float ``value``, or a native ``histogram`` (then ``value`` is NaN)."""

    labels: Labels
    timestamp_ms: int
    value: float
    histogram: FloatHistogram | None = None


#: Sample's slots, set directly: a frozen dataclass's ``__init__`` sets each field through
#: ``object.__setattr__``, slower than the slots' setters; an instant answer makes one per series.
_SAMPLE_SLOTS = tuple(vars(Sample)[name].__set__ for name in ("labels", "timestamp_ms", "value", "histogram"))


def float_samples(
    labels: Sequence[Labels], timestamp_ms: int, rows: list[int], values: list[float]
) -> tuple[Sample, ...]:
    """``Sample(labels[i], timestamp_ms, v)`` for every row ``i`` and value ``v``: equal objects,
    built without the dataclass ``__init__`` (engine's instant results)."""
    set_labels, set_time, set_value, set_histogram = _SAMPLE_SLOTS
    new = object.__new__
    out = []
    for i, v in zip(rows, values, strict=True):
        sample = new(Sample)
        set_labels(sample, labels[i])
        set_time(sample, timestamp_ms)
        set_value(sample, v)
        set_histogram(sample, None)
        out.append(sample)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Vector:
    """An instant vector; ``samples`` keep the order the query gave them (sort, topk)."""

    timestamp_ms: int
    samples: tuple[Sample, ...] = ()

    def __len__(self) -> int:
        return len(self.samples)


def _no_times() -> I64:
    return np.empty(0, dtype=np.int64)


@dataclass(frozen=True, slots=True, eq=False)
class Series:
    """One series of a matrix: float points, and native-histogram points apart (as Prometheus returns them)."""

    labels: Labels
    timestamps: I64
    values: F64
    hist_timestamps: I64 = field(default_factory=_no_times)
    histograms: tuple[FloatHistogram, ...] = ()


@dataclass(frozen=True, slots=True)
class Matrix:
    """A range query's result (or an instant query of a range vector), series sorted by labels."""

    series: tuple[Series, ...] = ()

    def __len__(self) -> int:
        return len(self.series)


@dataclass(frozen=True, slots=True)
class QueryStats:
    samples: int = 0  # loaded from storage
    series: int = 0
    seconds: float = 0.0
    peak_samples: int = 0  # most held in memory at one time (what ``max_samples`` limits)


@dataclass(frozen=True, slots=True)
class QueryResult:
    """A query's value plus the annotations raised while computing it."""

    value: Vector | Matrix | Scalar | String
    query: str = ""
    annotations: tuple[Annotation, ...] = ()
    stats: QueryStats = field(default_factory=QueryStats)

    @property
    def warnings(self) -> list[str]:
        return [a.format(self.query) for a in self.annotations if a.level == "warning"]

    @property
    def infos(self) -> list[str]:
        return [a.format(self.query) for a in self.annotations if a.level == "info"]

    def to_prometheus_json(self) -> dict[str, Any]:
        """The ``data`` object of a Prometheus ``/api/v1/query[_range]`` response."""
        return to_prometheus_json(self.value)


def _ts(ms: int) -> float | int:
    return ms // 1000 if ms % 1000 == 0 else ms / 1000


def format_json_float(value: float) -> str:
    """A sample value, or a histogram's count, sum or bucket bound, as Prometheus' HTTP API writes
    it (``jsonutil.MarshalFloat``): Go's ``'e'`` format below 1e-6 and from 1e21 on
    (``"5.939e-10"``, ``"1e+21"``), ``'f'`` otherwise (:func:`format_sample_value`)."""
    mag = abs(value)
    if mag != 0 and math.isfinite(value) and (mag < 1e-6 or mag >= 1e21):
        return repr(float(value))  # Python's shortest repr is Go's 'e' form in these ranges ("1e-07")
    return format_sample_value(value)


def histogram_json(h: FloatHistogram) -> dict[str, Any]:
    """A native histogram as the Prometheus HTTP API writes it (``jsonutil.MarshalHistogram``):
    count, sum, and the non-empty buckets as ``[boundary rule, lower, upper, count]``, the rule
    0 for ``(lower, upper]``, 1 for ``[lower, upper)``, 2 for ``(lower, upper)``, 3 for ``[lower, upper]``."""
    out: dict[str, Any] = {"count": format_json_float(h.count), "sum": format_json_float(h.sum)}
    buckets = []
    for lower, upper, lower_inclusive, upper_inclusive, count in _all_buckets(h):
        if count == 0:
            continue
        rule = (3 if upper_inclusive else 1) if lower_inclusive else (0 if upper_inclusive else 2)
        buckets.append(
            [
                rule,
                format_json_float(lower),
                format_json_float(upper),
                format_json_float(count),
            ]
        )
    if buckets:
        out["buckets"] = buckets
    return out


def _all_buckets(h: FloatHistogram) -> list[tuple[float, float, bool, bool, float]]:
    """(lower, upper, lower inclusive, upper inclusive, count) of every bucket, lowest first."""
    return [(b.lower, b.upper, b.lower_inclusive, b.upper_inclusive, b.count) for b in h.all_buckets()]


def to_prometheus_json(value: Vector | Matrix | Scalar | String) -> dict[str, Any]:
    """``{"resultType": ..., "result": ...}`` exactly as the Prometheus HTTP API encodes it."""
    if isinstance(value, Scalar):
        return {"resultType": "scalar", "result": [_ts(value.timestamp_ms), format_json_float(value.value)]}
    if isinstance(value, String):
        return {"resultType": "string", "result": [_ts(value.timestamp_ms), value.value]}
    if isinstance(value, Vector):
        return {"resultType": "vector", "result": [_sample_json(s) for s in value.samples]}
    return {"resultType": "matrix", "result": [_series_json(s) for s in value.series]}


def _sample_json(s: Sample) -> dict[str, Any]:
    if s.histogram is not None:
        return {"metric": dict(s.labels), "histogram": [_ts(s.timestamp_ms), histogram_json(s.histogram)]}
    return {"metric": dict(s.labels), "value": [_ts(s.timestamp_ms), format_json_float(s.value)]}


def _series_json(s: Series) -> dict[str, Any]:
    out: dict[str, Any] = {"metric": dict(s.labels)}
    if len(s.timestamps) or not s.histograms:
        out["values"] = [
            [_ts(int(t)), format_json_float(float(v))] for t, v in zip(s.timestamps, s.values, strict=True)
        ]
    if s.histograms:
        out["histograms"] = [
            [_ts(int(t)), histogram_json(h)] for t, h in zip(s.hist_timestamps, s.histograms, strict=True)
        ]
    return out


# ------------------------------------------------------------------------------ fast JSON encoding

#: Outside this range (and for NaN and the infinities) :func:`format_json_float` writes the
#: value; inside it, orjson's shortest round-trip digits are Go's ``FormatFloat(v, 'f', -1, 64)``.
_FAST_MAX = 1e16
_FAST_MIN = 1e-4
_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def _value_bytes(values: F64) -> npt.NDArray[np.object_]:
    """The text of :func:`format_json_float` for every value, as bytes in an object array.

    orjson writes the shortest digits that round-trip, as Go does (checked against ``repr``
    on millions of values); integral values are written as integers (Go's ``"1"``, not
    ``"1.0"``), and only the rare values outside the positional range go through
    :func:`format_json_float`.
    """
    n = len(values)
    out = np.empty(n, dtype=object)
    if n == 0:
        return out
    mag = np.abs(values)
    zero = values == 0
    fast = (mag < _FAST_MAX) & ((mag >= _FAST_MIN) | zero) & ~(zero & np.signbit(values))  # -0 is odd
    with np.errstate(invalid="ignore"):  # trunc(NaN) warns on some numpy builds; NaN is never fast
        integral = fast & (values == np.trunc(values))
    fraction = fast & ~integral
    if integral.any():
        out[integral] = orjson.dumps(values[integral].astype(np.int64), option=_NUMPY)[1:-1].split(b",")
    if fraction.any():
        out[fraction] = orjson.dumps(np.ascontiguousarray(values[fraction]), option=_NUMPY)[1:-1].split(b",")
    odd = ~fast
    if odd.any():
        for i in np.flatnonzero(odd).tolist():
            out[i] = format_json_float(float(values[i])).encode()
    return out


#: Up to this many values :func:`_few_value_bytes` formats them one by one: below it the dozen
#: numpy calls of :func:`_value_bytes` cost more than a Python loop.
_FEW_VALUES = 32


def _few_value_bytes(values: list[float]) -> list[bytes]:
    """:func:`_value_bytes` of a few values, one by one; the same bytes (orjson formats a Python
    float as it formats a float64 element, and integral values are written as integers)."""
    out = []
    for x in values:
        v = float(x)  # a numpy float64 is a float, but orjson writes only plain ones
        mag = abs(v)
        if mag < _FAST_MAX and (mag >= _FAST_MIN or (v == 0 and math.copysign(1.0, v) > 0)):
            out.append(b"%d" % v if v.is_integer() else orjson.dumps(v))
        else:
            out.append(format_json_float(v).encode())
    return out


#: A label set -> its JSON object (``orjson.dumps(dict(labels))``): dashboards and rules ask for the
#: same series again and again, and encoding them was up to half of an instant query's time. Forgotten all at once when full.
_LABELS_JSON: dict[Labels, bytes] = {}
_LABELS_JSON_MAX = 100_000


def _labels_json(labels: Labels) -> bytes:
    out = _LABELS_JSON.get(labels)
    if out is None:
        if len(_LABELS_JSON) >= _LABELS_JSON_MAX:
            _LABELS_JSON.clear()
        out = _LABELS_JSON[labels] = orjson.dumps(dict(labels))
    return out


def _ts_bytes(ms: int) -> bytes:
    return str(_ts(ms)).encode()


#: Times (ms) below this are written by :func:`_value_bytes` in :func:`_stamps_bytes`: in seconds
#: they are integers or have at most three decimals well above a float64's resolution there.
_FAST_STAMP_MS = 10**15


def _stamps_bytes(ms: I64) -> list[bytes]:
    """``_ts_bytes`` of every time of ``ms`` (ascending), the grid's in one pass: a range query's
    hundreds of steps one by one cost more than the rest of the answer's text. In seconds the times are integers (``ms // 1000``,
    as ``_ts``) or fractions whose shortest digits orjson writes as ``repr`` does (the same
    bytes, hypothesis-checked)."""
    if len(ms) and int(ms[0]) >= 0 and int(ms[-1]) < _FAST_STAMP_MS:
        return _stamps_text(ms).split(b",")[:-1]
    return [_ts_bytes(t) for t in ms.tolist()]


def _stamps_text(ms: I64, after: bytes = b",") -> bytes:
    """``t1,t2,...,tn,``: the text of every time of ``ms`` (in ``[0, _FAST_STAMP_MS)``) each
    followed by ``after`` (a comma), as :func:`_ts_bytes` writes them.

    One pass in C (``_windows.stamps_text``, digits from the integer milliseconds): orjson's
    float text of ``ms / 1000`` with the whole seconds' ".0" replaced away cost many times that.
    """
    return _windows.stamps_text(np.ascontiguousarray(ms, dtype=np.int64), after)


#: Up to this many series a matrix is written series by series (:func:`_series_bytes`): the
#: whole-matrix pass's object arrays cost more than that for one series (range ``absent``,
#: ``sum(...)``), and less than it from about three series on.
_FEW_SERIES = 2


def _constant_points(ms: I64, values: F64) -> bytes | None:
    """The points ``[t,"v"],...`` of a series whose values are all the same float (bit for bit),
    as :func:`_series_bytes` writes them, by two replaces on the times' text: ``absent`` over a
    range, ``vector(1)``, a flat gauge. None for any other series, or times :func:`_stamps_bytes`
    writes one by one.

    The value is formatted once and written after every time by :func:`_stamps_text`, instead of
    two object arrays and a join of two pieces a step (``make bench-kql``).
    """
    n = len(ms)
    if n < 2 or int(ms[0]) < 0 or int(ms[-1]) >= _FAST_STAMP_MS:
        return None
    bits = values.view(np.int64)
    if not (bits == bits[0]).all():
        return None
    value = _few_value_bytes([float(values[0])])[0]
    return b"[" + _stamps_text(ms, b',"%b"],[' % value)[:-2]


def _series_bytes(s: Series) -> bytes:
    """One float series of a matrix as :func:`prometheus_json_bytes` writes it: each point's
    time (with the separators before it) and value interleaved in one list and joined once
    (a constant series by :func:`_constant_points`)."""
    n = len(s.timestamps)
    ms, values = np.asarray(s.timestamps, dtype=np.int64), np.asarray(s.values, dtype=np.float64)
    body = _constant_points(ms, values) or b""
    if n and not body:
        pieces: list[bytes] = [b""] * (2 * n)
        pieces[0::2] = [b'"],[%b,"' % t for t in _stamps_bytes(ms)]
        pieces[1::2] = _value_bytes(values).tolist()
        body = b"".join(pieces)[3:] + b'"]'
    return b'{"metric":%b,"values":[%b]}' % (_labels_json(s.labels), body)


def prometheus_json_bytes(value: Vector | Matrix | Scalar | String) -> bytes:
    """:func:`to_prometheus_json` already encoded as compact UTF-8 JSON, without a Python object per sample.

    A large range answer spent most of its time building objects and dumping them;
    here the values are formatted by two orjson calls and every point is two slices of one
    joined list.
    """
    if isinstance(value, Scalar | String):
        return orjson.dumps(to_prometheus_json(value))
    if isinstance(value, Vector) and any(s.histogram is not None for s in value.samples):
        return orjson.dumps(to_prometheus_json(value))
    if isinstance(value, Vector):
        t = _ts_bytes(value.timestamp_ms)
        floats = [s.value for s in value.samples]
        texts = (
            _few_value_bytes(floats)
            if len(floats) <= _FEW_VALUES
            else _value_bytes(np.array(floats, dtype=np.float64)).tolist()
        )
        items = [
            b'{"metric":%b,"value":[%b,"%b"]}' % (_labels_json(s.labels), t, v)
            for s, v in zip(value.samples, texts, strict=True)
        ]
        return b'{"resultType":"vector","result":[' + b",".join(items) + b"]}"
    series = value.series
    if not series:
        return b'{"resultType":"matrix","result":[]}'
    if any(s.histograms for s in series):
        # Histogram points are few next to float points in practice: the plain encoder writes them.
        return orjson.dumps(to_prometheus_json(value))
    if len(series) <= _FEW_SERIES:
        return b'{"resultType":"matrix","result":[' + b",".join(_series_bytes(s) for s in series) + b"]}"
    lengths = [len(s.timestamps) for s in series]
    all_ts = np.concatenate([s.timestamps for s in series]).astype(np.int64, copy=False)
    steps, where = np.unique(all_ts, return_inverse=True)
    # Every point is (head, value): a series' first head opens its list, the others also close
    # the point before, so one join of a slice writes a whole series. The heads '"],[t,"' of all
    # steps come from one join and one split (the times' text holds no NUL byte).
    stamps = _stamps_bytes(steps)
    following = np.empty(len(stamps), dtype=object)
    if stamps:
        following[:] = (b'"],[' + b',"\x00"],['.join(stamps) + b',"').split(b"\x00")
    pieces = np.empty((len(all_ts), 2), dtype=object)
    pieces[:, 0] = following[where]
    starts = np.cumsum([0, *lengths[:-1]])
    for k in starts[np.asarray(lengths) > 0].tolist():
        pieces[k, 0] = pieces[k, 0][3:]  # a series' first point opens its list: '[t,"'
    pieces[:, 1] = _value_bytes(np.concatenate([s.values for s in series]).astype(np.float64, copy=False))
    flat = pieces.ravel().tolist()
    items = []
    at = 0
    for s, n in zip(series, lengths, strict=True):
        body = b"".join(flat[2 * at : 2 * (at + n)]) + b'"]' if n else b""
        at += n
        items.append(b'{"metric":%b,"values":[%b]}' % (_labels_json(s.labels), body))
    return b'{"resultType":"matrix","result":[' + b",".join(items) + b"]}"
