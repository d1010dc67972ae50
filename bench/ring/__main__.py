"""make bench-ring: producer cost per record (C, Python) and C consumer drain rate.

Targets (issue 2): C producer <= 50 ns/record, Python producer <= 1 us/record,
C consumer >= 10M records/s.  Ends with one ``BENCH ring ...`` line.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from kernel_insight.agent import DEFAULT_CAPACITY, RECORD_DTYPE, Ring, RingReader

HERE = Path(__file__).parent
INCLUDE = HERE.parents[1] / "agent" / "include"
ROUNDS = 31
#: The default ring (4 MiB, cache-resident) is what producers and the agent use;
#: a 64 MiB ring shows the DRAM-bound case where every slot is a cache miss.
SIZES = {"default": DEFAULT_CAPACITY, "64mib": 1 << 20}


def _python_producer_ns(name: str, records: int) -> float:
    """Median ns per ring.kernel() call from a Python loop (the loop's own cost included)."""
    samples = []
    buf = np.empty(1 << 16, RECORD_DTYPE)
    with Ring.attach(name) as ring, RingReader.open(name) as reader:
        write = ring.kernel
        for _ in range(ROUNDS):
            t0 = time.perf_counter_ns()
            for i in range(records):
                write(7, 0, i, i + 1000, 3, i)
            samples.append((time.perf_counter_ns() - t0) / records)
            while reader.read_into(buf):
                pass
        assert ring.stats()["dropped"] == 0
    return statistics.median(samples)


def _measure(exe: Path, capacity: int) -> tuple[dict[str, str], float]:
    name = f"/kernel_insight.bench-{os.getpid()}"
    Ring.create(name, capacity=capacity, producer=False).close()
    try:
        out = subprocess.run(
            [exe, name, str(capacity), str(ROUNDS)], check=True, capture_output=True, text=True
        )
        figures = dict(kv.split("=") for kv in out.stdout.split())
        return figures, _python_producer_ns(name, capacity)
    finally:
        Ring.unlink(name)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "ring_bench"
        cmd = ["gcc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE}"]
        subprocess.run([*cmd, str(HERE / "ring_bench.c"), "-o", str(exe)], check=True)
        results = {label: _measure(exe, cap) for label, cap in SIZES.items()}
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, {platform.platform()}")
    for label, (c, py) in results.items():
        print(
            f"{label:>8} ring ({SIZES[label]} slots, {ROUNDS} rounds, medians): C producer {c['c_producer_ns']} ns,"
            f" Python producer {py:.0f} ns, C drain {c['drain_mrps']} M records/s"
        )
    c, py = results["default"]
    big, _ = results["64mib"]
    print(
        f"BENCH ring c_producer_ns={c['c_producer_ns']} py_producer_ns={py:.0f} drain_mrps={c['drain_mrps']}"
        f" c_producer_64mib_ns={big['c_producer_ns']} drain_64mib_mrps={big['drain_mrps']}"
    )


if __name__ == "__main__":
    main()
