"""Prometheus' native-histogram value type, as its ``model/histogram`` package: ``FloatHistogram``
and its arithmetic, the constants (schemas, counter-reset hints), bucket bounds, quantiles and
fractions, the ports of Go's math they need to give Prometheus' bits, and the promqltest notation.

>>> from kernel_insight.kql.histogram import histogram_quantile, parse_histogram
>>> h = parse_histogram("{{schema:0 count:4 sum:5 buckets:[1 2 1]}}")
>>> str(h)
'{count:4, sum:5, (0.5,1]:1, (1,2]:2, (2,4]:1}'
>>> round(histogram_quantile(0.5, h)[0], 6)
1.414214
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_insight._lazy import lazy_exports

if TYPE_CHECKING:
    # The package's exports: each name is imported from its module on first use
    # (kernel_insight/_lazy.py reads this block); ``X as X`` marks it re-exported.
    from kernel_insight.kql.histogram.bounds import bounds_exponential as bounds_exponential
    from kernel_insight.kql.histogram.bounds import get_bound as get_bound
    from kernel_insight.kql.histogram.bounds import get_bound_exponential as get_bound_exponential
    from kernel_insight.kql.histogram.buckets import Bucket as Bucket
    from kernel_insight.kql.histogram.buckets import KahanResult as KahanResult
    from kernel_insight.kql.histogram.buckets import OpResult as OpResult
    from kernel_insight.kql.histogram.buckets import spans_match as spans_match
    from kernel_insight.kql.histogram.constants import COUNTER_RESET as COUNTER_RESET
    from kernel_insight.kql.histogram.constants import CUSTOM_BUCKETS_SCHEMA as CUSTOM_BUCKETS_SCHEMA
    from kernel_insight.kql.histogram.constants import EXPONENTIAL_SCHEMA_MAX as EXPONENTIAL_SCHEMA_MAX
    from kernel_insight.kql.histogram.constants import EXPONENTIAL_SCHEMA_MIN as EXPONENTIAL_SCHEMA_MIN
    from kernel_insight.kql.histogram.constants import FRACTION_NAN_INFO as FRACTION_NAN_INFO
    from kernel_insight.kql.histogram.constants import GAUGE_TYPE as GAUGE_TYPE
    from kernel_insight.kql.histogram.constants import HISTOGRAM_MIN_WEIGHT as HISTOGRAM_MIN_WEIGHT
    from kernel_insight.kql.histogram.constants import NAN_RESULT_INFO as NAN_RESULT_INFO
    from kernel_insight.kql.histogram.constants import NAN_SKEW_INFO as NAN_SKEW_INFO
    from kernel_insight.kql.histogram.constants import NOT_COUNTER_RESET as NOT_COUNTER_RESET
    from kernel_insight.kql.histogram.constants import UNKNOWN_COUNTER_RESET as UNKNOWN_COUNTER_RESET
    from kernel_insight.kql.histogram.constants import HistogramError as HistogramError
    from kernel_insight.kql.histogram.constants import HistogramNotationError as HistogramNotationError
    from kernel_insight.kql.histogram.constants import Span as Span
    from kernel_insight.kql.histogram.constants import is_custom_buckets_schema as is_custom_buckets_schema
    from kernel_insight.kql.histogram.constants import is_exponential_schema as is_exponential_schema
    from kernel_insight.kql.histogram.float_histogram import FloatHistogram as FloatHistogram
    from kernel_insight.kql.histogram.float_histogram import HistogramMean as HistogramMean
    from kernel_insight.kql.histogram.float_histogram import HistogramSum as HistogramSum
    from kernel_insight.kql.histogram.gomath import go_div as go_div
    from kernel_insight.kql.histogram.gomath import go_exp2 as go_exp2
    from kernel_insight.kql.histogram.gomath import go_exp2_array as go_exp2_array
    from kernel_insight.kql.histogram.gomath import go_log2 as go_log2
    from kernel_insight.kql.histogram.gomath import go_log2_array as go_log2_array
    from kernel_insight.kql.histogram.gomath import go_log10_array as go_log10_array
    from kernel_insight.kql.histogram.gomath import go_log_array as go_log_array
    from kernel_insight.kql.histogram.gomath import kahan_inc as kahan_inc
    from kernel_insight.kql.histogram.notation import HistogramSeriesValue as HistogramSeriesValue
    from kernel_insight.kql.histogram.notation import expand_histogram_series as expand_histogram_series
    from kernel_insight.kql.histogram.notation import parse_histogram as parse_histogram
    from kernel_insight.kql.histogram.quantile import fraction_ranks as fraction_ranks
    from kernel_insight.kql.histogram.quantile import histogram_avg as histogram_avg
    from kernel_insight.kql.histogram.quantile import histogram_fraction as histogram_fraction
    from kernel_insight.kql.histogram.quantile import histogram_quantile as histogram_quantile
    from kernel_insight.kql.histogram.quantile import histogram_stddev as histogram_stddev
    from kernel_insight.kql.histogram.quantile import histogram_stdvar as histogram_stdvar
    from kernel_insight.kql.histogram.quantile import interpolate_rank as interpolate_rank


__getattr__, __dir__ = lazy_exports(globals())
