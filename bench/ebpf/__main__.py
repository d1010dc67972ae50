"""make bench-ebpf: what a traced cuLaunchKernel costs, and the tracer's CPU at 100k launches/s.

Runs against the stand-in libcuda of the tests (tests/probe/c), whose
cuLaunchKernel does nothing, so the difference between traced and untraced
calls is the uprobe cost alone.  Needs root and BPF (as the ebpf tests do).
Ends with one ``BENCH ebpf ...`` line.
"""

from __future__ import annotations

import contextlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from kernel_insight.agent import Ring, ring_name
from kernel_insight.agent.probe.ebpf import EbpfUnavailable, Tracer, TracerConfig

ROOT = Path(__file__).resolve().parents[2]
C = ROOT / "tests" / "probe" / "c"
INCLUDE = ROOT / "agent" / "include"
CALLS = 50_000
ROUNDS = 3
LABEL = "bench-ebpf-0"


def _build(d: Path) -> Path:
    cc = shutil.which("cc") or "gcc"
    flags = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]
    lib = d / "libcuda.so.1"
    subprocess.run(
        [
            cc,
            *flags,
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            "-Wl,-soname,libcuda.so.1",
            str(C / "fake_cuda.c"),
            "-o",
            str(lib),
        ],
        check=True,
    )
    prog = d / "launch_loop"
    subprocess.run(
        [
            cc,
            *flags,
            str(C / "launch_loop.c"),
            f"-L{d}",
            "-l:libcuda.so.1",
            f"-Wl,-rpath,{d}",
            "-o",
            str(prog),
        ],
        check=True,
    )
    return prog


def _loop(prog: Path, calls: int, rate: float = 0) -> float:
    """ns per cuLaunchKernel as the program measured it."""
    args = [str(prog), str(calls)] + ([str(rate)] if rate else [])
    out = subprocess.run(args, input="go\n", capture_output=True, text=True, check=True).stdout
    return float(out.split("ns_per_call=")[1].split()[0])


def _median_ns(prog: Path) -> float:
    return statistics.median(_loop(prog, CALLS) for _ in range(ROUNDS))


def _traced(prog: Path, launch_latency: bool = True) -> Tracer:
    lib = str(prog.parent / "libcuda.so.1")
    return Tracer.start(TracerConfig(label_prefix="bench-ebpf-", libcuda=lib, launch_latency=launch_latency))


def _drain_every_second(tracer: Tracer, stop: threading.Event) -> None:
    while not stop.is_set():
        tracer.drain()
        stop.wait(1.0)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        prog = _build(Path(tmp))
        base = _median_ns(prog)
        try:
            with _traced(prog) as tracer:
                full = _median_ns(prog)
                tracer.drain()
                counted = sum(s.count for s in tracer.launches.values())
            with _traced(prog, launch_latency=False) as tracer:
                count_only = _median_ns(prog)
            with _traced(prog) as tracer:
                stop = threading.Event()
                r0 = resource.getrusage(resource.RUSAGE_SELF)
                t0 = time.monotonic()
                drainer = threading.Thread(target=_drain_every_second, args=(tracer, stop))
                drainer.start()
                paced_ns = _loop(prog, 200_000, 100_000.0)
                stop.set()
                drainer.join()
                wall = time.monotonic() - t0
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        except EbpfUnavailable as e:
            print(f"bench-ebpf: {e}", file=sys.stderr)
            return 2
        finally:
            with contextlib.suppress(OSError):
                Ring.unlink(ring_name(LABEL))
    if counted != CALLS * ROUNDS:
        print(
            f"bench-ebpf: the tracer counted {counted} launches, expected {CALLS * ROUNDS}", file=sys.stderr
        )
        return 1
    print(
        f"untraced cuLaunchKernel: {base:.1f} ns; traced (count + host-time histogram): {full:.1f} ns; count only: {count_only:.1f} ns"
    )
    rate = 1e9 / paced_ns
    print(
        f"tracer process CPU while the workload aimed at 100k launches/s (reached {rate / 1000:.0f}k/s): "
        f"{100 * cpu / wall:.2f}% of one core"
    )
    print(
        f"BENCH ebpf ns_per_call={full - base:.0f} cpu_pct_at_100k={100 * cpu / wall:.2f} "
        f"ns_per_call_count_only={count_only - base:.0f} untraced_ns={base:.1f} rate_reached={rate:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
