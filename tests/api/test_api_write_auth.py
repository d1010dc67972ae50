"""remote_write behind bearer tokens: the ``ingest`` scope writes, ``read`` cannot; the real Prometheus feeds ki collector."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import httpx
import pytest
from api_helpers import TestClient

from kernel_insight.api import TokenStore, create_api_app
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.remote_write import encode_write_request
from kernel_insight.kql.storage import Matcher
from kernel_insight.run import free_port

NOW = int(time.time() * 1000)
BODY_HEADERS = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = EmbeddedStore(tmp_path_factory.mktemp("write-auth"))
    yield s
    s.close()


def _body(job: str) -> bytes:
    return encode_write_request([({"__name__": "up", "job": job}, [(NOW, 1.0)])])


def _count(store, job: str) -> int:
    return len(store.storage().select([Matcher("job", "=", job)], NOW, NOW))


def test_remote_write_needs_a_token_with_the_ingest_scope(store, tokens: TokenStore):
    client = TestClient(create_api_app(store, tokens=tokens, interval_s=3600))
    r = client.post("/api/v1/write", content=_body("nobody"), headers=BODY_HEADERS)
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert "bearer token" in r.json()["error"]
    for scope in ("read", "ingest-admin"):
        token = tokens.create(scope, [scope]).token
        r = client.post(
            "/api/v1/write",
            content=_body(scope),
            headers={**BODY_HEADERS, "Authorization": f"Bearer {token}"},
        )
        assert r.status_code == 403, scope
        assert "'ingest' scope" in r.json()["error"]
    assert _count(store, "nobody") == 0
    assert _count(store, "read") == 0
    for scope in ("ingest", "admin"):
        token = tokens.create(scope, [scope]).token
        r = client.post(
            "/api/v1/write",
            content=_body(scope),
            headers={**BODY_HEADERS, "Authorization": f"Bearer {token}"},
        )
        assert r.status_code == 204, r.text
        assert _count(store, scope) == 1


def test_a_revoked_ingest_token_is_refused(store, tokens: TokenStore, monkeypatch):

    monkeypatch.setattr("kernel_insight.collector.private_json.RELOAD_CHECK_S", 0.0)
    client = TestClient(create_api_app(store, tokens=tokens, interval_s=3600))
    created = tokens.create("prometheus", ["ingest"])
    headers = {**BODY_HEADERS, "Authorization": f"Bearer {created.token}"}
    assert client.post("/api/v1/write", content=_body("rev"), headers=headers).status_code == 204
    TokenStore(tokens.path).revoke(created.info.id)
    r = client.post("/api/v1/write", content=_body("rev"), headers=headers)
    assert r.status_code == 401
    assert "revoked" in r.json()["error"]


def test_local_dev_mode_writes_without_a_token(store):
    client = TestClient(create_api_app(store, local_dev=True, interval_s=3600))
    r = client.post("/api/v1/write", content=_body("dev"), headers=BODY_HEADERS)
    assert r.status_code == 204, r.text
    assert _count(store, "dev") == 1


def test_openapi_declares_the_bearer_scheme_on_remote_write(store, tokens: TokenStore):
    client = TestClient(create_api_app(store, tokens=tokens, interval_s=3600))
    op = client.get("/openapi.json").json()["paths"]["/api/v1/write"]["post"]
    assert op["security"] == [{"HTTPBearer": []}]


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="the prometheus binary (Debian package) is not installed"
)
def test_real_prometheus_remote_writes_to_ki_collector_with_a_credentials_file(tmp_path):
    tokens = TokenStore(tmp_path / "tokens.json")
    ingest = tokens.create("prometheus", ["ingest"]).token
    read = tokens.create("test", ["read"]).token
    cred = tmp_path / "ingest.token"
    cred.write_text(ingest + "\n")
    os.chmod(cred, 0o600)
    collector = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kernel_insight.cli",
            "collector",
            "--store",
            str(tmp_path / "data"),
            "--keys",
            str(tmp_path / "keys.json"),
            "--tokens",
            str(tokens.path),
            "--port",
            "0",
            "--interval",
            "3600",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    prom: subprocess.Popen[str] | None = None
    try:
        line = collector.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("ki: listening on http://127.0.0.1:"), line
        url = line.split("listening on ")[1].strip()
        # ki collector checks tokens on remote_write: what Prometheus gets through is thanks to its token.
        refused = httpx.post(
            f"{url}/api/v1/write", content=_body("no-token"), headers=BODY_HEADERS, timeout=10
        )
        assert refused.status_code == 401, refused.text
        prom_port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            json.dumps(  # YAML is a superset of JSON
                {
                    "global": {"scrape_interval": "1s", "external_labels": {"feeder": "prom-e2e"}},
                    "scrape_configs": [
                        {"job_name": "self", "static_configs": [{"targets": [f"127.0.0.1:{prom_port}"]}]}
                    ],
                    "remote_write": [
                        {
                            "url": f"{url}/api/v1/write",
                            "authorization": {"type": "Bearer", "credentials_file": str(cred)},
                            "queue_config": {"batch_send_deadline": "1s"},
                        }
                    ],
                }
            )
        )
        prom = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                f"--storage.tsdb.path={tmp_path / 'prom'}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        result: list[dict] = []
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {read}"}, timeout=10) as http:
            while time.monotonic() < deadline and not result:
                assert prom.poll() is None, prom.stderr.read()  # type: ignore[union-attr]
                time.sleep(1)
                r = http.get("/api/v1/query", params={"query": 'up{job="self",feeder="prom-e2e"}'})
                assert r.status_code == 200, r.text
                result = r.json()["data"]["result"]
        assert result, "no sample from Prometheus reached the collector within 60 s"
        assert result[0]["value"][1] == "1"
    finally:
        if prom is not None:
            prom.terminate()
            prom.communicate(timeout=30)
        collector.terminate()
        collector.communicate(timeout=60)
