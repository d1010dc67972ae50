"""What the collector creates on disk is its owner's alone: the store directory 0700, keys and
tokens 0600, whatever the umask (issue #13 item 8)."""

from __future__ import annotations

import os
import stat

from kernel_insight.api import TokenStore
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.keys import KeyStore


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_store_directory_keys_and_tokens_are_private_under_umask_022(tmp_path):
    old = os.umask(0o022)
    try:
        store = EmbeddedStore(tmp_path / "ki-data")
        store.close()
        tokens = TokenStore(tmp_path / "fresh" / "tokens.json")
        tokens.create("t", ["read"])
        keys = KeyStore(tmp_path / "other" / "keys.json")
        creds = keys.add_agent("a")
        creds.write_key_file(tmp_path / "agent.key")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "ki-data") == 0o700
    assert _mode(tmp_path / "fresh") == 0o700  # a directory made for the token file
    assert _mode(tmp_path / "other") == 0o700
    for f in (tokens.path, keys.path, tmp_path / "agent.key"):
        assert _mode(f) == 0o600, f
    # Lock files beside them carry nothing secret but are private too.
    for lock in (tmp_path / "fresh").glob("*.lock"):
        assert _mode(lock) == 0o600
