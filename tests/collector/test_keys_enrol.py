"""``ki keys enrol``: an agent node enrols itself through the collector's API, once."""

from __future__ import annotations

import os
import subprocess
import sys

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
    tokens = TokenStore(tmp_path / "tokens.json")
    admin = tokens.create("node-init", ["ingest-admin"]).token
    reader = tokens.create("grafana", ["read"]).token
    (tmp_path / "admin.token").write_text(admin + "\n")
    keys_path = tmp_path / "keys.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kernel_insight.cli",
            "collector",
            "--store",
            str(tmp_path / "d"),
            "--port",
            "0",
            "--tokens",
            str(tmp_path / "tokens.json"),
            "--keys",
            str(keys_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("ki: listening on "), line
        url = line.split()[-1]
        key_file = tmp_path / "gpu0.key"

        done = _ki(
            "keys",
            "enrol",
            "node-7/gpu0",
            "--collector",
            url,
            "--key-file",
            str(key_file),
            "--token-file",
            str(tmp_path / "admin.token"),
            "--label",
            "model=llama-70b",
            "--label",
            "rack=r7",
        )
        assert done.returncode == 0, done.stderr
        creds = read_key_file(key_file)
        assert key_file.stat().st_mode & 0o777 == 0o600
        assert [a.name for a in KeyStore(keys_path).agents()] == ["node-7/gpu0"]
        assert KeyStore(keys_path).key_for(creds.agent_id, creds.key_id) == creds.key
        assert KeyStore(keys_path).agent(creds.agent_id).labels == {"model": "llama-70b", "rack": "r7"}

        again = _ki(
            "keys",
            "enrol",
            "node-7/gpu0",
            "--collector",
            url,
            "--key-file",
            str(key_file),
            env={"KI_TOKEN": admin},
        )
        assert again.returncode == 0
        assert "exists" in again.stdout
        assert len(KeyStore(keys_path).agents()) == 1

        refused = _ki(
            "keys",
            "enrol",
            "node-7/gpu1",
            "--collector",
            url,
            "--key-file",
            str(tmp_path / "gpu1.key"),
            env={"KI_TOKEN": reader},
        )
        assert refused.returncode == 1
        assert "403" in refused.stderr
        assert not (tmp_path / "gpu1.key").exists()

        missing = _ki(
            "keys",
            "enrol",
            "x",
            "--collector",
            url,
            "--key-file",
            str(tmp_path / "x.key"),
            env={"KI_TOKEN": ""},
        )
        assert missing.returncode == 1
        assert "ingest-admin" in missing.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        proc.stdout.close()


def test_ki_collector_cluster_needs_a_clickhouse_url(tmp_path):
    done = _ki("collector", "--local-dev", "--cluster", "ki", "--store", str(tmp_path / "d"), "--port", "0")
    assert done.returncode == 2
    assert "a cluster needs a ClickHouse URL" in done.stderr
