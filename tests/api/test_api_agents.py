"""``/v1/agents``: enrolment over HTTP mirrors ``ki keys``; ingest-admin only; keys shown once, never logged."""

from __future__ import annotations

import logging
import os

import pytest
from api_helpers import TestClient
from fastapi import FastAPI

from kernel_insight.api import Authenticator, TokenStore, agents_router, install_error_handlers
from kernel_insight.cli import main
from kernel_insight.collector import keys as k


@pytest.fixture
def key_store(tmp_path) -> k.KeyStore:
    return k.KeyStore(tmp_path / "keys.json")


@pytest.fixture
def client(key_store: k.KeyStore, tokens: TokenStore) -> TestClient:
    app = FastAPI()
    app.include_router(agents_router(key_store, Authenticator(tokens)))
    install_error_handlers(app)
    c = TestClient(app)
    c.headers["Authorization"] = "Bearer " + tokens.create("ops", ["ingest-admin"]).token
    return c


def _enrol(client: TestClient, name: str = "host-1/gpu0") -> dict:
    r = client.post("/v1/agents", json={"name": name})
    assert r.status_code == 201, r.text
    return r.json()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/agents"),
        ("POST", "/v1/agents"),
        ("GET", "/v1/agents/" + "0" * 32),
        ("POST", "/v1/agents/" + "0" * 32 + "/rotate"),
        ("POST", "/v1/agents/" + "0" * 32 + "/keys/1/retire"),
        ("POST", "/v1/agents/" + "0" * 32 + "/revoke"),
    ],
)
def test_every_agent_endpoint_needs_the_ingest_admin_scope(client, tokens, method, path):
    r = client.request(method, path, headers={"Authorization": ""}, json={"name": "x"})
    assert r.status_code == 401
    for scope in ("read", "ingest"):
        token = tokens.create(scope, [scope]).token
        r = client.request(method, path, headers={"Authorization": f"Bearer {token}"}, json={"name": "x"})
        assert r.status_code == 403, (scope, r.text)
        assert "'ingest-admin' scope" in r.json()["error"]
    admin = tokens.create("root", ["admin"]).token
    r = client.request(method, path, headers={"Authorization": f"Bearer {admin}"}, json={"name": "x"})
    assert r.status_code in (200, 201, 404), r.text  # past the token check: the act itself answers


def test_enrol_returns_the_key_file_once_and_the_collector_accepts_its_key(client, key_store, tmp_path):
    r = client.post("/v1/agents", json={"name": "host-1/gpu0"})
    assert r.status_code == 201
    assert r.headers["cache-control"] == "no-store"
    body = r.json()
    assert body["key_id"] == 1
    assert body["agent"]["name"] == "host-1/gpu0"
    assert body["agent"]["active_key_ids"] == [1]
    path = tmp_path / "agent.key"
    path.write_text(body["key_file"])
    creds = k.read_key_file(path)
    assert creds.agent_id.hex() == body["agent"]["agent_id"]
    assert key_store.key_for(creds.agent_id, 1) == creds.key
    listing = client.get("/v1/agents")
    assert listing.status_code == 200
    assert [a["agent_id"] for a in listing.json()["agents"]] == [creds.agent_id.hex()]
    assert creds.key.hex() not in listing.text
    one = client.get(f"/v1/agents/{creds.agent_id.hex()}")
    assert one.json()["name"] == "host-1/gpu0"
    assert creds.key.hex() not in one.text


def test_enrolment_labels_are_stored_listed_and_handed_to_the_collector(client, key_store):
    labels = {"model": "llama-70b", "rack": "r1", "host": "h1", "switch": "s1"}
    r = client.post("/v1/agents", json={"name": "h1/gpu0", "labels": labels})
    assert r.status_code == 201, r.text
    agent = r.json()["agent"]
    assert agent["labels"] == dict(sorted(labels.items()))
    assert client.get(f"/v1/agents/{agent['agent_id']}").json()["labels"] == agent["labels"]
    assert key_store.labels_of(agent["agent_id"]) == agent["labels"]  # what the sink applies
    assert key_store.labels_of("0" * 32) == {}
    assert key_store.labels_of("not-an-agent") == {}
    assert _enrol(client, "plain")["agent"]["labels"] == {}


