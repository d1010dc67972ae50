"""kql: PromQL with GPU-friendly extensions, evaluated over any :class:`Storage` (see docs/kql.md).

>>> from kernel_insight.kql import Engine, MemoryStorage
>>> store = MemoryStorage()
>>> store.add({"__name__": "kernel_execution_time_seconds", "model": "llama-70b"}, [0, 15_000], [0.12, 0.31])
>>> result = Engine(store).instant_query('kernel_execution_time_seconds > 200ms', 15_000)
>>> len(result.value.samples)
1
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_insight._lazy import lazy_exports

if TYPE_CHECKING:
    from kernel_insight.kql.aggregators import AGGREGATORS, AggregatorSpec
    from kernel_insight.kql.checker import check, value_type
    from kernel_insight.kql.engine import CancelToken, Engine
    from kernel_insight.kql.errors import (
        KqlError,
        KqlEvaluationError,
        KqlExecutionError,
        KqlParseError,
        KqlTypeError,
        QueryCancelledError,
        QueryTimeoutError,
        StorageError,
        TooManySamplesError,
        TooManySeriesError,
    )
    from kernel_insight.kql.functions import FUNCTIONS, FunctionSpec, GridPushdown
    from kernel_insight.kql.limits import EngineLimits
    from kernel_insight.kql.nativehist import FloatHistogram, HistogramError, parse_histogram
    from kernel_insight.kql.parser import parse
    from kernel_insight.kql.printer import format_expr
    from kernel_insight.kql.storage import STALE_NAN, Matcher, MemoryStorage, SeriesData, Storage
    from kernel_insight.kql.values import (
        Annotation,
        Matrix,
        QueryResult,
        Sample,
        Scalar,
        Series,
        String,
        Vector,
        prometheus_json_bytes,
        to_prometheus_json,
    )

_EXPORTS: dict[str, tuple[str, ...]] = {
    "kernel_insight.kql.aggregators": (
        "AGGREGATORS",
        "AggregatorSpec",
    ),
    "kernel_insight.kql.checker": (
        "check",
        "value_type",
    ),
    "kernel_insight.kql.engine": (
        "CancelToken",
        "Engine",
    ),
    "kernel_insight.kql.errors": (
        "KqlError",
        "KqlEvaluationError",
        "KqlExecutionError",
        "KqlParseError",
        "KqlTypeError",
        "QueryCancelledError",
        "QueryTimeoutError",
        "StorageError",
        "TooManySamplesError",
        "TooManySeriesError",
    ),
    "kernel_insight.kql.functions": (
        "FUNCTIONS",
        "FunctionSpec",
        "GridPushdown",
    ),
    "kernel_insight.kql.limits": ("EngineLimits",),
    "kernel_insight.kql.nativehist": (
        "FloatHistogram",
        "HistogramError",
        "parse_histogram",
    ),
    "kernel_insight.kql.parser": ("parse",),
    "kernel_insight.kql.printer": ("format_expr",),
    "kernel_insight.kql.storage": (
        "STALE_NAN",
        "Matcher",
        "MemoryStorage",
        "SeriesData",
        "Storage",
    ),
    "kernel_insight.kql.values": (
        "Annotation",
        "Matrix",
        "QueryResult",
        "Sample",
        "Scalar",
        "Series",
        "String",
        "Vector",
        "prometheus_json_bytes",
        "to_prometheus_json",
    ),
}

__all__ = [
    "AGGREGATORS",
    "FUNCTIONS",
    "STALE_NAN",
    "AggregatorSpec",
    "Annotation",
    "CancelToken",
    "Engine",
    "EngineLimits",
    "FloatHistogram",
    "FunctionSpec",
    "GridPushdown",
    "HistogramError",
    "KqlError",
    "KqlEvaluationError",
    "KqlExecutionError",
    "KqlParseError",
    "KqlTypeError",
    "Matcher",
    "Matrix",
    "MemoryStorage",
    "QueryCancelledError",
    "QueryResult",
    "QueryTimeoutError",
    "Sample",
    "Scalar",
    "Series",
    "SeriesData",
    "Storage",
    "StorageError",
    "String",
    "TooManySamplesError",
    "TooManySeriesError",
    "Vector",
    "check",
    "format_expr",
    "parse",
    "parse_histogram",
    "prometheus_json_bytes",
    "to_prometheus_json",
    "value_type",
]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
