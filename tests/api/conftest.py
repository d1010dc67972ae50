"""Fixtures for the API tests (helpers live in api_helpers, a module name unique in the suite)."""

from __future__ import annotations

import time

import pytest

from kernel_insight.api import TokenStore


@pytest.fixture
def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture
def tokens(tmp_path) -> TokenStore:
    return TokenStore(tmp_path / "tokens.json")


@pytest.fixture
def read_token(tokens: TokenStore) -> str:
    return tokens.create("reader", ["read"]).token


@pytest.fixture
def auth_headers(read_token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {read_token}"}
