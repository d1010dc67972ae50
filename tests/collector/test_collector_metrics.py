"""The collector's /metrics: what it counts, that promtool accepts it, and that label values stay bounded."""

from __future__ import annotations

import shutil
import subprocess
import time

import httpx
import pytest
from loopback import running_server

from kernel_insight.collector import CollectorMetrics, EmbeddedStore, SampleBuilder, create_app


@pytest.fixture
def store(tmp_path):
    s = EmbeddedStore(tmp_path / "data")
    yield s
    s.close()


def _value(text: str, series: str) -> float:
    """The value of one exposed series (exact name and labels as printed)."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} not exposed:\n{text}")


def test_requests_counted_by_route_template_and_unknown_paths_as_other(store):
    app = create_app(store)
    with running_server(app) as url, httpx.Client(base_url=url) as client:
        assert client.get("/healthz").status_code == 200
        for i in range(3):
            assert client.get(f"/no/such/path/{i}").status_code == 404
        assert client.request("TRACE", "/healthz").status_code == 405
        text = client.get("/metrics").text
    assert (
        _value(text, 'ki_collector_http_requests_total{endpoint="/healthz",method="GET",status="200"}') == 1
    )
    # Raw paths and made-up methods never become label values: a client cannot grow the series count.
    assert _value(text, 'ki_collector_http_requests_total{endpoint="other",method="GET",status="404"}') == 3
    assert "/no/such/path" not in text
    assert "TRACE" not in text
    assert (
        _value(text, 'ki_collector_http_requests_total{endpoint="/healthz",method="other",status="405"}') == 1
    )
    assert _value(text, 'ki_collector_http_request_duration_seconds_count{endpoint="/healthz"}') == 2
    assert "_created" not in text


def test_every_insert_counts_rows_by_table_and_is_timed(store):
    app = create_app(store)
    b = SampleBuilder()
    for t in range(5):
        b.add({"__name__": "up", "instance": "a"}, int(time.time() * 1000) + t, 1.0)
    store.insert_samples(b.build())
    text = app.state.metrics.exposition()[0].decode()
    assert _value(text, 'ki_collector_rows_total{outcome="stored",table="samples"}') == 5
    assert _value(text, 'ki_collector_rows_total{outcome="stored",table="series"}') == 1
    assert _value(text, 'ki_collector_insert_duration_seconds_count{table="samples"}') == 1


def test_store_stats_are_read_in_the_background_not_per_scrape(store):
    app = create_app(store)
    stats = app.state.metrics.store_stats
    text = app.state.metrics.exposition()[0].decode()
    assert _value(text, "ki_store_stats_timestamp_seconds") == 0  # not read yet: no figures invented
    assert "ki_store_active_parts{" not in text
    b = SampleBuilder()
    b.add({"__name__": "up"}, int(time.time() * 1000), 1.0)  # recent: a 1970 sample would expire by TTL
    store.insert_samples(b.build())
    stats.refresh()
    text = app.state.metrics.exposition()[0].decode()
    assert _value(text, 'ki_store_active_parts{table="samples"}') >= 1
    assert _value(text, 'ki_store_rows{table="samples"}') == 1
    assert _value(text, "ki_store_stats_timestamp_seconds") > 0


def test_agent_counters_exported_under_the_stored_names_and_forgotten_after_ttl():
    now = [1_000.0]
    metrics = CollectorMetrics(agent_ttl_s=60, clock=lambda: now[0], process=False)
    agents = metrics.agents
    counters = {"ring_dropped": 7, "spool_batches": 3, "drain_lag_ns": 2e9, "batches_dead_lettered": 2}
    agents.observe("ab12", int(990.5e9), counters, 1_000.0)
    text = metrics.exposition()[0].decode()
    assert _value(text, 'ki_agent_ring_dropped_total{agent="ab12"}') == 7
    assert "# TYPE ki_agent_ring_dropped_total counter" in text
    assert _value(text, 'ki_agent_spool_batches{agent="ab12"}') == 3
    assert _value(text, 'ki_agent_drain_lag_seconds{agent="ab12"}') == 2.0  # scaled as the stored series
    assert _value(text, 'ki_agent_batches_dead_lettered_total{agent="ab12"}') == 2
    assert _value(text, 'ki_collector_agent_ingest_lag_seconds{agent="ab12"}') == pytest.approx(9.5)
    # An older batch arriving late (a retry) does not move the agent's figures back.
    agents.observe("ab12", int(900e9), {"ring_dropped": 1}, 999.0)
    assert agents.lag_s("ab12") == pytest.approx(9.5)
    now[0] += 61
    assert 'agent="ab12"' not in metrics.exposition()[0].decode()


def test_text_format_whatever_the_scraper_prefers(store):
    """Prometheus asks for OpenMetrics first; every Prometheus reads text 0.0.4, which the
    pre-rendered per-agent section is written in."""
    app = create_app(store)
    prometheus_accept = (
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
        "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    )
    with running_server(app) as url, httpx.Client(base_url=url) as client:
        r = client.get("/metrics", headers={"Accept": prometheus_accept})
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "# EOF" not in r.text


def test_pre_rendered_agent_lines_equal_what_prometheus_client_renders():
    from prometheus_client import CollectorRegistry, generate_latest

    from kernel_insight.collector.ingest import counter_name

    metrics = CollectorMetrics(process=False)
    now = time.time()
    for a in range(3):
        counters = {
            counter_name(i): float(i * a + 0.5) for i in range(1, 30)
        }  # 28, 29: newer than this collector
        metrics.agents.observe(f"{a:032x}", int((now - 2.25) * 1e9), counters, now)
    registry = CollectorRegistry()
    registry.register(metrics.agents)
    assert set(metrics.agents.render_text().decode().splitlines()) == set(
        generate_latest(registry).decode().splitlines()
    )


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed"
)
def test_promtool_accepts_the_exposition(store):
    app = create_app(store)
    with running_server(app) as url, httpx.Client(base_url=url) as client:
        client.get("/healthz")
        app.state.metrics.agents.observe("ab12", 0, {"records_read": 5, "counter_99": 1}, 1.0)
        app.state.metrics.store_stats.refresh()
        text = client.get("/metrics").text
    check = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_records_dropped_at_derivation_are_exported_by_reason():
    from kernel_insight.collector.derive import DROP_REASONS, DropStats

    drops = DropStats()
    metrics = CollectorMetrics(process=False, drop_stats=drops)
    text = metrics.exposition()[0].decode()
    for reason in DROP_REASONS:  # measured zeros: every reason is there from the start
        assert _value(text, f'ki_collector_records_dropped_total{{reason="{reason}"}}') == 0
    drops.add({"bucket_out_of_range": 3})
    text = metrics.exposition()[0].decode()
    assert _value(text, 'ki_collector_records_dropped_total{reason="bucket_out_of_range"}') == 3


def test_group_commit_figures_come_from_the_batcher(store):
    from kernel_insight.collector.batcher import Batcher

    metrics = CollectorMetrics(process=False)
    batcher = Batcher(store, max_delay_s=0.01)
    metrics.watch_batcher(batcher)
    batcher.start()
    try:
        now = int(time.time() * 1000)
        futures = []
        for i in range(3):
            b = SampleBuilder()
            for t in range(10):
                b.add({"__name__": "up", "instance": f"a{i}"}, now + t, 1.0)
            futures.append(batcher.submit(store.prepare(f"agent:1:{i}", samples=b.build())).answer())
        assert all(f.result(timeout=30) for f in futures)
    finally:
        batcher.shutdown()
    text = metrics.exposition()[0].decode()
    assert _value(text, "ki_collector_batcher_flushed_batches_total") == 3
    assert _value(text, "ki_collector_batcher_queue_batches") == 0
    flushes = _value(text, "ki_collector_batcher_flushes_total")
    assert 1 <= flushes <= 3
    assert _value(text, "ki_collector_batcher_flush_rows_count") == flushes
    assert _value(text, 'ki_collector_batcher_flush_rows_bucket{le="+Inf"}') == flushes
    assert _value(text, "ki_collector_batcher_flush_rows_sum") >= 30  # samples, plus series and batches rows
    assert _value(text, "ki_collector_batcher_flush_duration_seconds_count") == flushes
