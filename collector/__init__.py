"""The collector: authenticated ingest of agent batches into ClickHouse (see docs/architecture.md)."""

from __future__ import annotations

__all__: list[str] = []
