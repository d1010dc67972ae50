"""The storage protocol and the in-memory store."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernel_insight.kql.storage import (
    STALE_NAN,
    STALE_NAN_BITS,
    Matcher,
    MemoryStorage,
    Storage,
    is_stale,
    is_stale_value,
    labels_match,
)


def test_stale_nan_has_the_prometheus_bit_pattern() -> None:
    assert np.array([STALE_NAN]).view(np.uint64)[0] == STALE_NAN_BITS == 0x7FF0000000000002
    assert math.isnan(STALE_NAN)
    assert is_stale_value(STALE_NAN)
    assert not is_stale_value(math.nan)
    assert list(is_stale(np.array([1.0, math.nan, STALE_NAN]))) == [False, False, True]


@pytest.mark.parametrize(
    ("matcher", "value", "expected"),
    [
        (Matcher("gpu", "=", "0"), "0", True),
        (Matcher("gpu", "=", "0"), "01", False),
        (Matcher("gpu", "!=", "0"), "1", True),
        (Matcher("gpu", "=~", "[01]"), "1", True),
        (Matcher("gpu", "=~", "[01]"), "10", False),  # regexes are anchored at both ends
        (Matcher("gpu", "!~", "1.*"), "10", False),
        (Matcher("model", "=~", "(?i)LLAMA.*"), "llama-70b", True),
        (Matcher("model", "=~", "llama-((?i)B)"), "llama-b", True),  # RE2 flag groups anywhere
        (Matcher("path", "=~", ".*"), "a\nb", True),  # `.` matches newlines
        (Matcher("gpu", "=", ""), "", True),
    ],
)
def test_matcher_semantics(matcher: Matcher, value: str, expected: bool) -> None:
    assert matcher.matches(value) is expected


def test_a_missing_label_matches_as_empty() -> None:
    assert labels_match({"job": "a"}, [Matcher("gpu", "=", "")])
    assert labels_match({"job": "a"}, [Matcher("gpu", "!=", "0")])
    assert not labels_match({"job": "a"}, [Matcher("gpu", "=~", ".+")])


def test_matcher_rejects_bad_operators_and_regexes() -> None:
    with pytest.raises(ValueError, match="unknown matcher operator"):
        Matcher("gpu", "==", "0")
    with pytest.raises(ValueError, match="invalid regular expression"):
        Matcher("gpu", "=~", "(")


def test_memory_storage_implements_the_protocol() -> None:
    assert isinstance(MemoryStorage(), Storage)


def test_select_bounds_are_inclusive_and_results_sorted() -> None:
    s = MemoryStorage()
    s.add({"__name__": "up", "gpu": "1"}, [0, 10, 20, 30], [1, 2, 3, 4])
    s.add({"__name__": "up", "gpu": "0"}, [15], [9])
    out = s.select([Matcher("__name__", "=", "up")], 10, 20)
    assert [dict(d.labels)["gpu"] for d in out] == ["0", "1"]
    assert list(out[1].timestamps) == [10, 20]
    assert list(out[1].values) == [2.0, 3.0]
    assert out[1].timestamps.dtype == np.int64
    assert out[1].values.dtype == np.float64


def test_series_without_samples_in_the_window_are_left_out() -> None:
    s = MemoryStorage()
    s.add({"__name__": "up"}, [0], [1])
    assert s.select([Matcher("__name__", "=", "up")], 1, 5) == []


def test_later_writes_replace_earlier_ones_and_order_does_not_matter() -> None:
    s = MemoryStorage()
    s.add({"__name__": "up"}, [20, 0], [2, 0])
    s.add({"__name__": "up"}, [0], [5])
    (data,) = s.select([Matcher("__name__", "=", "up")], 0, 100)
    assert list(data.timestamps) == [0, 20]
    assert list(data.values) == [5.0, 2.0]


def test_empty_label_values_mean_no_label() -> None:
    s = MemoryStorage()
    s.add({"__name__": "up", "unit": ""}, [0], [1])
    assert s.select([Matcher("__name__", "=", "up")], 0, 0)[0].labels == (("__name__", "up"),)


def test_label_names_and_values() -> None:
    s = MemoryStorage()
    s.add({"__name__": "up", "gpu": "0"}, [0], [1])
    s.add({"__name__": "up", "gpu": "1", "model": "m"}, [0], [1])
    s.add({"__name__": "other", "job": "x"}, [500], [1])
    up = [Matcher("__name__", "=", "up")]
    assert s.label_names(up, 0, 100) == ["__name__", "gpu", "model"]
    assert s.label_names([], 0, 1000) == ["__name__", "gpu", "job", "model"]
    assert s.label_values("gpu", up, 0, 100) == ["0", "1"]
    assert s.label_values("job", [], 0, 100) == []
