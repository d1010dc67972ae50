"""``ki run``: the main job, as the README's run command starts it.

For now it creates GPU 0's ring, feeds it from a synthetic producer process
and drains it with a reader, printing what arrives; it grows into
collector + agent + producers as those components land.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import subprocess
import sys
import time
from collections import Counter

from kernel_insight.agent.records import KernelRecord, StringRecord, StringTable
from kernel_insight.agent.ring import Ring, RingError, RingReader, ring_name

__all__ = ["add_commands", "synthetic_producer"]

_KERNELS = ["gemm_bf16_128x256", "flash_attn_fwd", "rms_norm", "rotary_emb", "nccl_allreduce_ring"]


def synthetic_producer(name: str, seconds: float, rate: int) -> int:
    """Write KERNEL records at about `rate` per second; returns how many were written."""
    ring = Ring.attach(name)
    ids = [ring.intern(k) for k in _KERNELS]
    rng = random.Random(os.getpid())
    written = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        now = time.time_ns()
        for _ in range(max(1, rate // 100)):
            dur = int(rng.lognormvariate(11, 0.6))
            if ring.kernel(rng.choice(ids), 0, now, now + dur, 7, written) == 0:
                written += 1
        time.sleep(0.01)
    return written


def _run(args: argparse.Namespace) -> int:
    name = ring_name(args.gpu)
    with contextlib.suppress(RingError):
        Ring.unlink(name)
    ring = Ring.create(name, capacity=1 << 16, producer=False)
    print(
        f"ki run: ring {name} ({ring.capacity} slots); synthetic producer at {args.rate}/s for {args.seconds}s"
    )
    prod = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from kernel_insight.run import synthetic_producer as p;"
            f" print(p({name!r}, {args.seconds}, {args.rate}))",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    strings = StringTable()
    per_kernel: Counter[str] = Counter()
    try:
        with RingReader.open(name) as reader:
            while True:
                done = prod.poll() is not None
                for rec in reader.read():
                    if isinstance(rec, StringRecord):
                        strings.add(rec)
                    elif isinstance(rec, KernelRecord):
                        per_kernel[strings.get(rec.producer, rec.name_id) or f"#{rec.name_id}"] += 1
                if done:
                    break
                time.sleep(0.1)
                print(f"\r  read {sum(per_kernel.values()):>9} kernel records", end="", flush=True)
            stats = reader.stats()
    finally:
        ring.close()
        Ring.unlink(name)
    out, _ = prod.communicate()
    print(
        f"\nproducer wrote {out.strip()}, reader got {sum(per_kernel.values())}, dropped {stats['dropped']}"
    )
    for kernel, n in per_kernel.most_common():
        print(f"  {kernel:<24} {n}")
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="the main job: a ring, a synthetic producer and a reader")
    p.add_argument("--gpu", default="0", help="GPU index or UUID (default 0)")
    p.add_argument("--seconds", type=float, default=5.0, help="how long to produce (default 5)")
    p.add_argument("--rate", type=int, default=20000, help="records per second (default 20000)")
    p.set_defaults(handler=_run)
