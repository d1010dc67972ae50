"""The Prometheus HTTP API over kql: parameters, shapes, error types and codes as Prometheus answers them."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from api_helpers import FakeSource, TestClient, build_app
from fastapi import FastAPI

from kernel_insight.api import Authenticator
from kernel_insight.api.prometheus import _kql_error
from kernel_insight.collector.clickhouse.store import StorageUnavailable
from kernel_insight.kql.engine import Engine
from kernel_insight.kql.errors import KqlEvaluationError, QueryCancelledError, QueryTimeoutError
from kernel_insight.kql.errors import StorageError as KqlStorageError
from kernel_insight.kql.storage import MemoryStorage

T0 = 1_700_000_000  # seconds


@pytest.fixture
def storage():
    s = MemoryStorage()
    for inst, gpu in (("n1", "0"), ("n1", "1"), ("n2", "0")):
        ts = [(T0 + i * 15) * 1000 for i in range(41)]
        s.add(
            {"__name__": "kernel_launches_total", "instance": inst, "gpu": gpu},
            ts,
            [i * 30.0 for i in range(41)],
        )
        s.add(
            {"__name__": "gpu_temperature_celsius", "instance": inst, "gpu": gpu}, ts, [60.0 + int(gpu)] * 41
        )
    return s


@pytest.fixture
def client(storage, tokens, auth_headers):
    app, _ = build_app(FakeSource(), Authenticator(tokens), storage, clock=lambda: T0 + 600.0)
    c = TestClient(app)
    c.headers.update(auth_headers)
    return c


def _ok(r):
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "success"
    return body["data"]


def _err(r, status, error_type, fragment):
    assert r.status_code == status, r.text
    body = r.json()
    assert body["status"] == "error"
    assert body["errorType"] == error_type
    assert fragment in body["error"]


def test_instant_query_get_and_post_match_the_engine(client, storage):
    expected = Engine(storage).instant_query(
        "sum by (instance) (rate(kernel_launches_total[5m]))", (T0 + 600) * 1000
    )
    q = {"query": "sum by (instance) (rate(kernel_launches_total[5m]))", "time": str(T0 + 600)}
    assert _ok(client.get("/api/v1/query", params=q)) == expected.to_prometheus_json()
    assert _ok(client.post("/api/v1/query", data=q)) == expected.to_prometheus_json()
    data = _ok(client.get("/api/v1/query", params=q))
    assert data["resultType"] == "vector"
    assert [s["metric"]["instance"] for s in data["result"]] == ["n1", "n2"]
    assert data["result"][0]["value"][0] == T0 + 600
    assert float(data["result"][0]["value"][1]) == pytest.approx(4.0)


def test_time_defaults_to_now_and_accepts_rfc3339(client):
    assert _ok(client.get("/api/v1/query", params={"query": "time()"}))["result"] == [T0 + 600, str(T0 + 600)]
    data = _ok(client.get("/api/v1/query", params={"query": "time()", "time": "2023-11-14T22:13:20Z"}))
    assert data == {"resultType": "scalar", "result": [T0, str(T0)]}


def test_range_query_with_duration_and_float_steps(client):
    q = {
        "query": "gpu_temperature_celsius{instance='n2'}",
        "start": str(T0),
        "end": str(T0 + 60),
        "step": "15s",
    }
    data = _ok(client.get("/api/v1/query_range", params=q))
    assert data["resultType"] == "matrix"
    assert [v[0] for v in data["result"][0]["values"]] == [T0, T0 + 15, T0 + 30, T0 + 45, T0 + 60]
    assert _ok(client.post("/api/v1/query_range", data={**q, "step": "15"})) == data


@pytest.mark.parametrize(
    ("path", "params", "fragment"),
    [
        (
            "/api/v1/query",
            {"query": "sum(rate(x[5m])"},
            'invalid parameter "query": 1:16: parse error: unexpected end of input',
        ),
        (
            "/api/v1/query_range",
            {"query": "sum(", "start": "0", "end": "10", "step": "1"},
            'invalid parameter "query": 1:5: parse error: unexpected end of input',
        ),
        ("/api/v1/format_query", {"query": "x{"}, 'invalid parameter "query": 1:3: parse error'),
        ("/api/v1/query", {}, 'invalid parameter "query"'),
        (
            "/api/v1/query",
            {"query": "1", "time": "yesterday"},
            'invalid parameter "time": cannot parse "yesterday"',
        ),
        ("/api/v1/query", {"query": "1", "time": "nan"}, 'invalid parameter "time"'),
        ("/api/v1/query", {"query": "1", "timeout": "soon"}, 'invalid parameter "timeout"'),
        ("/api/v1/query_range", {"query": "1", "end": "1", "step": "1"}, 'invalid parameter "start"'),
        (
            "/api/v1/query_range",
            {"query": "1", "start": "10", "end": "1", "step": "1"},
            "end timestamp must not be before",
        ),
        (
            "/api/v1/query_range",
            {"query": "1", "start": "1", "end": "10", "step": "0"},
            "zero or negative query resolution",
        ),
        (
            "/api/v1/query_range",
            {"query": "1", "start": "1", "end": "10", "step": "x"},
            'invalid parameter "step"',
        ),
        (
            "/api/v1/query_range",
            {"query": "1", "start": "0", "end": "100000", "step": "1"},
            "exceeded maximum resolution",
        ),
        ("/api/v1/query_range", {"query": "x[5m]", "start": "0", "end": "10", "step": "1"}, "range vector"),
        ("/api/v1/series", {}, "no match[] parameter provided"),
        ("/api/v1/series", {"match[]": "rate(x[5m])"}, "not a series selector"),
        ("/api/v1/series", {"match[]": '{a=""}'}, "at least one non-empty matcher"),
        ("/api/v1/series", {"match[]": "up", "start": "x"}, 'invalid parameter "start"'),
        ("/api/v1/labels", {"match[]": "up{"}, 'invalid parameter "match[]"'),
        ("/api/v1/label/bad-name/values", {}, 'invalid label name: "bad-name"'),
        ("/api/v1/labels", {"limit": "-1"}, 'invalid parameter "limit"'),
    ],
)
def test_bad_requests_are_bad_data_400(client, path, params, fragment):
    _err(client.get(path, params=params), 400, "bad_data", fragment)


def test_execution_errors_are_422(client):
    # Two series with the same labels after dropping the metric name.
    r = client.get(
        "/api/v1/query", params={"query": "{__name__=~'kernel_launches_total|gpu_temperature_celsius'} * 1"}
    )
    _err(r, 422, "execution", "")


def test_series_labels_and_values(client):
    data = _ok(client.get("/api/v1/series", params={"match[]": "gpu_temperature_celsius{gpu='0'}"}))
    assert data == [
        {"__name__": "gpu_temperature_celsius", "gpu": "0", "instance": "n1"},
        {"__name__": "gpu_temperature_celsius", "gpu": "0", "instance": "n2"},
    ]
    form = "match[]=up&match[]=" + quote("kernel_launches_total{gpu='1'}")
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    two = _ok(client.post("/api/v1/series", content=form, headers=headers))
    assert two == [{"__name__": "kernel_launches_total", "gpu": "1", "instance": "n1"}]
    assert _ok(client.get("/api/v1/labels")) == ["__name__", "gpu", "instance"]
    assert _ok(client.get("/api/v1/label/instance/values", params={"match[]": "up"})) == []
    assert _ok(client.get("/api/v1/label/__name__/values")) == [
        "gpu_temperature_celsius",
        "kernel_launches_total",
    ]
    r = client.get("/api/v1/label/instance/values", params={"limit": "1"})
    assert r.json()["data"] == ["n1"]
    assert r.json()["warnings"] == ["results truncated due to limit"]


def test_series_outside_the_window_are_not_listed(client):
    params = {"match[]": "gpu_temperature_celsius", "start": str(T0 + 10_000), "end": str(T0 + 20_000)}
    assert _ok(client.get("/api/v1/series", params=params)) == []


def test_metadata_and_buildinfo(client):
    meta = _ok(client.get("/api/v1/metadata"))
    assert meta["gpu_memory_free_bytes"] == [
        {"type": "gauge", "help": "Device memory free.", "unit": "bytes"}
    ]
    one = _ok(client.get("/api/v1/metadata", params={"metric": "gpu_power_watts"}))
    assert list(one) == ["gpu_power_watts"]
    assert _ok(client.get("/api/v1/metadata", params={"metric": "nope"})) == {}
    assert set(_ok(client.get("/api/v1/status/buildinfo"))) >= {"version", "revision", "goVersion"}


def test_too_many_samples_is_an_execution_error(storage, tokens, auth_headers):
    from kernel_insight.api import prometheus_router
    from kernel_insight.api.errors import install_error_handlers
    from kernel_insight.kql.engine import EngineLimits

    app = FastAPI()
    app.include_router(
        prometheus_router(lambda: storage, Authenticator(tokens), limits=EngineLimits(max_samples=10))
    )
    install_error_handlers(app)
    r = TestClient(app).get(
        "/api/v1/query",
        params={"query": "sum(count_over_time(kernel_launches_total[10m]))", "time": str(T0 + 600)},
        headers=auth_headers,
    )
    _err(r, 422, "execution", "")


@pytest.mark.parametrize(
    ("exc", "status", "error_type"),
    [
        (QueryTimeoutError("took 30 s"), 503, "timeout"),
        (QueryCancelledError("stopped"), 499, "canceled"),
        (KqlStorageError("select failed"), 500, "internal"),
        (KqlEvaluationError("duplicate series"), 422, "execution"),
    ],
)
def test_engine_errors_map_to_prometheus_codes(exc, status, error_type):
    r = _kql_error(exc)
    assert r.status_code == status
    assert json.loads(r.body)["errorType"] == error_type


def test_store_unavailable_is_a_503_with_retry_after():
    try:
        raise KqlStorageError("select failed") from StorageUnavailable("connection refused", retry_after_s=7)
    except KqlStorageError as exc:
        r = _kql_error(exc)
    assert r.status_code == 503
    assert r.headers["retry-after"] == "7"
    assert "connection refused" in json.loads(r.body)["error"]


def test_format_query_and_exemplars(client):
    assert _ok(client.get("/api/v1/format_query", params={"query": "sum by(a)(rate(x{y='1'}[5m]))"})) == (
        'sum by (a) (rate(x{y="1"}[5m]))'
    )
    _err(client.get("/api/v1/format_query", params={"query": "sum("}), 400, "bad_data", "parse error")
    assert _ok(client.post("/api/v1/query_exemplars", data={"query": "up", "start": "0", "end": "10"})) == []
    _err(client.get("/api/v1/query_exemplars", params={"query": "up{"}), 400, "bad_data", "parse error")


class DownStorage(MemoryStorage):
    def select(self, matchers, start_ms, end_ms, hints=None):
        raise StorageUnavailable("ClickHouse connection refused", retry_after_s=3)

    def label_names(self, matchers, start_ms, end_ms, hints=None):
        raise StorageUnavailable("ClickHouse connection refused", retry_after_s=3)


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/v1/query", {"query": "up"}),
        ("/api/v1/series", {"match[]": "up"}),
        ("/api/v1/labels", {}),
    ],
)
def test_an_unreachable_store_is_a_503_with_retry_after(tokens, auth_headers, path, params):
    app, _ = build_app(FakeSource(), Authenticator(tokens), DownStorage())
    r = TestClient(app).get(path, params=params, headers=auth_headers)
    _err(r, 503, "unavailable", "connection refused")
    assert r.headers["retry-after"] == "3"
