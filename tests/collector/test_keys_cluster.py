"""Cluster mode: keys and tokens in ClickHouse tables, so collectors over one store share enrolments and revocations.

Two collector apps, each with its own clickhouse-connect client, talk to one engine
(chDB behind the HTTP shim), as two collectors behind a load balancer talk to one cluster.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import httpx
import pytest
from loopback import chdb_http_server

from kernel_insight.api import ClickHouseTokenStore, TokenStore, UnknownToken
from kernel_insight.cli import main
from kernel_insight.collector import keys as k
from kernel_insight.collector.clickhouse.store import ServerStore
from kernel_insight.server import auth_store_kind, build_collector_app


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    with chdb_http_server(tmp_path_factory.mktemp("cluster") / "d") as url:
        yield url


@pytest.fixture
def stores(shim):
    a, b = ServerStore.connect(shim, compress=False), ServerStore.connect(shim, compress=False)
    yield a, b
    a.close()
    b.close()


class Client:
    def __init__(self, app, token: str) -> None:
        self.app, self.headers = app, {"Authorization": f"Bearer {token}"}

    def request(self, method: str, path: str, **kwargs) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://ki") as c:
                return await c.request(method, path, headers=self.headers, **kwargs)

        return asyncio.run(go())


def _wait_for(check, bound_s: float) -> float:
    """Seconds until ``check()`` holds; fails past ``bound_s``."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < bound_s, f"not seen within {bound_s} s"
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_clickhouse_url_selects_table_stores_and_a_data_directory_files(stores, tmp_path):
    a, _ = stores
    assert auth_store_kind(a) == "table"
    assert auth_store_kind(a, "file") == "file"
    assert auth_store_kind(object()) == "file"
    with pytest.raises(ValueError, match="unknown auth store"):
        auth_store_kind(a, "zookeeper")
    app = build_collector_app(a, interval_s=3600)
    assert isinstance(app.state.keys, k.ClickHouseKeyStore)
    assert isinstance(app.state.tokens, ClickHouseTokenStore)
    app = build_collector_app(
        a, keys_path=tmp_path / "k.json", tokens_path=tmp_path / "t.json", auth_store="file"
    )
    assert isinstance(app.state.keys, k.KeyStore)
    assert isinstance(app.state.tokens, TokenStore)


def test_two_collectors_share_enrolments_and_revocations_within_the_bound(stores):
    a, b = stores
    app_a, app_b = build_collector_app(a, interval_s=3600), build_collector_app(b, interval_s=3600)
    admin = app_a.state.tokens.create("ops", ["ingest-admin", "read"]).token
    # A token made through one collector works through the other at once (unknown ids re-read the table).
    ca, cb = Client(app_a, admin), Client(app_b, admin)
    r = ca.request("POST", "/v1/agents", json={"name": "host-9/gpu0"})
    assert r.status_code == 201, r.text
    agent = r.json()["agent"]["agent_id"]
    aid = bytes.fromhex(agent)
    r = cb.request("GET", f"/v1/agents/{agent}")
    assert r.status_code == 200, r.text
    assert r.json()["active_key_ids"] == [1]
    keys_b = app_b.state.keys
    assert len(keys_b.key_for(aid, 1)) == k.KEY_SIZE
    # Rotation through B; A accepts the new key once it re-reads (a miss does so at once).
    rotated = cb.request("POST", f"/v1/agents/{agent}/rotate").json()
    new_key = bytes.fromhex(rotated["key_file"].rsplit("key = ", 1)[1].strip())

    def a_accepts() -> bool:
        try:
            return app_a.state.keys.key_for(aid, rotated["key_id"]) == new_key
        except k.UnknownAgent:  # a miss re-reads at most every MISS_REFRESH_S; A read the table just now
            return False

    took = _wait_for(a_accepts, k.MISS_REFRESH_S + 2.0)
    assert took <= k.MISS_REFRESH_S + 2.0
    # Revocation through A: B refuses the agent within CLUSTER_REFRESH_S (plus a query).
    assert ca.request("POST", f"/v1/agents/{agent}/revoke").status_code == 200

    def b_refuses() -> bool:
        try:
            keys_b.key_for(aid, 1)
        except k.RevokedAgent:
            return True
        return False

    took = _wait_for(b_refuses, k.CLUSTER_REFRESH_S + 2.0)
    assert took <= k.CLUSTER_REFRESH_S + 2.0
    assert cb.request("GET", f"/v1/agents/{agent}").json()["revoked"] is True


def test_a_token_revoked_through_one_collector_is_refused_by_the_other(stores):
    a, b = stores
    app_a, app_b = build_collector_app(a, interval_s=3600), build_collector_app(b, interval_s=3600)
    created = app_a.state.tokens.create("grafana", ["read"])
    cb = Client(app_b, created.token)
    assert cb.request("GET", "/api/v1/query", params={"query": "1"}).status_code == 200
    ClickHouseTokenStore(a).revoke(created.info.id)

    def b_refuses() -> bool:
        return cb.request("GET", "/api/v1/query", params={"query": "1"}).status_code == 401

    _wait_for(b_refuses, k.CLUSTER_REFRESH_S + 2.0)
    with pytest.raises(UnknownToken, match="revoked"):
        app_b.state.tokens.authenticate(created.token)