def test_rotate_retire_and_revoke_mirror_ki_keys(client, key_store):
    agent = _enrol(client)["agent"]["agent_id"]
    aid = bytes.fromhex(agent)
    r = client.post(f"/v1/agents/{agent}/rotate")
    assert r.status_code == 201
    assert r.json()["key_id"] == 2
    assert r.json()["agent"]["active_key_ids"] == [1, 2]
    assert "key_id = 2" in r.json()["key_file"]
    r = client.post(f"/v1/agents/{agent}/keys/1/retire")
    assert r.status_code == 200
    assert r.json()["active_key_ids"] == [2]
    assert r.json()["retired_key_ids"] == [1]
    with pytest.raises(k.UnknownAgent):
        key_store.key_for(aid, 1)
    r = client.post(f"/v1/agents/{agent}/revoke")
    assert r.status_code == 200
    assert r.json()["revoked"] is True
    with pytest.raises(k.RevokedAgent):
        key_store.key_for(aid, 2)
    r = client.post(f"/v1/agents/{agent}/rotate")
    assert r.status_code == 409
    assert "revoked" in r.json()["error"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"name": ""}, "1-200 characters"),
        ({"name": "a\nb"}, "one line"),
        ({"name": "x" * 201}, "1-200 characters"),
        ({"name": 7}, "string name"),
        ({}, "string name"),
        ([1, 2], "string name"),
        (b"{nope", "must be JSON"),
        ({"name": "x", "labels": ["model"]}, "labels must be an object"),
        ({"name": "x", "labels": {"instance": "y"}}, "set by the collector"),
        ({"name": "x", "labels": {"gpu_product": "y"}}, "set by the collector"),
        ({"name": "x", "labels": {"rack-id": "r1"}}, "invalid label name"),
        ({"name": "x", "labels": {"model": ""}}, "1-200 characters"),
        ({"name": "x", "labels": {"model": 7}}, "1-200 characters"),
        ({"name": "x", "labels": {f"l{i}": "v" for i in range(17)}}, "at most 16"),
    ],
)
def test_bad_enrolment_bodies_are_400_with_a_message(client, body, message):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = client.post("/v1/agents", **kwargs)
    assert r.status_code == 400, r.text
    assert r.json()["errorType"] == "bad_data"
    assert message in r.json()["error"]


def test_an_oversized_enrolment_body_is_refused_413(client):
    r = client.post("/v1/agents", json={"name": "x" * 10_000})
    assert r.status_code == 413
    assert "larger than" in r.json()["error"]


def test_bad_and_unknown_ids_are_400_and_404_never_500(client):
    agent = _enrol(client)["agent"]["agent_id"]
    for path in ("/v1/agents/xyz", "/v1/agents/00/rotate", "/v1/agents/" + "g" * 32 + "/revoke"):
        r = client.request("GET" if path.count("/") == 3 else "POST", path)
        assert r.status_code == 400, path
        assert "invalid agent id" in r.json()["error"]
    for kid in ("0", "-1", "x", "99999999999"):
        r = client.post(f"/v1/agents/{agent}/keys/{kid}/retire")
        assert r.status_code == 400, kid
        assert "invalid key id" in r.json()["error"]
    unknown = "ab" * 16
    for method, path in (
        ("GET", f"/v1/agents/{unknown}"),
        ("POST", f"/v1/agents/{unknown}/rotate"),
        ("POST", f"/v1/agents/{unknown}/revoke"),
        ("POST", f"/v1/agents/{unknown}/keys/1/retire"),
    ):
        r = client.request(method, path)
        assert r.status_code == 404, path
        assert "not enrolled" in r.json()["error"]
    r = client.post(f"/v1/agents/{agent}/keys/7/retire")
    assert r.status_code == 404
    assert "no key 7" in r.json()["error"]


def test_a_broken_key_store_is_a_503_not_a_500(client, key_store, monkeypatch):
    _enrol(client)
    monkeypatch.setattr("kernel_insight.collector.private_json.RELOAD_CHECK_S", 0.0)
    os.chmod(key_store.path, 0o644)
    key_store.path.touch()
    r = client.get("/v1/agents")
    assert r.status_code == 503
    assert "chmod 600" in r.json()["error"]
    assert r.headers["retry-after"] == "5"


def test_keys_never_reach_the_logs(client, caplog):
    caplog.set_level(logging.DEBUG)
    issued = [_enrol(client)]
    agent = issued[0]["agent"]["agent_id"]
    issued.append(client.post(f"/v1/agents/{agent}/rotate").json())
    client.post(f"/v1/agents/{agent}/revoke")
    assert f"enrolled agent {agent}" in caplog.text
    for answer in issued:
        key = answer["key_file"].rsplit("key = ", 1)[1].strip()
        assert len(key) == 64
        assert key not in caplog.text


def test_ki_keys_add_agent_is_the_documented_name_and_add_still_works(tmp_path, capsys):
    store = str(tmp_path / "keys.json")
    for verb in ("add-agent", "add"):
        key_file = tmp_path / f"{verb}.key"
        assert main(["keys", verb, f"via-{verb}", "--store", store, "--key-file", str(key_file)]) == 0
        out = capsys.readouterr().out
        creds = k.read_key_file(key_file)
        assert creds.agent_id.hex() in out
        assert creds.key.hex() not in out
    assert main(["keys", "list", "--store", store]) == 0
    listing = capsys.readouterr().out
    assert "via-add-agent" in listing
    assert "via-add" in listing
