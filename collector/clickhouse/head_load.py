"""Fill the head (collector/head.py) from the samples and series tables: where the load starts
so it fits the head's bytes, whether older samples exist, and the load itself (on the store's
loader thread)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]

from kernel_insight.collector.clickhouse.errors import StorageUnavailable
from kernel_insight.collector.clickhouse.sql import Params, qualified
from kernel_insight.collector.head import Head
from kernel_insight.collector.rows import Labels

__all__ = ["load", "load_start", "samples_before"]

log = logging.getLogger(__name__)

#: A read of the store's engine (``Store._query``).
Query = Callable[..., pa.Table]


def load_start(query: Query, database: str, first: int, max_bytes: int) -> int:
    """Where the head's load starts: ``first``, or the start of the latest second from which
    the samples still fit nine tenths of ``max_bytes`` (counted per second of the window)."""
    rows = query(
        f"SELECT intDiv(toUnixTimestamp64Milli(ts), 1000) AS sec, count() AS n FROM {qualified(database, 'samples')} "
        f"WHERE ts >= fromUnixTimestamp64Milli(toInt64({int(first)}), 'UTC') GROUP BY sec ORDER BY sec DESC"
    )
    fit = int(max_bytes * 0.9 / 12)  # a sealed sample's bytes (collector/head.py)
    counts = rows.column("n").to_numpy()
    total = np.cumsum(counts)
    if not len(total) or int(total[-1]) <= fit:
        return first
    over = int(np.argmax(total > fit))  # the first second (newest first) that does not fit
    return (int(rows.column("sec")[over].as_py()) + 1) * 1000


def samples_before(query: Query, database: str, ms: int) -> bool:
    """Whether the samples table holds any sample older than ``ms`` (parts of earlier days
    answer it without a scan; only the day of ``ms`` is read)."""
    p = Params()
    day = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).date().isoformat()
    parts = query(
        "SELECT count() AS n FROM system.parts WHERE active AND database = "
        f"{p(database, 'String')} AND table = 'samples' AND min_date < {p(day, 'Date')}",
        p,
    )
    if int(parts.column("n")[0].as_py()):
        return True
    found = query(
        f"SELECT count() AS n FROM {qualified(database, 'samples')} WHERE toDate(ts) = {p(day, 'Date')} "
        f"AND ts < fromUnixTimestamp64Milli(toInt64({int(ms)}), 'UTC')",
        p,
    )
    return bool(int(found.column("n")[0].as_py()))


def load(query: Query, database: str, head: Head, generation: int, first: int) -> None:
    """Fill ``head`` (of ``generation``) with the samples from ``first`` on and their labels."""
    try:
        rows = query(
            f"SELECT s.fingerprint AS fingerprint, toUnixTimestamp64Milli(s.ts) AS t, s.value AS value "
            f"FROM {qualified(database, 'samples')} AS s WHERE s.ts >= fromUnixTimestamp64Milli(toInt64({int(first)}), 'UTC')"
        )
        fps = rows.column("fingerprint").to_numpy().astype(np.uint64, copy=False)
        ts = rows.column("t").to_numpy().astype(np.int64, copy=False)
        vs = rows.column("value").to_numpy().astype(np.float64, copy=False)
        uniq, sid = np.unique(fps, return_inverse=True)
        found = _labels_of_fingerprints(query, database, uniq, first)
        keep = np.array([lab is not None for lab in found], dtype=bool)
        if not keep.all():  # a sample row without a series row cannot happen; be safe anyway
            ok = keep[sid]
            sid, ts, vs = (np.cumsum(keep) - 1)[sid[ok]], ts[ok], vs[ok]
            uniq = uniq[keep]
        labels = [lab for lab in found if lab is not None]
        head.load(generation, labels, uniq, sid.astype(np.int32), ts, vs)
        log.info("head: %d series, %d samples loaded from ClickHouse", len(uniq), len(ts))
    except StorageUnavailable:
        pass  # closing
    except Exception:
        log.exception("head: loading from ClickHouse failed; kql reads go to ClickHouse")


def _labels_of_fingerprints(
    query: Query, database: str, fps: npt.NDArray[np.uint64], first_ms: int
) -> list[Labels | None]:
    """Each fingerprint's label set (``__name__`` included), from the series table: the rows of
    the days from ``first_ms`` on (a series has a row for each day it has samples on), matched
    to ``fps`` (sorted, unique) in numpy. Naming the fingerprints in the query instead made a
    head of 500k series a text parameter of ~10 MB that the engine parsed for minutes, while
    holding the session every other statement waits for."""
    if not len(fps):
        return []
    rows = query(
        f"SELECT fingerprint, any(metric) AS metric, any(labels) AS labels FROM {qualified(database, 'series')} "
        f"WHERE date >= toDate(fromUnixTimestamp64Milli(toInt64({int(first_ms)}), 'UTC')) GROUP BY fingerprint"
    )
    have = rows.column("fingerprint").to_numpy().astype(np.uint64, copy=False)
    at = np.minimum(np.searchsorted(fps, have), len(fps) - 1)
    wanted = np.flatnonzero(fps[at] == have)
    metrics = rows.column("metric").take(wanted).to_pylist()
    maps = rows.column("labels").take(wanted).to_pylist()
    out: list[Labels | None] = [None] * len(fps)
    for i, metric, pairs in zip(at[wanted].tolist(), metrics, maps, strict=True):
        out[i] = tuple(sorted([("__name__", metric), *((k, v) for k, v in pairs if v != "")]))
    return out
