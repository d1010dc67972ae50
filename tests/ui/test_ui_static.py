"""The collector serves the UI's files at ``/`` and ``/ui/...``, without a token, and nothing else from disk."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from kernel_insight.api.ui import STATIC_DIR
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.server import build_collector_app


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-static")
    store = EmbeddedStore(tmp / "store")
    yield build_collector_app(store, keys_path=tmp / "keys.json", tokens_path=tmp / "tokens.json")
    store.close()


def _get(app, path):
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ki") as c:
            return await c.get(path)

    return asyncio.run(go())


def test_the_page_and_its_files_are_served_without_a_token(app):
    index = _get(app, "/")
    assert index.status_code == 200
    assert index.headers["content-type"].startswith("text/html")
    assert '<script src="/ui/app.js">' in index.text
    js = _get(app, "/ui/app.js")
    assert js.status_code == 200
    assert js.headers["content-type"].startswith("text/javascript")
    assert _get(app, "/ui/vendor/uPlot.iife.min.js").text.startswith("/*! https://github.com/leeoniya/uPlot")
    assert "MIT" in _get(app, "/ui/vendor/uPlot.LICENSE").text


def test_the_page_names_its_icon_so_the_browser_never_asks_for_favicon_ico(app):
    """Without a declared icon every browser asks /favicon.ico, a 404 and a console error on every load."""
    assert '<link rel="icon" href="data:,">' in _get(app, "/").text
    assert _get(app, "/favicon.ico").status_code == 404  # nothing is served for it: none is asked


def test_the_data_still_needs_a_token(app):
    assert _get(app, "/v1/health/snapshot").status_code == 401


@pytest.mark.parametrize("path", ["/ui/nope.js", "/ui/../__init__.py", "/ui/%2e%2e/__init__.py", "/ui/"])
def test_only_the_ui_files_are_served(app, path):
    r = _get(app, path)
    assert r.status_code == 404, r.text


def test_the_ui_is_not_part_of_the_api_schema(app):
    paths = _get(app, "/openapi.json").json()["paths"]
    assert "/" not in paths
    assert not any(p.startswith("/ui") for p in paths)


def test_every_static_file_is_package_data():
    import tomllib
    from fnmatch import fnmatch
    from pathlib import Path

    conf = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    globs = conf["tool"]["setuptools"]["package-data"]["kernel_insight.api.ui"]
    files = [p.relative_to(STATIC_DIR.parent).as_posix() for p in STATIC_DIR.rglob("*") if p.is_file()]
    assert files
    assert all(any(fnmatch(f, g) and f.count("/") == g.count("/") for g in globs) for f in files)


def test_a_browser_that_cannot_start_says_why(monkeypatch):
    """What the browser tests' skip message and make bench-ui's error are made of."""
    import sys
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])
    if repo not in sys.path:
        sys.path.insert(0, repo)
    import bench.ui

    monkeypatch.setattr(bench.ui, "CHROMIUM", "/nonexistent/chromium")
    with (
        pytest.raises(RuntimeError, match=r"/nonexistent/chromium is missing: install Debian's chromium"),
        bench.ui.chromium(),
    ):
        pass


def test_the_editor_words_are_kql_grammar_and_registries(app):
    """``/ui/kql.json`` (the query editor's highlighting) is read from kql, not listed in app.js:
    every aggregator and function of the registries, the grammar's keywords including the ones
    app.js once lacked (``anchored``, ``smoothed``, ``fill``), and the keywords a label list follows."""
    from kernel_insight.kql.aggregators import AGGREGATORS
    from kernel_insight.kql.functions import FUNCTIONS
    from kernel_insight.kql.parser import parse

    r = _get(app, "/ui/kql.json")
    assert r.status_code == 200
    words = r.json()
    assert set(words["aggregators"]) == set(AGGREGATORS)
    assert set(FUNCTIONS) <= set(words["functions"])
    assert {"anchored", "smoothed", "fill", "bool", "offset", "atan2", "and", "or", "unless"} <= set(
        words["keywords"]
    )
    assert set(words["grouping"]) == {"by", "without", "on", "ignoring", "group_left", "group_right"}
    assert set(words["call_keywords"]) == {"fill", "fill_left", "fill_right"}
    for agg in words["aggregators"]:  # each is parsed as an aggregation where the editor says so
        arg = "1, x" if agg in ("topk", "bottomk", "quantile", "limitk", "limit_ratio") else "x"
        arg = '"v", x' if agg == "count_values" else arg
        assert type(parse(f"{agg} by (a) ({arg})")).__name__ == "AggregateExpr", agg
    js = _get(app, "/ui/app.js").text
    assert '"sum", "avg"' not in js  # the old hard-coded list is gone


def test_the_result_units_are_kql_registries_and_app_js_handles_each(app):
    """``/ui/kql.json``'s ``result_units`` (what queryUnit labels a chart with) are the registries'
    ``result_unit``: the UI's unit rules read them; app.js holds each kind, and no function name."""
    from kernel_insight.kql.aggregators import AGGREGATORS
    from kernel_insight.kql.ast import RESULT_UNITS
    from kernel_insight.kql.functions import FUNCTIONS

    units = _get(app, "/ui/kql.json").json()["result_units"]
    specs = {**FUNCTIONS, **AGGREGATORS}
    assert units == {name: spec.result_unit for name, spec in specs.items() if spec.result_unit}
    assert {units[f] for f in ("count", "count_values", "group", "count_over_time", "histogram_count")} == {
        "unitless"
    }
    assert {units[f] for f in ("absent", "absent_over_time", "changes", "resets", "present_over_time")} == {
        "unitless"
    }
    assert units["time"] == units["timestamp"] == "unitless"
    assert units["rate"] == units["irate"] == units["deriv"] == "per_second"
    assert {
        units[f] for f in ("histogram_quantile", "histogram_avg", "histogram_stddev", "histogram_stdvar")
    } == {"bucket_unit"}
    assert units["histogram_fraction"] == "ratio"
    assert not {"sum", "increase", "histogram_sum"} & set(units)  # the argument's unit
    js = _get(app, "/ui/app.js").text
    for kind in RESULT_UNITS[1:]:
        assert f'"{kind}"' in js, f"app.js does not handle the result unit {kind!r}"


def test_app_js_lists_no_kql_function_or_aggregator(app):
    """kql's names reach the UI through ``/ui/kql.json`` only: a string in app.js naming a function
    or aggregator (a set of them, as COUNTING or PER_SECOND once were) fails here. ``range``,
    ``step`` and ``scalar`` are also words of the HTTP API (parameters, a ``resultType``)."""
    import re

    from kernel_insight.kql.aggregators import AGGREGATORS
    from kernel_insight.kql.functions import FUNCTIONS

    js = _get(app, "/ui/app.js").text
    named = {m.group(2) for m in re.finditer(r"([\"'`])([A-Za-z_][A-Za-z0-9_]*)\1", js)}
    assert named & (set(FUNCTIONS) | set(AGGREGATORS)) <= {"range", "step", "scalar"}
