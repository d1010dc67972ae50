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
    # The package's exports: each name is imported from its module on first use
    # (kernel_insight/_lazy.py reads this block); ``X as X`` marks it re-exported.
    from kernel_insight.kql.aggregators import AGGREGATORS as AGGREGATORS
    from kernel_insight.kql.aggregators import AggregatorSpec as AggregatorSpec
    from kernel_insight.kql.checker import check as check
    from kernel_insight.kql.checker import value_type as value_type
    from kernel_insight.kql.engine import CancelToken as CancelToken
    from kernel_insight.kql.engine import Engine as Engine
    from kernel_insight.kql.errors import KqlError as KqlError
    from kernel_insight.kql.errors import KqlEvaluationError as KqlEvaluationError
    from kernel_insight.kql.errors import KqlExecutionError as KqlExecutionError
    from kernel_insight.kql.errors import KqlParseError as KqlParseError
    from kernel_insight.kql.errors import KqlTypeError as KqlTypeError
    from kernel_insight.kql.errors import QueryCancelledError as QueryCancelledError
    from kernel_insight.kql.errors import QueryTimeoutError as QueryTimeoutError
    from kernel_insight.kql.errors import StorageError as StorageError
    from kernel_insight.kql.errors import TooManySamplesError as TooManySamplesError
    from kernel_insight.kql.errors import TooManySeriesError as TooManySeriesError
    from kernel_insight.kql.functions import FUNCTIONS as FUNCTIONS
    from kernel_insight.kql.functions import FunctionSpec as FunctionSpec
    from kernel_insight.kql.functions import GridPushdown as GridPushdown
    from kernel_insight.kql.histogram import FloatHistogram as FloatHistogram
    from kernel_insight.kql.histogram import HistogramError as HistogramError
    from kernel_insight.kql.histogram import parse_histogram as parse_histogram
    from kernel_insight.kql.limits import EngineLimits as EngineLimits
    from kernel_insight.kql.parser import parse as parse
    from kernel_insight.kql.printer import format_expr as format_expr
    from kernel_insight.kql.storage import STALE_NAN as STALE_NAN
    from kernel_insight.kql.storage import Capability as Capability
    from kernel_insight.kql.storage import Matcher as Matcher
    from kernel_insight.kql.storage import MemoryStorage as MemoryStorage
    from kernel_insight.kql.storage import SelectHints as SelectHints
    from kernel_insight.kql.storage import SeriesData as SeriesData
    from kernel_insight.kql.storage import Storage as Storage
    from kernel_insight.kql.storage import StorageBase as StorageBase
    from kernel_insight.kql.values import Annotation as Annotation
    from kernel_insight.kql.values import Matrix as Matrix
    from kernel_insight.kql.values import QueryResult as QueryResult
    from kernel_insight.kql.values import Sample as Sample
    from kernel_insight.kql.values import Scalar as Scalar
    from kernel_insight.kql.values import Series as Series
    from kernel_insight.kql.values import String as String
    from kernel_insight.kql.values import Vector as Vector
    from kernel_insight.kql.values import prometheus_json_bytes as prometheus_json_bytes
    from kernel_insight.kql.values import to_prometheus_json as to_prometheus_json


__getattr__, __dir__ = lazy_exports(globals())
