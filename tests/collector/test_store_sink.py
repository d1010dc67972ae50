"""StoreSink: the ingest router's decoded batches become stored rows, once, with counters that survive a failed store."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from kernel_insight.agent import RECORD_DTYPE, RecordType
from kernel_insight.collector.clickhouse.store import EmbeddedStore, StorageError, StorageUnavailable
from kernel_insight.collector.sink import INSTANCE_ROW_EVERY_S, StoreSink
from kernel_insight.collector.wire import BatchHeader, Counter, DecodedBatch
from kernel_insight.kql.storage import Matcher

AGENT = bytes(range(16))
NOW = time.time_ns()


def _batch(seq: int, kernels: int = 3) -> DecodedBatch:
    arr = np.zeros(kernels, RECORD_DTYPE)
    arr["pos"] = np.arange(kernels) + seq * 100
    arr["producer"] = 1
    arr["type"] = RecordType.KERNEL
    arr["id"] = 5
    arr["ts_ns"] = NOW + seq * 10_000_000 + np.arange(kernels) * 1000
    payload = np.zeros(kernels, np.dtype([("end", "<u8"), ("rest", "V24")]))
    payload["end"] = arr["ts_ns"] + 500
    arr["payload"] = payload.view("V32")
    header = BatchHeader(AGENT, 1, 7, seq, NOW, NOW + seq * 10_000_000 + 10_000, kernels, 0, 1)
    return DecodedBatch(
        header,
        counters={int(Counter.RING_DROPPED): 4},
        strings={(1, 5): "gemm"},
        arrays={RecordType.KERNEL: arr},
    )


def _launches(store):
    window = (NOW // 1_000_000 - 1000, NOW // 1_000_000 + 1000)
    series = store.storage().select([Matcher("__name__", "=", "kernel_launches_total")], *window)
    return [s.values.tolist() for s in series]


def test_batches_are_derived_stored_once_and_counted(tmp_path):
    with EmbeddedStore(tmp_path / "d") as store:
        sink = StoreSink(store, instance_of=lambda a: "host-1")
        assert sink(_batch(0)) is True
        assert sink(_batch(0)) is False  # a retry of a stored batch
        assert sink(_batch(1)) is True
        assert _launches(store) == [[3.0, 6.0]]
        dropped = store.storage().select([Matcher("__name__", "=", "ki_agent_ring_dropped_total")], 0, 2**42)
        assert [dict(s.labels)["instance"] for s in dropped] == ["host-1"]
        spans = store.query("SELECT kernel, count() AS n FROM ki.kernel_spans GROUP BY kernel").to_pylist()
        assert spans == [{"kernel": "gemm", "n": 6}]


def test_a_failed_store_does_not_count_twice(tmp_path):
    with EmbeddedStore(tmp_path / "d") as store:
        sink = StoreSink(store)
        assert sink(_batch(0)) is True
        real = store.insert_prepared

        def down(*args, **kwargs):
            raise StorageUnavailable("disk full")

        store.insert_prepared = down
        with pytest.raises(StorageUnavailable):
            sink(_batch(1))
        store.insert_prepared = real
        # The agent's retry: stored by it, or by the batcher's own retry just before (then 409).
        assert sink(_batch(1)) in (True, False)
        assert _launches(store) == [[3.0, 6.0]]
        sink.close()


def _calls_batch(seq: int) -> DecodedBatch:
    """Two NCCL all-reduces and a 1 MiB allocation on GPU 1 (COLLECTIVE, MEMOP records)."""
    coll = np.zeros(2, RECORD_DTYPE)
    coll["type"], coll["producer"], coll["device"], coll["id"] = RecordType.COLLECTIVE, 1, 1, 1
    coll["ts_ns"] = NOW + seq * 10_000_000 + np.arange(2) * 1000
    cp = np.zeros(
        2, np.dtype([("bytes", "<u8"), ("dur", "<u8"), ("comm", "<u8"), ("rank", "<u4"), ("n", "<u4")])
    )
    cp["bytes"], cp["dur"], cp["comm"], cp["rank"], cp["n"] = 1 << 30, 2_000_000, 0xC0, 3, 8
    coll["payload"] = cp.view("V32")
    mem = np.zeros(1, RECORD_DTYPE)
    mem["type"], mem["producer"], mem["device"], mem["id"] = RecordType.MEMOP, 1, 1, 1
    mem["ts_ns"] = NOW + seq * 10_000_000 + 5000
    mp = np.zeros(
        1, np.dtype([("addr", "<u8"), ("bytes", "<u8"), ("pid", "<u4"), ("tid", "<u4"), ("r", "V8")])
    )
    mp["addr"], mp["bytes"], mp["pid"], mp["tid"] = 0x1000, 1 << 20, 42, 43
    mem["payload"] = mp.view("V32")
    header = BatchHeader(AGENT, 1, 7, seq, NOW, NOW + seq * 10_000_000 + 10_000, 3, 0, 1)
    return DecodedBatch(header, arrays={RecordType.COLLECTIVE: coll, RecordType.MEMOP: mem})


def test_nccl_and_memory_calls_are_stored_once_per_call_through_the_batcher(tmp_path):
    with EmbeddedStore(tmp_path / "d") as store:
        sink = StoreSink(store, instance_of=lambda a: "host-1")
        assert sink(_calls_batch(0)) is True
        assert sink(_calls_batch(0)) is False  # a retry of a stored batch writes nothing again
        rows = store.query(
            "SELECT track, op, gpu, count() AS n, sum(bytes) AS b FROM ki.gpu_calls"
            " WHERE instance = 'host-1' GROUP BY track, op, gpu ORDER BY track"
        ).to_pylist()
        assert rows == [
            {"track": "memory", "op": "alloc", "gpu": 1, "n": 1, "b": 1 << 20},
            {"track": "nccl", "op": "allreduce", "gpu": 1, "n": 2, "b": 2 << 30},
        ]
        sink.close()


def _syncs_batch(seq: int, durations: list[int]) -> DecodedBatch:
    arr = np.zeros(len(durations), RECORD_DTYPE)
    arr["type"], arr["producer"], arr["id"] = RecordType.SYNC, 1, 1
    arr["ts_ns"] = NOW + seq * 10_000_000 + np.arange(len(durations)) * 1000
    payload = np.zeros(len(durations), np.dtype([("dur", "<u8"), ("handle", "<u8"), ("rest", "V16")]))
    payload["dur"] = durations
    arr["payload"] = payload.view("V32")
    header = BatchHeader(AGENT, 1, 7, seq, NOW, NOW + seq * 10_000_000 + 10_000, len(durations), 0, 1)
    return DecodedBatch(header, arrays={RecordType.SYNC: arr})


@pytest.mark.parametrize(
    ("options", "kept"),
    [
        ({}, 3),  # the defaults: the 2 waits of at least 50 us, and the first (1 in 100) of the 8 short ones
        ({"sync_sample_every": 1}, 10),  # every sync
        ({"sync_keep_ns": 0, "sync_sample_every": 1000}, 10),  # every wait is "long"
    ],
)
def test_which_syncs_are_stored_per_call_is_the_sinks_choice(tmp_path, options, kept):
    with EmbeddedStore(tmp_path / "d") as store:
        sink = StoreSink(store, instance_of=lambda a: "host-1", **options)
        assert sink(_syncs_batch(0, [2_000] * 8 + [60_000, 900_000])) is True
        assert store.query("SELECT count() AS n FROM ki.gpu_calls").to_pylist() == [{"n": kept}]
        sink.close()
    with pytest.raises(ValueError, match="1 in N"):
        StoreSink(store, sync_sample_every=0)


def test_an_agents_instance_row_is_written_once_per_window_or_when_it_changes(tmp_path):
    """INSTANCE_ROW_EVERY_S: the row goes with the first batch of each window of producer time,
    with a batch whose row says something new, and again after a batch whose row was not stored."""
    window_ns = int(INSTANCE_ROW_EVERY_S * 1e9)
    base = (NOW // window_ns + 1) * window_ns  # the start of a window

    def at(seq: int, t_ns: int, labels: tuple[tuple[str, str], ...] | None = None) -> DecodedBatch:
        b = _batch(seq)
        b.header = dataclasses.replace(b.header, t_max_ns=t_ns)
        b.labels = labels
        return b

    with EmbeddedStore(tmp_path / "d") as store:
        sink = StoreSink(store, instance_of=lambda a: "host-1")
        written: list[tuple[int, str]] = []
        real = store.insert_prepared

        def observe(group, token, done=None):  # type: ignore[no-untyped-def]
            for p in group:
                if "instances" in p.tables:
                    rows = p.tables["instances"].to_pylist()
                    written.extend(
                        (r["last_seen"].timestamp() * 1000, dict(r["labels"]).get("rack", "")) for r in rows
                    )
            return real(group, token, done)

        store.insert_prepared = observe  # type: ignore[method-assign]
        ms = base // 1_000_000
        assert sink(at(0, base)) is True
        assert sink(at(1, base + window_ns // 10)) is True  # same window, same facts: no row
        assert sink(at(2, base + window_ns // 2, (("rack", "r7"),))) is True  # a new label: a row
        assert sink(at(3, base + window_ns * 9 // 10, (("rack", "r7"),))) is True  # nothing new
        assert sink(at(4, base + window_ns, (("rack", "r7"),))) is True  # the next window
        assert [(round(t), rack) for t, rack in written] == [
            (ms, ""),
            (ms + window_ns // 2_000_000, "r7"),
            (ms + window_ns // 1_000_000, "r7"),
        ]

        def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
            raise StorageError("refused")

        written.clear()
        store.insert_prepared = refuse  # type: ignore[method-assign]
        with pytest.raises(StorageError):
            sink(at(5, base + 2 * window_ns, (("rack", "r7"),)))  # its row is not stored ...
        store.insert_prepared = observe  # type: ignore[method-assign]
        assert sink(at(6, base + 2 * window_ns + window_ns // 10, (("rack", "r7"),))) is True
        assert [round(t) for t, _ in written] == [
            ms + (2 * window_ns + window_ns // 10) // 1_000_000
        ]  # ... so this one is
        sink.close()
