"""kql: a PromQL-compatible query language evaluated over ClickHouse (see docs/architecture.md)."""

from __future__ import annotations

__all__: list[str] = []
