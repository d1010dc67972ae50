"""The series table: one row per (series, UTC day) it has samples on, written once however many
requests, groups and days bring the series, with its labels but the metric name."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.remote_write import SeriesCache, decode_write_request, encode_write_request
from kernel_insight.collector.rows import SampleBatch, SampleBuilder, series_fingerprint

DAY_MS = 86_400_000
TODAY = (int(time.time() * 1000) // DAY_MS) * DAY_MS


@pytest.fixture
def store(tmp_path):
    with EmbeddedStore(tmp_path / "d", cache_bytes=0) as s:
        yield s


def _rows(store) -> list[tuple[str, str, dict[str, str]]]:
    got = store.query(
        "SELECT toString(date) AS d, metric, labels FROM ki.series ORDER BY metric, d, toString(labels)"
    ).to_pylist()
    return [(r["d"], r["metric"], dict(r["labels"])) for r in got]


def test_a_series_row_per_series_and_day_once_across_requests_groups_and_days(store):
    cache = SeriesCache()

    def request(first: int, n: int, ts: int) -> SampleBatch:
        series = [
            ({"__name__": f"m{i % 3}", "host": f"h{i}", "z": ""}, [(ts, float(i))])
            for i in range(first, first + n)
        ]
        return decode_write_request(encode_write_request(series, compress=False), cache=cache)

    yesterday = TODAY - 3_600_000
    b = SampleBuilder()  # one batch over two days, a series twice
    b.add({"__name__": "two_days", "gpu": "0"}, yesterday, 1.0)
    b.add({"__name__": "two_days", "gpu": "0"}, TODAY + 1_000, 2.0)
    b.add({"__name__": "two_days", "gpu": "1"}, TODAY + 1_000, 3.0)
    group = [
        store.prepare("rw:a", samples=request(0, 40, TODAY + 5_000), record=False),
        store.prepare("rw:b", samples=request(20, 40, TODAY + 6_000), record=False),  # 20 of a's again
        store.prepare("rw:c", samples=b.build(), record=False),
    ]
    store.insert_prepared(group, "group:1")
    again = [store.prepare("rw:d", samples=request(0, 70, TODAY + 15_000), record=False)]  # 10 new
    store.insert_prepared(again, "group:2")

    rows = _rows(store)
    hosts = sorted(int(labels["host"][1:]) for _, m, labels in rows if m.startswith("m"))
    assert hosts == list(range(70))
    for _, metric, labels in rows:
        if metric.startswith("m"):
            assert metric == f"m{int(labels['host'][1:]) % 3}"
            assert labels == {"host": labels["host"]}  # no __name__, no empty value
    day = {d for d, m, _ in rows if m == "m0"}
    assert len(day) == 1
    two = [(d, labels) for d, m, labels in rows if m == "two_days"]
    assert len(two) == 3
    assert sorted(x["gpu"] for _, x in two) == ["0", "0", "1"]
    assert len({d for d, _ in two}) == 2
    # What the store remembers: each day's fingerprints sorted and once, as many as its rows.
    for arr in store._series_index._seen_by_day.values():
        assert bool(np.all(arr[1:] > arr[:-1]))
    assert sum(len(a) for a in store._series_index._seen_by_day.values()) == len(rows)


def test_the_series_cache_gives_each_series_its_own_entry_past_its_first_arrays():
    """New series added in bulk (3,000, past the cache's first 1,024-entry arrays; a request of
    known and new series; one series twice): each decodes to its labels, fingerprint and name."""
    cache = SeriesCache()

    def series(i: int) -> dict[str, str]:
        return {"__name__": f"m{i % 7}", "host": f"h{i}"}

    def decode(hosts: list[int]) -> SampleBatch:
        sent = [(series(i), [(TODAY, float(i))]) for i in hosts]
        return decode_write_request(encode_write_request(sent, compress=False), cache=cache)

    decode(list(range(1500)))
    batch = decode([*range(1000, 3000), 2999])
    assert len(cache) == 3000
    assert batch.series_meta is not None
    fps, codes, names = batch.series_meta
    for k, labels in enumerate(batch.series):
        i = int(dict(labels)["host"][1:])
        assert labels == tuple(sorted(series(i).items()))
        assert int(fps[k]) == series_fingerprint(labels)
        assert names[codes[k]] == f"m{i % 7}"
    assert batch.values.tolist() == [float(i) for i in [*range(1000, 3000), 2999]]
