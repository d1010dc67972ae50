"""Records/s through the collector's derive pass alone (records -> rows, no storage).

The second-column figure of issue 11: how many ring records one core turns into spans,
samples and events, for a kernel-heavy batch mix and for a mix of every other record type
(CPU time of this process, so other work on a shared machine skews it less than wall time).
``--reference FILE`` times another Deriver module (the per-record one kept in
tests/collector/derive_reference.py) for a before/after comparison.
Ends with one ``BENCH derive kernel_records_per_s=<n> mixed_records_per_s=<n>`` line.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from kernel_insight.agent import RECORD_DTYPE, RecordType
from kernel_insight.agent.metric_ids import MetricId
from kernel_insight.collector.derive import Deriver

T0 = 1_790_000_000_000_000_000
#: (type, share) of a batch: kernels dominate; the "mixed" batches leave them out.
MIX = (
    (RecordType.LAUNCH, 0.35),
    (RecordType.GPU_SAMPLE, 0.35),
    (RecordType.MEMOP, 0.15),
    (RecordType.SYNC, 0.08),
    (RecordType.COLLECTIVE, 0.05),
    (RecordType.ERROR, 0.02),
)
SAMPLE_IDS = np.array([m.value for m in MetricId if m != MetricId.LAUNCH_HOST_LATENCY_BUCKET], np.uint32)


def batch(n: int, b: int, kernels: bool, rng: np.random.Generator) -> npt.NDArray[np.void]:
    """One agent batch as the wire decoder hands it over: 8 GPUs, 200 kernel names."""
    a = np.zeros(n, RECORD_DTYPE)
    a["pos"] = np.arange(n) + b * n
    a["producer"] = 1
    a["device"] = rng.integers(0, 8, n)
    a["ts_ns"] = T0 + b * n * 20_000 + np.cumsum(rng.integers(1_000, 30_000, n))
    if kernels:
        a["type"] = RecordType.KERNEL
    else:
        a["type"] = rng.choice([t for t, _ in MIX], n, p=[s for _, s in MIX])
    raw = np.zeros((n, 4), np.uint64)
    t = a["type"]
    raw[:, 0] = a["ts_ns"] + rng.lognormal(11, 0.6, n).astype(np.uint64)  # KERNEL end
    raw[:, 1] = rng.integers(0, 1 << 30, n).astype(np.uint64)
    a["id"] = rng.integers(1, 201, n)
    for kind, hi in (
        (RecordType.MEMOP, 5),
        (RecordType.SYNC, 4),
        (RecordType.COLLECTIVE, 10),
        (RecordType.ERROR, 7),
    ):
        m = t == kind
        a["id"][m] = rng.integers(1, hi, int(m.sum()))
    s = t == RecordType.GPU_SAMPLE
    a["id"][s] = rng.choice(SAMPLE_IDS, int(s.sum()))
    raw[s, 0] = rng.normal(100.0, 10.0, int(s.sum())).view(np.uint64)
    sid = a["id"]
    for metric, hi in (  # aux as the sampler writes it: a kernel name, an NVLink index, a pid
        (MetricId.LAUNCH_CALLS, 201),
        (MetricId.LAUNCH_HOST_TIME, 201),
        (MetricId.NVLINK_TX, 18),
        (MetricId.NVLINK_RX, 18),
        (MetricId.PROCESS_MEMORY, 10),
        (MetricId.CUDA_ALLOCATED_BYTES, 10),
    ):
        m = s & (sid == metric)
        raw[m, 1] = rng.integers(1, hi, int(m.sum()))
    for kind in (RecordType.MEMOP, RecordType.COLLECTIVE, RecordType.SYNC):
        m = t == kind
        raw[m, 0] = rng.integers(0, 1 << 30, int(m.sum()))
    e = t == RecordType.ERROR
    raw[e] = 0
    a["payload"] = raw.view("V32").reshape(n)
    return a


def rate(deriver_cls: Any, kernels: bool, total: int, per_batch: int) -> float:
    rng = np.random.default_rng(7)
    names = {(1, i): f"kernel_{i}" for i in range(1, 201)}
    batches = [batch(per_batch, b, kernels, rng) for b in range(total // per_batch)]
    d = deriver_cls("node-0001")
    d.derive(batches[0], strings=names, now_ns=T0)
    t = time.process_time()
    for b in batches[1:]:
        d.derive(b, strings=names, counters={"ring_dropped": 0.0}, now_ns=T0)
    return per_batch * (len(batches) - 1) / (time.process_time() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=400_000)
    ap.add_argument("--batch", type=int, default=4096, help="records per agent batch")
    ap.add_argument("--reference", help="a Python file defining another Deriver, timed instead")
    args = ap.parse_args()
    cls: Any = Deriver
    if args.reference:
        spec = importlib.util.spec_from_file_location("derive_reference", args.reference)
        assert spec is not None
        assert spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up
        spec.loader.exec_module(mod)
        cls = mod.Deriver
    k = rate(cls, True, args.records, args.batch)
    m = rate(cls, False, args.records // 4, args.batch)
    print(f"BENCH derive kernel_records_per_s={k:.0f} mixed_records_per_s={m:.0f}")


if __name__ == "__main__":
    main()
