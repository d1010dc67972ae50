"""The public surface of kernel_insight.kql, and the runnable examples in its docstrings."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import kernel_insight.kql as kql

EXPECTED = {
    "AGGREGATORS", "AggregatorSpec", "FUNCTIONS", "GridPushdown", "STALE_NAN", "Annotation", "CancelToken",
    "Capability", "Engine", "SelectHints", "StorageBase",
    "EngineLimits", "FloatHistogram", "FunctionSpec", "HistogramError",
    "KqlError", "KqlEvaluationError", "KqlExecutionError", "KqlParseError", "KqlTypeError", "Matcher",
    "Matrix", "MemoryStorage", "QueryCancelledError", "QueryResult", "QueryTimeoutError", "Sample",
    "Scalar", "Series", "SeriesData", "Storage", "StorageError", "String", "TooManySamplesError",
    "TooManySeriesError", "Vector", "check", "format_expr", "parse", "parse_histogram", "prometheus_json_bytes", "to_prometheus_json",
    "value_type",
}  # fmt: skip


def test_public_api_is_exactly_all() -> None:
    assert set(kql.__all__) == EXPECTED
    for name in kql.__all__:
        assert getattr(kql, name) is not None


def test_error_hierarchy() -> None:
    assert issubclass(kql.KqlTypeError, kql.KqlParseError)
    for cls in (kql.QueryTimeoutError, kql.QueryCancelledError, kql.TooManySamplesError, kql.StorageError):
        assert issubclass(cls, kql.KqlExecutionError)
    assert issubclass(kql.KqlExecutionError, kql.KqlError)
    assert issubclass(kql.KqlParseError, kql.KqlError)


MODULES = [
    "kernel_insight.kql",
    *sorted(name for _, name, _ in pkgutil.walk_packages(kql.__path__, "kernel_insight.kql.")),
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
