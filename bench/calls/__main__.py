"""make bench-calls: one GPU's hour of NCCL, memory and sync calls, derived and stored per call (``gpu_calls``).

What it measures: bytes on disk per stored call (after the day's parts are merged), how many syncs
the collector keeps (every one of at least 50 us, 1 in 100 of the rest), and the derive cost
per record. The load: a data-parallel training step every 100 ms on one GPU: 40 NCCL collectives
per step (400/s, 1-30 ms, two communicators), 30 memory operations per step (allocations, frees,
copies of 4 KiB .. 1 GiB), and 4,000 syncs a second, 3% of them long waits (50 us .. 20 ms), the rest
a few microseconds. Records go through the real ``Deriver`` in 10 s agent batches and into an
embedded store with ``insert_batch``, as the collector's sink does. Ends with one ``BENCH calls`` line.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from kernel_insight.agent.records import PAYLOAD_DTYPES, RECORD_DTYPE, RecordFlag, RecordType
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.derive import Deriver

S = 1_000_000_000
INSTANCE = "bench-node-1"


def _records(rtype: RecordType, ts: np.ndarray, ids: np.ndarray, payload: np.ndarray) -> np.ndarray:
    r = np.zeros(len(ts), RECORD_DTYPE)
    r["type"], r["producer"], r["device"], r["id"], r["ts_ns"] = rtype, 1, 0, ids, ts
    r["payload"] = payload.view(r.dtype["payload"])
    return r


def batch(rng: np.random.Generator, t0: int, seconds: int, sync_rate: int) -> np.ndarray:
    """``seconds`` of the load from ``t0``, in time order."""
    n_coll, n_mem, n_sync = 400 * seconds, 300 * seconds, sync_rate * seconds
    coll = np.zeros(n_coll, PAYLOAD_DTYPES[RecordType.COLLECTIVE])
    coll["bytes"] = rng.choice([1 << 20, 16 << 20, 256 << 20], n_coll)
    coll["duration_ns"] = rng.integers(1_000_000, 30_000_000, n_coll)
    coll["comm"] = rng.choice([0x5600_0000_1000, 0x5600_0000_2000], n_coll)
    coll["rank"], coll["nranks"] = 3, 8
    mem = np.zeros(n_mem, PAYLOAD_DTYPES[RecordType.MEMOP])
    mem["address"] = 0x7F00_0000_0000 + rng.integers(0, 1 << 30, n_mem) * 256
    mem["bytes"] = (1 << rng.integers(12, 30, n_mem)).astype(np.uint64)
    mem["pid"], mem["tid"] = 4242, 4243
    sync = np.zeros(n_sync, PAYLOAD_DTYPES[RecordType.SYNC])
    long = rng.random(n_sync) < 0.03
    sync["duration_ns"] = np.where(
        long, rng.integers(50_000, 20_000_000, n_sync), rng.integers(1_000, 9_000, n_sync)
    )
    sync["handle"] = rng.choice([0x7F00_0000_1000, 0x7F00_0000_1100], n_sync)
    sync["pid"], sync["tid"] = 4242, 4243
    parts = [
        _records(
            RecordType.COLLECTIVE,
            t0 + np.sort(rng.integers(0, seconds * S, n_coll)),
            rng.choice([1, 2, 3], n_coll),
            coll,
        ),
        _records(
            RecordType.MEMOP,
            t0 + np.sort(rng.integers(0, seconds * S, n_mem)),
            rng.choice([1, 2, 5], n_mem),
            mem,
        ),
        _records(
            RecordType.SYNC,
            t0 + np.sort(rng.integers(0, seconds * S, n_sync)),
            rng.choice([1, 3], n_sync),
            sync,
        ),
    ]
    parts[0]["flags"][rng.random(n_coll) < 0.001] = RecordFlag.FAILED
    out = np.concatenate(parts)
    return out[np.argsort(out["ts_ns"], kind="stable")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=3600, help="length of the GPU's stretch")
    ap.add_argument("--sync-rate", type=int, default=4000, help="syncs per second")
    args = ap.parse_args()
    rng = np.random.default_rng(19)
    t0 = (time.time_ns() // S - args.seconds - 60) * S
    deriver = Deriver(INSTANCE)
    records = kept = 0
    derive_s = 0.0
    with (
        tempfile.TemporaryDirectory(prefix="ki-bench-calls-") as tmp,
        EmbeddedStore(Path(tmp) / "data") as store,
    ):
        for n, at in enumerate(range(0, args.seconds, 10)):
            recs = batch(rng, t0 + at * S, min(10, args.seconds - at), args.sync_rate)
            began = time.process_time()
            derived = deriver.derive(recs, now_ns=int(recs["ts_ns"][-1]))
            derive_s += time.process_time() - began
            records += len(recs)
            kept += len(derived.calls)
            store.insert_batch(f"bench-calls:{n}", agent_id=INSTANCE, calls=derived.calls)
        store.optimize("gpu_calls")
        rows = store.query("SELECT track, count() AS n FROM ki.gpu_calls GROUP BY track").to_pylist()
        by_track = {r["track"]: int(r["n"]) for r in rows}
        disk = store.disk_bytes("gpu_calls")
    syncs_seen = args.sync_rate * args.seconds
    print(f"calls stored: {by_track} of {records} records; {disk} bytes on disk")
    print(
        f"BENCH calls bytes_per_call={disk / max(kept, 1):.2f} calls={kept} "
        f"sync_kept_ratio={by_track.get('sync', 0) / syncs_seen:.4f} "
        f"derive_us_per_record={derive_s / records * 1e6:.2f}"
    )


if __name__ == "__main__":
    main()
