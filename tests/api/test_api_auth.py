"""Bearer tokens with scopes: the file store, the CLI and what the HTTP endpoints answer."""

from __future__ import annotations

import json
import os
import stat
import time

import pytest
from api_helpers import FakeSource, TestClient, build_app, facts

from kernel_insight.api import Authenticator, TokenError, TokenStore, UnknownToken, serve
from kernel_insight.cli import main


def test_token_file_is_private_and_holds_no_secret(tokens: TokenStore):
    created = tokens.create("grafana", ["read"])
    assert stat.S_IMODE(tokens.path.stat().st_mode) == 0o600
    secret = created.token.partition(".")[2]
    assert secret not in tokens.path.read_text()
    assert tokens.authenticate(created.token).name == "grafana"


def test_revoked_and_forged_tokens_are_refused(tokens: TokenStore):
    created = tokens.create("x", ["read"])
    forged = created.token[:-3] + ("aaa" if not created.token.endswith("aaa") else "bbb")
    with pytest.raises(UnknownToken):
        tokens.authenticate(forged)
    with pytest.raises(UnknownToken, match="malformed"):
        tokens.authenticate("not-a-token")
    tokens.revoke(created.info.id)
    with pytest.raises(UnknownToken, match="revoked"):
        tokens.authenticate(created.token)


def test_unknown_scope_and_world_readable_file_are_refused(tokens: TokenStore):
    with pytest.raises(TokenError, match="unknown scope"):
        tokens.create("x", ["write"])
    tokens.create("x", ["read"])
    os.chmod(tokens.path, 0o644)
    with pytest.raises(TokenError, match="readable by others"):
        TokenStore(tokens.path)


def test_admin_implies_every_scope_and_others_only_their_own(tokens: TokenStore):
    admin = tokens.authenticate(tokens.create("a", ["admin"]).token)
    ingest = tokens.authenticate(tokens.create("i", ["ingest-admin"]).token)
    assert admin.allows("read")
    assert admin.allows("ingest-admin")
    assert ingest.allows("ingest-admin")
    assert not ingest.allows("read")


def test_ki_tokens_cli_creates_lists_and_revokes(tmp_path, capsys):
    path = str(tmp_path / "t.json")
    assert main(["tokens", "create", "--scope", "read", "--name", "grafana", "--store", path, "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert created["scopes"] == ["read"]
    assert created["token"].startswith("ki_")
    assert main(["tokens", "list", "--store", path]) == 0
    listing = capsys.readouterr().out
    assert created["id"] in listing
    assert "active" in listing
    assert created["token"] not in listing
    assert main(["tokens", "revoke", created["id"], "--store", path]) == 0
    assert capsys.readouterr().out.startswith("revoked")
    assert main(["tokens", "list", "--store", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["revoked"] is True
    assert main(["tokens", "revoke", "nope", "--store", path]) == 1
    assert "no token" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["list"], ["list", "--json"], ["revoke", "nope"]])
def test_ki_tokens_names_a_store_path_that_does_not_exist(tmp_path, capsys, args):
    """An absent file read as an empty store: ``list`` printed nothing and exited 0."""
    path = tmp_path / "missing" / "t.json"
    assert main(["tokens", *args, "--store", str(path)]) == 1
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", f"ki tokens: token store {path} does not exist\n")
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("args", [["list"], ["revoke", "nope"]])
def test_ki_tokens_names_a_key_store_given_as_its_store(tmp_path, capsys, args):
    """A key store read as a token store said "is corrupt (KeyError)": it is another kind of store."""
    path = tmp_path / "keys.json"
    path.write_text('{"version": 1, "agents": []}')
    path.chmod(0o600)
    assert main(["tokens", *args, "--store", str(path)]) == 1
    out = capsys.readouterr()
    assert (out.out, out.err) == (
        "",
        f"ki tokens: token store {path} is not a token store: expected a JSON object "
        '{"version": 1, "tokens": [...]}\n',
    )


def _client(tokens: TokenStore | None, now_ms: int, local_dev: bool = False) -> TestClient:
    app, _ = build_app(FakeSource([facts("a", now_ms=now_ms)]), Authenticator(tokens, local_dev=local_dev))
    return TestClient(app)


@pytest.mark.parametrize(
    "path",
    ["/v1/health/snapshot", "/v1/instances", "/v1/instances/a", "/v1/topology", "/api/v1/query?query=1"],
)
def test_every_endpoint_needs_a_read_token(tokens: TokenStore, now_ms: int, path: str):
    client = _client(tokens, now_ms)
    r = client.get(path)
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert r.json()["errorType"] == "unauthorized"
    assert "bearer token" in r.json()["error"]
    ingest = tokens.create("i", ["ingest-admin"]).token
    r = client.get(path, headers={"Authorization": f"Bearer {ingest}"})
    assert r.status_code == 403
    assert "'read' scope" in r.json()["error"]
    for scope in ("read", "admin"):
        token = tokens.create(scope, [scope]).token
        assert client.get(path, headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_malformed_authorization_header_is_a_401_with_a_message(tokens: TokenStore, now_ms: int):
    client = _client(tokens, now_ms)
    r = client.get("/v1/topology", headers={"Authorization": "Basic dXNlcjpwYXNz"})
    assert r.status_code == 401
    assert "Bearer <token>" in r.json()["error"]
    r = client.get("/v1/topology", headers={"Authorization": "Bearer ki_zz.yy"})
    assert r.status_code == 401
    assert r.json()["error"] == "unknown token"


def test_a_running_server_sees_a_revocation_within_a_second(tokens: TokenStore, now_ms: int):
    client = _client(tokens, now_ms)
    created = tokens.create("r", ["read"])
    headers = {"Authorization": f"Bearer {created.token}"}
    assert client.get("/v1/topology", headers=headers).status_code == 200
    TokenStore(tokens.path).revoke(created.info.id)  # another process's view of the file
    deadline = time.monotonic() + 3
    while client.get("/v1/topology", headers=headers).status_code == 200:
        assert time.monotonic() < deadline, "revocation not seen"
        time.sleep(0.1)
    assert client.get("/v1/topology", headers=headers).status_code == 401


def test_local_development_mode_needs_no_token_and_binds_loopback_only(now_ms: int):
    client = _client(None, now_ms, local_dev=True)
    assert client.get("/v1/health/snapshot").status_code == 200
    with pytest.raises(ValueError, match=r"127\.0\.0\.1 only"):
        serve(client.app, "0.0.0.0", 0, local_dev=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a TokenStore"):
        Authenticator(None)


def test_ki_collector_local_dev_says_so_and_refuses_other_addresses(tmp_path):
    import subprocess
    import sys

    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernel_insight.cli",
            "collector",
            "--local-dev",
            "--host",
            "0.0.0.0",
            "--store",
            str(tmp_path / "d"),
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2
    assert "binds 127.0.0.1 only" in refused.stderr
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kernel_insight.cli",
            "collector",
            "--local-dev",
            "--store",
            str(tmp_path / "d"),
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().startswith("ki: listening on http://127.0.0.1:")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "LOCAL DEVELOPMENT MODE" in err
