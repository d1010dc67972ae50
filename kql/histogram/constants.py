"""Native-histogram constants, errors and annotation texts, as Prometheus' model/histogram defines them."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

UNKNOWN_COUNTER_RESET = 0
COUNTER_RESET = 1
NOT_COUNTER_RESET = 2
GAUGE_TYPE = 3

#: The fewest float samples one histogram counts as toward the sample limit (an empty one's
#: :meth:`FloatHistogram.sample_weight`): a storage read of histogram rows can stop at
#: ``max_samples // HISTOGRAM_MIN_WEIGHT`` rows.
HISTOGRAM_MIN_WEIGHT = 11

#: The schema of native histograms with custom buckets (NHCB).
CUSTOM_BUCKETS_SCHEMA = -53
EXPONENTIAL_SCHEMA_MIN = -4
EXPONENTIAL_SCHEMA_MAX = 8

_MAX_FLOAT = 1.7976931348623157e308
_INF = math.inf

Span = tuple[int, int]
_I64 = npt.NDArray[np.int64]
_F64 = npt.NDArray[np.float64]

# Info annotations, worded as Prometheus' promql/annotations (kql appends `for metric name "x"`
# and the position).
NAN_RESULT_INFO = "input to histogram_quantile has NaN observations, result is NaN"
NAN_SKEW_INFO = "input to histogram_quantile has NaN observations, result is skewed higher"
FRACTION_NAN_INFO = "input to histogram_fraction has NaN observations, which are excluded from all fractions"


class HistogramError(ValueError):
    """An operation Prometheus refuses (mixing exponential and custom-bucket schemas, bad resolution change)."""


_MIXED_SCHEMAS = (
    "cannot apply this operation on histograms with a mix of exponential and custom bucket schemas"
)


class HistogramNotationError(ValueError):
    """A promqltest ``{{...}}`` histogram literal that does not parse; the message says where."""


def is_custom_buckets_schema(schema: int) -> bool:
    return schema == CUSTOM_BUCKETS_SCHEMA


def is_exponential_schema(schema: int) -> bool:
    return EXPONENTIAL_SCHEMA_MIN <= schema <= EXPONENTIAL_SCHEMA_MAX
