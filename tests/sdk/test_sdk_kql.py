"""KqlClient: typed results, retries with backoff on 5xx and connection errors, clear 4xx exceptions."""

from __future__ import annotations

import asyncio
import datetime as dt
from urllib.parse import parse_qs

import httpx
import numpy as np
import pytest

from kernel_insight.sdk import (
    AsyncKqlClient,
    AuthenticationError,
    BadRequestError,
    KqlClient,
    ServerError,
    TransportError,
)

VECTOR = {
    "status": "success",
    "data": {
        "resultType": "vector",
        "result": [
            {"metric": {"instance": "n1"}, "value": [1700000000, "1.5"]},
            {"metric": {}, "value": [1700000000, "NaN"]},
        ],
    },
    "warnings": ["PromQL warning: something (1:1)"],
}
MATRIX = {
    "status": "success",
    "data": {
        "resultType": "matrix",
        "result": [
            {
                "metric": {"gpu": "0"},
                "values": [[1700000000, "1"], [1700000015.5, "+Inf"], [1700000030, "-2"]],
            }
        ],
    },
}


class Script:
    """Answers from a list, in order; records the requests."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.requests = []

    def __call__(self, request):
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def kql(script, **kw):
    sleeps = []
    client = KqlClient("http://ki", "tok", transport=httpx.MockTransport(script), sleep=sleeps.append, **kw)
    return client, sleeps


def form(request):
    return {k: v[0] for k, v in parse_qs(request.content.decode()).items()}


def test_instant_query_is_typed_and_posts_the_parameters():
    script = Script(httpx.Response(200, json=VECTOR))
    client, _ = kql(script)
    r = client.query("sum(x)", time=dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC), timeout=5)
    assert r.result_type == "vector"
    assert r.samples[0].labels == {"instance": "n1"}
    assert r.samples[0].value == 1.5
    assert np.isnan(r.samples[1].value)
    assert r.warnings == ("PromQL warning: something (1:1)",)
    sent = form(script.requests[0])
    assert sent == {"query": "sum(x)", "time": "1700000000.0", "timeout": "5.0"}
    assert script.requests[0].url.path == "/api/v1/query"
    assert script.requests[0].headers["authorization"] == "Bearer tok"


def test_range_query_values_are_numpy_friendly():
    script = Script(httpx.Response(200, json=MATRIX))
    client, _ = kql(script)
    r = client.query_range("x", 1700000000, 1700000030, dt.timedelta(seconds=15))
    series = r.series[0]
    values = np.asarray(series.values)
    assert values.dtype == np.float64
    assert values.tolist() == [1.0, float("inf"), -2.0]
    assert np.frombuffer(series.timestamps, dtype=np.float64)[1] == 1700000015.5
    assert form(script.requests[0])["step"] == "15.0"


def test_scalar_and_string_results():
    script = Script(
        httpx.Response(200, json={"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}}),
        httpx.Response(
            200, json={"status": "success", "data": {"resultType": "string", "result": [1, "hi"]}}
        ),
    )
    client, _ = kql(script)
    assert client.query("2").scalar == 2.0
    assert client.query('"hi"').string == "hi"


def test_5xx_and_connection_errors_are_retried_with_backoff():
    script = Script(
        httpx.Response(
            503,
            json={"status": "error", "errorType": "unavailable", "error": "down"},
            headers={"Retry-After": "2"},
        ),
        httpx.ConnectError("refused"),
        httpx.Response(500, json={"status": "error", "errorType": "internal", "error": "boom"}),
        httpx.Response(200, json=VECTOR),
    )
    client, sleeps = kql(script, retries=3, backoff_s=0.1)
    assert client.query("x").result_type == "vector"
    assert len(script.requests) == 4
    assert sleeps[0] == 2.0  # the server's Retry-After
    assert 0 <= sleeps[1] <= 0.2
    assert 0 <= sleeps[2] <= 0.4


def test_persistent_failures_raise_after_the_retries():
    client, sleeps = kql(Script(*[httpx.ConnectError("refused")] * 3), retries=2)
    with pytest.raises(TransportError, match="after 3 attempts"):
        client.query("x")
    assert len(sleeps) == 2
    err = httpx.Response(502, json={"status": "error", "errorType": "internal", "error": "bad gateway"})
    client, _ = kql(Script(err, err), retries=1)
    with pytest.raises(ServerError) as info:
        client.query("x")
    assert info.value.status == 502


def test_4xx_raise_at_once_with_the_servers_error_type_and_message():
    body = {"status": "error", "errorType": "bad_data", "error": "1:5: parse error: unexpected end of input"}
    script = Script(httpx.Response(400, json=body))
    client, sleeps = kql(script)
    with pytest.raises(BadRequestError) as info:
        client.query("sum(")
    assert info.value.error_type == "bad_data"
    assert info.value.message == body["error"]
    assert sleeps == []
    client, _ = kql(
        Script(httpx.Response(401, json={"status": "error", "errorType": "unauthorized", "error": "no"}))
    )
    with pytest.raises(AuthenticationError):
        client.query("x")
    client, _ = kql(Script(httpx.Response(422, json={"detail": [{"msg": "bad"}]})))
    with pytest.raises(BadRequestError, match="bad"):
        client.query("x")


def test_naive_datetimes_are_refused():
    client, _ = kql(Script())
    with pytest.raises(ValueError, match="naive datetime"):
        client.query("x", time=dt.datetime(2024, 1, 1))


def test_async_client_retries_the_same_way():
    script = Script(httpx.ConnectError("refused"), httpx.Response(200, json=MATRIX))

    async def handler(request):
        return script(request)

    sleeps = []

    async def fake_sleep(s):
        sleeps.append(s)

    async def go():
        async with AsyncKqlClient("http://ki", transport=httpx.MockTransport(handler), sleep=fake_sleep) as c:
            return await c.query_range("x", 0, 30, "15s")

    r = asyncio.run(go())
    assert r.result_type == "matrix"
    assert len(sleeps) == 1
    assert form(script.requests[1])["step"] == "15s"


def test_native_histogram_results_are_parsed():
    """What ki collector sends for native histograms (kql's own encoder) comes back typed."""
    from kernel_insight.kql import Engine, MemoryStorage, prometheus_json_bytes
    from kernel_insight.kql.histogram import FloatHistogram
    from kernel_insight.sdk import Histogram, HistogramBucket

    store = MemoryStorage()
    h = FloatHistogram(schema=0, count=3, sum=2.5, positive_spans=((0, 2),), positive_buckets=(1.0, 2.0))
    store.add_histograms({"__name__": "lat", "job": "a"}, [0, 15_000], [h, h])
    store.add({"__name__": "lat", "job": "b"}, [0, 15_000], [1.0, 2.0])
    engine = Engine(store)

    def body(value):
        return b'{"status":"success","data":' + prometheus_json_bytes(value) + b"}"

    instant = engine.instant_query("lat", 15_000).value
    ranged = engine.range_query("lat", 0, 15_000, 15_000).value
    script = Script(
        httpx.Response(200, content=body(instant), headers={"content-type": "application/json"}),
        httpx.Response(200, content=body(ranged), headers={"content-type": "application/json"}),
    )
    client, _ = kql(script)
    r = client.query("lat")
    by_job = {s.labels["job"]: s for s in r.samples}
    assert by_job["a"].histogram == Histogram(
        3.0, 2.5, (HistogramBucket(0, 0.5, 1.0, 1.0), HistogramBucket(0, 1.0, 2.0, 2.0))
    )
    assert np.isnan(by_job["a"].value)
    assert by_job["b"].histogram is None
    assert by_job["b"].value == 2.0
    m = client.query_range("lat", 0, 15, 15)
    series = {s.labels["job"]: s for s in m.series}
    assert len(series["a"].values) == 0
    assert [t for t, _ in series["a"].histograms] == [0.0, 15.0]
    assert series["a"].histograms[1][1].count == 3.0
    assert list(series["b"].values) == [1.0, 2.0]
    assert series["b"].histograms == ()


def test_native_histogram_results_are_typed_as_prometheus_writes_them():
    # Prometheus' own JSON for a native histogram (web/api/v1 json codec): boundary rule, bounds, count.
    h = {"count": "5", "sum": "0.0123", "buckets": [[3, "-0.001", "0.001", "1"], [0, "0.0025", "0.005", "4"]]}
    from kernel_insight.sdk import Histogram, HistogramBucket, QueryResult

    vector = QueryResult.from_json(
        {"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"__name__": "kernel_duration_seconds"}, "histogram": [1700000000.5, h]},
            {"metric": {"__name__": "up"}, "value": [1700000000.5, "1"]},
        ]}}
    )  # fmt: skip
    hist, up = vector.samples
    assert hist.histogram == Histogram(
        5.0, 0.0123, (HistogramBucket(3, -0.001, 0.001, 1.0), HistogramBucket(0, 0.0025, 0.005, 4.0))
    )
    assert np.isnan(hist.value)
    assert hist.timestamp == 1700000000.5
    assert up.histogram is None
    assert up.value == 1.0

    matrix = QueryResult.from_json(
        {"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"k": "mixed"}, "values": [[10, "1"]], "histograms": [[20, h], [30, h]]},
        ]}}
    )  # fmt: skip
    (series,) = matrix.series
    assert list(series.values) == [1.0]
    assert [t for t, _ in series.histograms] == [20.0, 30.0]
    assert series.histograms[1][1].count == 5.0
