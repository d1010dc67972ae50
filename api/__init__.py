"""The query and health-snapshot HTTP API served by the collector (see docs/architecture.md)."""

from __future__ import annotations

__all__: list[str] = []
