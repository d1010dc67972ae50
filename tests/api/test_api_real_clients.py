"""Real Prometheus clients against a running collector: promtool (Debian ``prometheus``) and prometheus-api-client."""

from __future__ import annotations

import shutil
import subprocess
import time
import warnings
from datetime import UTC

import pytest
from loopback import running_server

from kernel_insight.api import TokenStore, create_api_app
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import SampleBuilder

NOW_S = int(time.time()) // 60 * 60
PROMTOOL = shutil.which("promtool")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = EmbeddedStore(tmp_path_factory.mktemp("api-clients"))
    b = SampleBuilder()
    for inst in ("n1", "n2"):
        for i in range(21):
            t = (NOW_S - 300 + i * 15) * 1000
            b.add({"__name__": "gpu_power_watts", "instance": inst, "gpu": "0"}, t, 300.0 + i)
            b.add({"__name__": "kernel_launches_total", "instance": inst, "gpu": "0"}, t, 60.0 * i)
    s.insert_samples(b.build())
    yield s
    s.close()


@pytest.fixture(scope="module")
def local_url(store):
    """A server in local development mode: promtool 2.42 can send a header on range queries only."""
    with running_server(create_api_app(store, local_dev=True, interval_s=3600)) as url:
        yield url


@pytest.fixture(scope="module")
def secured(store, tmp_path_factory):
    tokens = TokenStore(tmp_path_factory.mktemp("tok") / "tokens.json")
    token = tokens.create("clients", ["read"]).token
    with running_server(create_api_app(store, tokens=tokens, interval_s=3600)) as url:
        yield url, token


def promtool(*args: str) -> str:
    assert PROMTOOL, "promtool missing: apt-get install -y prometheus"
    done = subprocess.run([PROMTOOL, "query", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package prometheus)"
)


@needs_promtool
def test_promtool_instant_query(local_url):
    out = promtool("instant", "--time", str(NOW_S), local_url, "sum by (instance) (gpu_power_watts)")
    assert out.splitlines() == [
        f'{{instance="n1"}} => 320 @[{NOW_S}]',
        f'{{instance="n2"}} => 320 @[{NOW_S}]',
    ]
    as_json = promtool("instant", "-o", "json", "--time", str(NOW_S), local_url, "count(gpu_power_watts)")
    assert f'"value":[{NOW_S},"2"]' in as_json.replace(" ", "")


@needs_promtool
def test_promtool_range_query_with_a_bearer_token(secured):
    url, token = secured
    args = ["--start", str(NOW_S - 60), "--end", str(NOW_S), "--step", "30s"]
    out = promtool(
        "range", *args, "--header", f"Authorization: Bearer {token}", url, "gpu_power_watts{instance='n2'}"
    )
    assert f"318 @[{NOW_S - 30}]" in out
    assert f"320 @[{NOW_S}]" in out
    refused = subprocess.run(
        [PROMTOOL, "query", "range", *args, url, "up"], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode != 0


@needs_promtool
def test_promtool_series_and_labels(local_url):
    out = promtool("series", "--match", "kernel_launches_total{instance='n1'}", local_url)
    assert out.strip() == '{__name__="kernel_launches_total", gpu="0", instance="n1"}'
    assert promtool("labels", local_url, "instance").split() == ["n1", "n2"]


def test_prometheus_api_client(secured):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # its dependencies' import-time warnings
        from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
    url, token = secured
    prom = PrometheusConnect(url=url, headers={"Authorization": f"Bearer {token}"})
    vec = prom.custom_query("sum by (instance) (gpu_power_watts)", params={"time": NOW_S})
    assert sorted((v["metric"]["instance"], v["value"][1]) for v in vec) == [("n1", "320"), ("n2", "320")]
    from datetime import datetime

    matrix = prom.custom_query_range(
        "rate(kernel_launches_total{instance='n1'}[1m])",
        start_time=datetime.fromtimestamp(NOW_S - 120, UTC),
        end_time=datetime.fromtimestamp(NOW_S, UTC),
        step="60",
    )
    assert [float(v) for _, v in matrix[0]["values"]] == pytest.approx([4.0, 4.0, 4.0])
    assert "instance" in prom.get_label_names()
    assert prom.get_label_values("instance") == ["n1", "n2"]
    assert prom.all_metrics() == ["gpu_power_watts", "kernel_launches_total"]
    with pytest.raises(PrometheusApiClientException, match="parse error"):
        prom.custom_query("sum(")
    unauthorised = PrometheusConnect(url=url)
    with pytest.raises(PrometheusApiClientException, match="401"):
        unauthorised.custom_query("up")
