"""Requests on a kept-alive connection are answered at once (Grafana, promtool and the SDK reuse connections)."""

from __future__ import annotations

import http.client
import statistics
import time

import httpx
from support.collector import running_collector

from kernel_insight.api.defaults import DEFAULT_KEEP_ALIVE_S
from kernel_insight.collector.remote_write import encode_write_request

#: Requests per round; the bound holds for the median of one round.
ROUND = 10
#: Seconds of rounds before the test gives up (a round behind delayed ACKs costs >= 400 ms).
BUDGET_S = 20.0


def test_requests_on_one_connection_take_under_5_ms_each_at_the_median_of_a_round(tmp_path):
    # Without TCP_NODELAY on accepted connections, every response after the first on a
    # connection waited ~40 ms for the client's delayed ACK: every round's median would be
    # ~40 ms. On a loaded host, other processes take the CPU between the client and the
    # collector for 5-50 ms at a time (the single 50-request median reached 21 ms at load 11);
    # that delays some rounds, never all of them, while a delayed ACK delays every one: the
    # best round's median is what separates the two. The health snapshot is rebuilt at its
    # production interval (5 s), not the tests' 0.5 s, which would take the GIL mid-round.
    with (
        running_collector(tmp_path, interval_s=5.0) as c,
        httpx.Client(base_url=c.url, timeout=10) as client,
    ):
        # Warm-up: the first request opens the connection; a second of requests lets the
        # collector's start-up work (schema, first health snapshot, first merges) pass.
        warm_until = time.monotonic() + 1.0
        while time.monotonic() < warm_until:
            assert client.get("/healthz").status_code == 200
        medians: list[float] = []
        give_up = time.monotonic() + BUDGET_S
        while not medians or (min(medians) >= 0.005 and time.monotonic() < give_up):
            took = []
            for _ in range(ROUND):
                t0 = time.perf_counter()
                assert client.get("/healthz").status_code == 200
                took.append(time.perf_counter() - t0)
            medians.append(statistics.median(took))
        connections = client._transport._pool.connections  # one connection served them all
        assert len(connections) == 1
    shown = " ".join(f"{m * 1e3:.1f}" for m in medians)
    assert min(medians) < 0.005, f"no round of {ROUND} had a median under 5 ms; medians (ms): {shown}"


#: Seconds between a remote_write client's sends (Prometheus' shards, alert rules, agents).
SEND_INTERVAL_S = 10.0


def test_a_client_sending_every_10_s_over_one_kept_alive_connection_is_never_reconnected(tmp_path):
    """remote_write every 10 s on one connection to ``ki collector`` at its default flags: each
    request is answered on the same socket (``http.client`` does not reopen a connection the
    server closed: it raises). The collector closed idle connections after 5 s, so such a
    client reconnected for every request; Prometheus' own server keeps them for minutes."""
    assert DEFAULT_KEEP_ALIVE_S > 3 * SEND_INTERVAL_S
    with running_collector(tmp_path, interval_s=5.0) as c:
        host, port = c.host_port
        conn = http.client.HTTPConnection(host, port, timeout=30)
        headers = {
            "Authorization": f"Bearer {c.ingest_token}",
            "Content-Encoding": "snappy",
            "Content-Type": "application/x-protobuf",
        }
        try:
            first = None
            for i in range(4):
                if i:
                    time.sleep(SEND_INTERVAL_S)  # the client's interval (the thing tested)
                now_ms = int(time.time() * 1000)
                body = encode_write_request(
                    [({"__name__": "keepalive_probe", "job": "ka"}, [(now_ms, float(i))])]
                )
                conn.request("POST", "/api/v1/write", body=body, headers=headers)
                answer = conn.getresponse()
                answer.read()
                assert answer.status == 204, answer.status
                first = first or conn.sock
                assert conn.sock is first, f"request {i} went over a new connection"
        finally:
            conn.close()
