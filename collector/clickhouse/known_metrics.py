"""The metric names that have some kind of row (histograms, start timestamps), as a store whose
writes all pass through one object can know them without asking the engine each read."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import pyarrow as pa  # type: ignore[import-untyped]

__all__ = ["KnownMetrics"]


class KnownMetrics:
    """The metric names that have some kind of row (histograms, start timestamps), for a store whose
    writes all pass through one object (the embedded store): the rows' metrics read once (again
    after any raw statement: ``forget``), plus every metric this process writes such rows of, noted
    before the write. Reads of other metrics then skip what only those have (docs/storage.md)."""

    __slots__ = ("_known", "_lock", "_noted", "_sql")

    def __init__(self, sql: str) -> None:
        self._sql = sql  # SELECT DISTINCT metric ... of the rows in question
        self._known: frozenset[str] | None = None
        self._noted: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    def note(self, names: Iterable[str]) -> None:
        names = set(names)
        if not self._noted.issuperset(names):
            with self._lock:
                self._noted = self._noted | names

    def forget(self) -> None:
        self._known = None

    def noted(self) -> frozenset[str]:
        """The names noted so far, without reading the table: a subset of the truth on a store
        other processes write to too."""
        return self._noted

    def get(self, query: Callable[[str], pa.Table]) -> frozenset[str]:
        known = self._known
        if known is None:
            rows = query(self._sql)
            known = self._known = frozenset(str(m) for m in rows.column("metric").to_pylist())
        noted = self._noted
        return known | noted if noted else known
