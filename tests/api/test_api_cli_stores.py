"""`ki tokens --store URL` manages the shared token table; `ki import --collector` sends a token."""

from __future__ import annotations

import os
import subprocess
import sys

from loopback import running_server

from kernel_insight.api import TokenStore, create_api_app
from kernel_insight.collector.clickhouse.store import EmbeddedStore

KI = [sys.executable, "-m", "kernel_insight.cli"]


def test_ki_tokens_manage_the_table_of_a_clickhouse_url(tmp_path) -> None:
    url = f"chdb://{tmp_path / 'ch'}"
    made = subprocess.run(
        [*KI, "tokens", "create", "--store", url, "--scope", "read", "--name", "g"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    listed = subprocess.run(
        [*KI, "tokens", "list", "--store", url], capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0, listed.stderr
    assert "read" in listed.stdout
    assert made.stdout.strip() not in listed.stdout  # secrets are never listed


def test_ki_import_sends_its_token_to_a_collector(tmp_path) -> None:
    tokens = TokenStore(tmp_path / "tokens.json")
    ingest = tokens.create("importer", ["ingest"]).token
    data = tmp_path / "metrics.prom"
    data.write_text('# TYPE gpu_temp gauge\ngpu_temp{gpu="0"} 61 1700000000000\n')
    store = EmbeddedStore(tmp_path / "store")
    try:
        with running_server(create_api_app(store, tokens=tokens)) as url:
            refused = subprocess.run(
                [*KI, "import", str(data), "--collector", url], capture_output=True, text=True, timeout=120
            )
            assert refused.returncode != 0
            assert "401" in refused.stderr + refused.stdout
            token_file = tmp_path / "ingest.token"
            token_file.write_text(ingest + "\n")
            for mode in (0o644, 0o640):  # issue 33: taken although the docs ask for 0600
                token_file.chmod(mode)
                shared = subprocess.run(
                    [*KI, "import", str(data), "--collector", url, "--token-file", str(token_file)],
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert shared.returncode == 1, shared.stdout
                assert shared.stderr == (
                    f"ki import: the token file {token_file} is readable by others (mode {mode:04o}): "
                    "chmod 600 it\n"
                )
            token_file.chmod(0o600)
            env = {k: v for k, v in os.environ.items() if k != "KI_TOKEN"}
            ways = {
                "file": (
                    [*KI, "import", str(data), "--collector", url, "--token-file", str(token_file)],
                    env,
                ),
                "env": ([*KI, "import", str(data), "--collector", url], {**env, "KI_TOKEN": ingest}),
                "argument": ([*KI, "import", str(data), "--collector", url, "--token", ingest], env),
            }
            for way, (argv, environ) in ways.items():
                sent = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=environ)
                assert sent.returncode == 0, (way, sent.stderr)
                assert "imported 1 samples" in sent.stdout
                # The token on the command line shows in ps: it still works, and says it is deprecated.
                assert ("--token is deprecated" in sent.stderr) == (way == "argument"), (way, sent.stderr)
    finally:
        store.close()