def test_table_key_store_keeps_the_rotation_rules(stores):
    a, _ = stores
    store = k.ClickHouseKeyStore(a, table="agent_keys_rules")
    c1 = store.add_agent("a")
    c2 = store.rotate(c1.agent_id)
    c3 = store.rotate(c1.agent_id)
    assert c3.key_id == 3
    with pytest.raises(k.UnknownAgent, match="no active key 1"):
        store.key_for(c1.agent_id, 1)
    assert store.key_for(c1.agent_id, 2) == c2.key
    fresh = k.ClickHouseKeyStore(a, table="agent_keys_rules")
    (info,) = fresh.agents()
    assert info.active_key_ids == (2, 3)
    assert info.retired_key_ids == (1,)
    assert "agent_keys_rules" in repr(fresh)
    assert c3.key.hex() not in repr(fresh)


def test_ki_keys_cli_works_against_the_table_store(shim, stores, tmp_path, capsys):
    a, _ = stores
    key_file = tmp_path / "agent.key"
    assert main(["keys", "add-agent", "cli-agent", "--store", shim, "--key-file", str(key_file)]) == 0
    creds = k.read_key_file(key_file)
    assert creds.key.hex() not in capsys.readouterr().out
    assert k.ClickHouseKeyStore(a).key_for(creds.agent_id, 1) == creds.key
    assert main(["keys", "revoke", creds.agent_id.hex(), "--store", shim]) == 0
    assert main(["keys", "list", "--store", shim]) == 0
    listing = capsys.readouterr().out
    line = next(x for x in listing.splitlines() if creds.agent_id.hex() in x)
    assert "revoked" in line
    assert main(["keys", "list", "--store", "http://127.0.0.1:9"]) == 1
    assert "cannot open the store" in capsys.readouterr().err


def test_an_unreachable_table_is_a_503_with_retry_after_never_a_403_or_500(shim, tmp_path):
    store = ServerStore.connect(shim, compress=False)
    app = build_collector_app(store, interval_s=3600)
    token = app.state.tokens.create("ops", ["ingest-admin"]).token
    keys = app.state.keys
    store.close()

    client = Client(app, token)
    answers: list[httpx.Response] = []

    def refused() -> bool:  # its copy serves until older than CLUSTER_REFRESH_S; then it must re-read
        answers.append(client.request("GET", "/v1/agents"))
        assert answers[-1].status_code in (200, 503), answers[-1].text
        return answers[-1].status_code == 503

    _wait_for(refused, k.CLUSTER_REFRESH_S + 2.0)
    r = answers[-1]
    assert r.status_code == 503, r.text
    assert "unreadable" in r.json()["error"]
    with pytest.raises(k.KeyStoreError, match="unreadable"):
        keys.key_for(bytes(16), 1)


def test_ki_collector_over_a_clickhouse_url_refuses_key_and_token_files(shim, tmp_path):
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernel_insight.cli",
            "collector",
            "--store",
            shim,
            "--port",
            "0",
            "--keys",
            str(tmp_path / "keys.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2
    assert "--auth-store file" in refused.stderr


@pytest.mark.slow
def test_two_ki_collector_processes_over_one_clickhouse(shim, stores):
    a, _ = stores
    admin = ClickHouseTokenStore(a).create("ops", ["ingest-admin"]).token
    procs = [
        subprocess.Popen(
            # The store's one clickhouse-connect client serves every thread of the collector; with its
            # default per-client session it refuses concurrent queries (see the report on store.py).
            [
                sys.executable,
                "-m",
                "kernel_insight.cli",
                "collector",
                "--port",
                "0",
                "--store",
                shim + "/?autogenerate_session_id=false",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        urls = []
        for p in procs:
            line = p.stdout.readline()
            assert line.startswith("ki: listening on http://127.0.0.1:"), line + p.stderr.read()
            urls.append(line.split("listening on ")[1].strip())
        headers = {"Authorization": f"Bearer {admin}"}
        with httpx.Client(headers=headers, timeout=10) as http:
            r = http.post(f"{urls[0]}/v1/agents", json={"name": "lb-agent"})
            assert r.status_code == 201, r.text
            agent = r.json()["agent"]["agent_id"]
            assert http.get(f"{urls[1]}/v1/agents/{agent}").json()["revoked"] is False
            assert http.post(f"{urls[0]}/v1/agents/{agent}/revoke").status_code == 200
            took = _wait_for(
                lambda: http.get(f"{urls[1]}/v1/agents/{agent}").json()["revoked"], k.CLUSTER_REFRESH_S + 2.0
            )
            assert took <= k.CLUSTER_REFRESH_S + 2.0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:  # each reaped, even when another one hangs
            try:
                p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
