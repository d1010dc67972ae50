"""ClickHouseStorage answers exactly as kql's MemoryStorage on the same data, on both back ends."""

from __future__ import annotations

import contextlib
import random
import time

import numpy as np
import pytest
from chdb_http import running_shim

from kernel_insight.collector.clickhouse.query import matcher_sql
from kernel_insight.collector.clickhouse.sql import Params
from kernel_insight.collector.clickhouse.store import EmbeddedStore, ServerStore
from kernel_insight.collector.head import DEFAULT_HEAD_BYTES
from kernel_insight.collector.rows import SampleBuilder
from kernel_insight.kql.storage import STALE_NAN, Matcher, MemoryStorage, Storage

BASE = (int(time.time()) // 3600) * 3_600_000 - 3_600_000


def _data():
    rng = random.Random(7)
    out = []
    for metric in ("gpu_temp_celsius", "kernel_launches_total", "up"):
        for gpu in ("0", "1", "2", "10"):
            for host in ("a", "b.example", "weird'host\\x", ""):
                labels = {"__name__": metric, "gpu": gpu, "host": host}
                if gpu == "2":
                    labels["rack"] = "r\n1"
                n = rng.randint(1, 20)
                ts = sorted(rng.sample(range(0, 600), n))
                vs = [rng.random() * 100 if rng.random() > 0.1 else STALE_NAN for _ in ts]
                out.append((labels, [BASE + t * 1000 for t in ts], vs))
    return out


@pytest.fixture(
    scope="module", params=["embedded", "embedded-head", "clickhouse-connect-chdb", "clickhouse-connect-http"]
)
def stores(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    shim = contextlib.ExitStack()
    if request.param == "embedded":
        store = EmbeddedStore(path)
    elif (
        request.param == "embedded-head"
    ):  # recent reads from the head (collector/head.py), as ki collector's
        store = EmbeddedStore(path, head_bytes=DEFAULT_HEAD_BYTES)
    elif request.param == "clickhouse-connect-chdb":
        # clickhouse-connect's own chDB backend: the ServerStore code path, in process.
        store = ServerStore.connect(f"chdb://{path}")
    else:
        # clickhouse-connect's HTTP client against the ClickHouse HTTP shim over chDB (another process).
        _, url = shim.enter_context(running_shim(path))
        store = ServerStore.connect(url)  # default client settings
    mem = MemoryStorage()
    b = SampleBuilder()
    for labels, ts, vs in _data():
        mem.add(labels, ts, vs)
        b.add_series(labels, ts, vs)
    store.insert_batch("seed", samples=b.build())
    deadline = time.monotonic() + 60
    while store.head is not None and not store.head.ready:
        assert time.monotonic() < deadline, "the head did not load"
        time.sleep(0.02)
    yield store.storage(), mem
    store.close()
    shim.close()


def test_is_a_kql_storage(stores):
    ch, _ = stores
    assert isinstance(ch, Storage)


MATCHERS = [
    [Matcher("__name__", "=", "up")],
    [Matcher("__name__", "=~", "gpu_.*|up")],
    [Matcher("__name__", "=~", "gpu")],  # anchored: matches nothing
    [Matcher("__name__", "!~", "up"), Matcher("gpu", "=~", "1|10")],
    [Matcher("gpu", "!=", "0"), Matcher("host", "=", "")],  # empty matches an absent label
    [Matcher("host", "=~", "weird'host\\\\x")],
    [Matcher("rack", "=~", "r.1")],  # `.` matches a newline, as in Prometheus
    [Matcher("rack", "!=", "")],
    [Matcher("nosuchlabel", "=", "")],
    [Matcher("host", "=~", "b\\.example")],
]
WINDOWS = [(BASE, BASE + 600_000), (BASE + 100_000, BASE + 200_000), (BASE + 5_000, BASE + 5_000), (0, 10)]


def _same(a, b):
    assert [d.labels for d in a] == [d.labels for d in b]
    for x, y in zip(a, b, strict=True):
        assert x.timestamps.tolist() == y.timestamps.tolist()
        assert x.values.view(np.uint64).tolist() == y.values.view(np.uint64).tolist()


@pytest.mark.parametrize("matchers", MATCHERS, ids=[str(i) for i in range(len(MATCHERS))])
def test_select_matches_memory_storage(stores, matchers):
    ch, mem = stores
    for start, end in WINDOWS:
        _same(ch.select(matchers, start, end), mem.select(matchers, start, end))


@pytest.mark.parametrize("matchers", MATCHERS, ids=[str(i) for i in range(len(MATCHERS))])
def test_label_names_and_values_match_memory_storage(stores, matchers):
    ch, mem = stores
    for start, end in WINDOWS:
        assert ch.label_names(matchers, start, end) == mem.label_names(matchers, start, end)
        for name in ("gpu", "host", "__name__", "rack"):
            assert ch.label_values(name, matchers, start, end) == mem.label_values(name, matchers, start, end)


def test_inverted_window_is_empty(stores):
    ch, _ = stores
    assert ch.select([Matcher("__name__", "=", "up")], BASE + 10, BASE) == []


def test_matcher_sql_sends_user_text_as_parameters():
    p = Params()
    assert matcher_sql(Matcher("a'b", "=", "x'); DROP TABLE t; --"), p) == "labels[{p0:String}] = {p1:String}"
    assert p == {"p0": "a'b", "p1": "x'); DROP TABLE t; --"}
    assert matcher_sql(Matcher("__name__", "=~", "a.*"), p) == "match(metric, {p2:String})"
    assert p["p2"] == "^(?s:a.*)$"


@pytest.mark.parametrize("backend", ["embedded", "clickhouse-connect-chdb", "clickhouse-connect-http"])
def test_user_text_reaches_the_engine_unchanged(backend, tmp_path):
    # Quotes, backslashes, tabs, newlines and placeholder syntax in label values select exactly their series.
    with contextlib.ExitStack() as stack:
        if backend == "embedded":
            store = stack.enter_context(EmbeddedStore(tmp_path))
        elif backend == "clickhouse-connect-chdb":
            store = stack.enter_context(ServerStore.connect(f"chdb://{tmp_path}"))
        else:
            _, url = stack.enter_context(running_shim(tmp_path))
            store = stack.enter_context(ServerStore.connect(url))
        tricky = "x'); DROP TABLE t; --\\\t\n\r\x00`{p0:String}é"
        b = SampleBuilder()
        b.add_series({"__name__": "odd", "v": tricky}, [BASE], [1.0])
        b.add_series({"__name__": "odd", "v": "plain"}, [BASE], [2.0])
        store.insert_batch("odd", samples=b.build())
        ch = store.storage()
        found = ch.select([Matcher("__name__", "=", "odd"), Matcher("v", "=", tricky)], BASE - 1, BASE + 1)
        assert [dict(s.labels)["v"] for s in found] == [tricky]
        regex = [Matcher("__name__", "=", "odd"), Matcher("v", "=~", "x'.*é")]
        assert [dict(s.labels)["v"] for s in ch.select(regex, BASE - 1, BASE + 1)] == [tricky]
        values = ch.label_values("v", [Matcher("__name__", "=", "odd")], BASE - 1, BASE + 1)
        assert values == sorted([tricky, "plain"])
