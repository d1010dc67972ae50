"""The Python client: health snapshots, instance selection and kql queries (see docs/architecture.md)."""

from __future__ import annotations

__all__: list[str] = []
