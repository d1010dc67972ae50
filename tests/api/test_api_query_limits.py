"""Hostile queries through the Prometheus API: 400s with a position, bounded bodies, the deadline, the sample limit."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence

import pytest
from api_helpers import FakeSource, TestClient, build_app
from fastapi import FastAPI

from kernel_insight.api import Authenticator, create_api_app
from kernel_insight.api.errors import install_error_handlers
from kernel_insight.api.prometheus import prometheus_router
from kernel_insight.cli import build_parser
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import SampleBuilder
from kernel_insight.kql.engine import EngineLimits
from kernel_insight.kql.errors import TooManySamplesError
from kernel_insight.kql.storage import NO_HINTS, Matcher, MemoryStorage, SelectHints, SeriesData
from kernel_insight.server import _query_limits

T0 = 1_700_000_000
TOO_MANY = TooManySamplesError.MESSAGE


@pytest.fixture
def storage() -> MemoryStorage:
    s = MemoryStorage()
    ts = [(T0 + i * 15) * 1000 for i in range(41)]
    for gpu in range(3):
        s.add({"__name__": "up", "gpu": str(gpu), "job": "a" * 28 + "!"}, ts, [1.0] * 41)
    return s


@pytest.fixture
def client(storage, tokens, auth_headers) -> TestClient:
    app, _ = build_app(FakeSource(), Authenticator(tokens), storage, clock=lambda: T0 + 600.0)
    c = TestClient(app)
    c.headers.update(auth_headers)
    return c


def _bad_data(r, fragment: str, status: int = 400) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert (body["status"], body["errorType"]) == ("error", "bad_data")
    assert fragment in body["error"], body["error"]
    return str(body["error"])


HOSTILE = [
    ("+".join(["1"] * 500), "nests too deeply"),
    ("(" * 500 + "up" + ")" * 500, "nests too deeply"),
    ("up @ 1e300", "timestamp out of bounds for @ modifier"),
    ("up offset 9999999999999999999d", "duration out of range"),
    ("up[9999999999999d]", "duration out of range"),
    ('up{job=~"(a+"}', "error parsing regexp: missing closing )"),
]


@pytest.mark.parametrize(("query", "fragment"), HOSTILE)
def test_hostile_queries_are_bad_data_with_a_position(client, query: str, fragment: str) -> None:
    for r in (
        client.get("/api/v1/query", params={"query": query}),
        client.post("/api/v1/query", data={"query": query}),
        client.get("/api/v1/query_range", params={"query": query, "start": T0, "end": T0 + 60, "step": 15}),
        client.get("/api/v1/format_query", params={"query": query}),
        client.get("/api/v1/query_exemplars", params={"query": query}),
    ):
        error = _bad_data(r, fragment)
        # line:column of the problem; query, query_range and format_query name the parameter
        # first, as Prometheus 3 does (exemplars do not).
        where = error.removeprefix('invalid parameter "query": ')
        assert where.startswith("1:"), error
        assert (where != error) == ("exemplars" not in str(r.url)), error


def test_an_overlong_query_is_bad_data_at_once(client) -> None:
    query = "up{" + ",".join(f'a{i}="x"' for i in range(20_000)) + "}"  # 228 KB: minutes to parse
    began = time.monotonic()
    _bad_data(client.post("/api/v1/query", data={"query": query}), "query is too long")
    assert time.monotonic() - began < 5


@pytest.mark.parametrize("selector", ["(" * 500 + "up" + ")" * 500, "up offset 9999999999999999999d"])
def test_hostile_match_selectors_are_bad_data(client, selector: str) -> None:
    for path in ("/api/v1/series", "/api/v1/labels", "/api/v1/label/gpu/values"):
        _bad_data(client.get(path, params={"match[]": selector}), 'invalid parameter "match[]"')


def test_a_backtracking_regex_is_answered_within_the_timeout(client) -> None:
    # The query: with Python's re it held the GIL for 15.7 s at 27 characters, ignoring timeout=2s.
    query = 'label_replace(up, "dst", "x", "job", "(a+)+b") or up{job=~"(a|aa)+b"}'
    began = time.monotonic()
    r = client.get("/api/v1/query", params={"query": query, "timeout": "2s", "time": T0 + 300})
    assert time.monotonic() - began < 5
    assert r.status_code == 200, r.text
    assert len(r.json()["data"]["result"]) == 3


def _limited_client(storage, tokens, auth_headers, **kwargs) -> TestClient:
    app = FastAPI()
    app.include_router(prometheus_router(lambda: storage, Authenticator(tokens), **kwargs))
    install_error_handlers(app)
    c = TestClient(app)
    c.headers.update(auth_headers)
    return c


def test_form_bodies_are_capped(storage, tokens, auth_headers) -> None:
    c = _limited_client(storage, tokens, auth_headers, max_form_bytes=1024)
    assert c.post("/api/v1/query", data={"query": "1", "time": "0"}).status_code == 200
    big = {"query": "1", "pad": "x" * 2000}
    _bad_data(c.post("/api/v1/query", data=big), "http: POST too large", status=413)

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: refused while it streams in
        yield b"query=1&pad="
        for _ in range(100):
            yield b"x" * 100

    r = c.post(
        "/api/v1/query", content=chunks(), headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    _bad_data(r, "http: POST too large", status=413)


class SlowStorage(MemoryStorage):
    """Every select takes 0.1 s, so a query of many selectors runs past a short timeout."""

    def select(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> list[SeriesData]:
        time.sleep(0.1)
        return super().select(matchers, start_ms, end_ms, hints)


def test_a_query_over_its_timeout_is_a_503_timeout(tokens, auth_headers) -> None:
    c = _limited_client(SlowStorage(), tokens, auth_headers)
    query = " + ".join(["up"] * 50)  # 5 s of selects
    began = time.monotonic()
    r = c.get("/api/v1/query", params={"query": query, "time": "0", "timeout": "300ms"})
    assert time.monotonic() - began < 3
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["errorType"] == "timeout"
    assert body["error"].startswith("query timed out in expression evaluation")
    assert body["error"].count("timed out") == 1


def test_the_sample_limit_is_422_with_prometheus_text(storage, tokens, auth_headers) -> None:
    c = _limited_client(storage, tokens, auth_headers, limits=EngineLimits(max_samples=50))
    r = c.get("/api/v1/query_range", params={"query": "up", "start": T0, "end": T0 + 600, "step": 15})
    assert r.status_code == 422, r.text
    assert r.json() == {
        "status": "error",
        "errorType": "execution",
        "error": "query processing would load too many samples into memory in query execution",
    }
    # Held at once, not summed over steps: 3 series x 41 steps of 10-minute windows is ~15k window
    # samples, but only 123 loaded samples and 3 x 41 results are ever held together.
    c = _limited_client(storage, tokens, auth_headers, limits=EngineLimits(max_samples=400))
    r = c.get(
        "/api/v1/query_range",
        params={"query": "count_over_time(up[10m])", "start": T0, "end": T0 + 600, "step": 15},
    )
    assert r.status_code == 200, r.text


# ----------------------------------------------------------------------------------- the collector's settings


@pytest.fixture
def store(tmp_path):
    s = EmbeddedStore(tmp_path / "d")
    b = SampleBuilder()
    base = (int(time.time()) // 3600) * 3_600_000 - 3_600_000
    for i in range(30):
        ts = [base + k * 15_000 for k in range(40)]
        b.add_series({"__name__": "util", "gpu": str(i)}, ts, [float(k) for k in range(40)])
    s.insert_batch("seed", samples=b.build())
    yield s, base / 1000
    s.close()


def test_ki_collector_query_flags_set_the_limits() -> None:
    args = build_parser().parse_args(["collector", "--query-timeout", "5", "--query-max-samples", "100"])
    assert _query_limits(args) == EngineLimits(max_samples=100, timeout_s=5.0)
    defaults = _query_limits(build_parser().parse_args(["collector"]))
    assert defaults == EngineLimits()
    with pytest.raises(SystemExit):  # refused by the flag's type (tests/foundation/test_cli_ring.py)
        build_parser().parse_args(["collector", "--query-max-samples", "0"])


def test_the_collector_app_applies_its_query_limits_to_queries_and_listings(store) -> None:
    s, base = store
    app = create_api_app(s, local_dev=True, interval_s=3600, query_limits=EngineLimits(max_samples=200))
    c = TestClient(app)
    window = {"start": base, "end": base + 600}
    r = c.get("/api/v1/query_range", params={"query": "util", "step": 15, **window})
    assert (r.status_code, r.json()["error"]) == (422, TOO_MANY)
    # /api/v1/series reads the matching series' samples: refused past the limit too (by ClickHouse's
    # max_result_rows on a read, or once counted when the hours come from the sample cache).
    r = c.get("/api/v1/series", params={"match[]": "util", **window})
    assert (r.status_code, r.json()["error"]) == (422, TOO_MANY)
    roomy = TestClient(create_api_app(s, local_dev=True, interval_s=3600))
    assert len(roomy.get("/api/v1/series", params={"match[]": "util", **window}).json()["data"]) == 30
