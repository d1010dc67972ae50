"""``ki keys enrol``: an agent node enrols itself through the collector's API, once."""

from __future__ import annotations

import os
import subprocess
import sys

from support.collector import running_collector

from kernel_insight.api import TokenStore
from kernel_insight.collector.keys import KeyStore, read_key_file


def _ki(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernel_insight.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_enrol_writes_a_private_key_file_the_collector_accepts_and_is_idempotent(tmp_path):
    with running_collector(tmp_path) as c:
        admin = TokenStore(tmp_path / "tokens.json").create("node-init", ["ingest-admin"]).token
        (tmp_path / "admin.token").write_text(admin + "\n")
        (tmp_path / "admin.token").chmod(0o600)
        key_file = tmp_path / "gpu0.key"
        before = {a.agent_id for a in c.keys.agents()}

        done = _ki(
            "keys",
            "enrol",
            "node-7/gpu0",
            "--collector",
            c.url,
            "--key-file",
            str(key_file),
            "--token-file",
            str(tmp_path / "admin.token"),
        )
        assert done.returncode == 0, done.stderr
        creds = read_key_file(key_file)
        assert key_file.stat().st_mode & 0o777 == 0o600
        (new,) = [a for a in KeyStore(c.keys.path).agents() if a.agent_id not in before]
        assert new.name == "node-7/gpu0"
        assert KeyStore(c.keys.path).key_for(creds.agent_id, creds.key_id) == creds.key

        again = _ki(
            "keys",
            "enrol",
            "node-7/gpu0",
            "--collector",
            c.url,
            "--key-file",
            str(key_file),
            env={"KI_TOKEN": admin},
        )
        assert again.returncode == 0
        assert "exists" in again.stdout
        assert len(KeyStore(c.keys.path).agents()) == len(before) + 1

        refused = _ki(
            "keys",
            "enrol",
            "node-7/gpu1",
            "--collector",
            c.url,
            "--key-file",
            str(tmp_path / "gpu1.key"),
            env={"KI_TOKEN": c.read_token},
        )
        assert refused.returncode == 1
        assert "403" in refused.stderr
        assert not (tmp_path / "gpu1.key").exists()

        missing = _ki(
            "keys",
            "enrol",
            "x",
            "--collector",
            c.url,
            "--key-file",
            str(tmp_path / "x.key"),
            env={"KI_TOKEN": ""},
        )
        assert missing.returncode == 1
        assert "ingest-admin" in missing.stderr


def test_ki_collector_cluster_needs_a_clickhouse_url(tmp_path):
    done = _ki("collector", "--local-dev", "--cluster", "ki", "--store", str(tmp_path / "d"), "--port", "0")
    assert done.returncode == 2
    assert "a cluster needs a ClickHouse URL" in done.stderr
