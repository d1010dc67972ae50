"""The SQL layer: identifiers quoted once, every value a server-side parameter read back unchanged."""

from __future__ import annotations

import pytest

from kernel_insight.collector.clickhouse.sql import Params, ident, param_text, qualified
from kernel_insight.collector.clickhouse.store import EmbeddedStore

ODD = [
    "",
    "plain",
    "it's",
    "back\\slash",
    "tab\there",
    "new\nline",
    "cr\r",
    "nul\x00",
    "`tick`",
    "{p0:String}",
    "é",
]


def test_identifiers_are_bare_only_when_plain_and_no_keyword():
    assert ident("samples") == "samples"
    assert ident("date") == "`date`"
    assert ident("end") == "`end`"
    assert ident("odd-name") == "`odd-name`"
    assert ident("a`b\\c") == "`a\\`b\\\\c`"
    assert qualified("ki", "series") == "ki.series"


def test_params_name_placeholders_in_order_of_use():
    p = Params()
    assert p("x", "String") == "{p0:String}"
    assert p([1, 2], "Array(UInt64)") == "{p1:Array(UInt64)}"
    assert p == {"p0": "x", "p1": [1, 2]}
    assert param_text([1, 2]) == "[1,2]"
    assert param_text(["a'b"]) == "['a\\'b']"


def test_param_text_refuses_a_value_it_cannot_write():
    with pytest.raises(TypeError, match="no ClickHouse parameter form"):
        param_text(object())


def test_every_value_reaches_the_engine_unchanged(tmp_path):
    with EmbeddedStore(tmp_path) as store:
        for text in ODD:
            p = Params()
            row = store.query(
                f"SELECT {p(text, 'String')} AS s, {p([text, 'x'], 'Array(String)')} AS a, "
                f"{p(-(2**63), 'Int64')} AS lo, {p(2**64 - 1, 'UInt64')} AS hi, {p(0.1, 'Float64')} AS f",
                p,
            ).to_pylist()[0]
            assert row == {"s": text, "a": [text, "x"], "lo": -(2**63), "hi": 2**64 - 1, "f": 0.1}
