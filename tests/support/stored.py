"""What a store holds, read through its API (kql's storage protocol) rather than its tables:
for tests that check what an agent or a collector stored (tests/foundation/test_sql_owner.py)."""

from __future__ import annotations

from kernel_insight.collector.clickhouse.store import Store
from kernel_insight.collector.rows import MAX_TS_MS, MIN_TS_MS
from kernel_insight.kql.storage import Matcher, SeriesData


def metric_series(store: Store, name: str, op: str = "=") -> list[SeriesData]:
    """Every series of the metrics whose name matches (``op``: a kql matcher's, ``=`` or ``=~``),
    all their samples of all time, read around the sample cache."""
    return store.storage(use_cache=False).select([Matcher("__name__", op, name)], MIN_TS_MS, MAX_TS_MS)


def metric_samples(store: Store, name: str) -> list[tuple[int, float]]:
    """Every float sample of metric ``name``, all its series together, as (ts_ms, value) in time order."""
    return sorted(
        (t, v)
        for s in metric_series(store, name)
        for t, v in zip(s.timestamps.tolist(), s.values.tolist(), strict=True)
    )
