"""make bench-ebpf: what a traced cuLaunchKernel costs, and the tracer's CPU at 100k launches/s.

Also what the launch uprobes cost the workload in each setting of ``launch_every`` (off, the
default; one drain interval in ten; always): the traced process's own CPU per call at a paced
rate, against the same run untraced.

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
from dataclasses import dataclass
from pathlib import Path

from kernel_insight.agent import Ring, ring_name
from kernel_insight.agent.probe.ebpf import EbpfUnavailable, Tracer, TracerConfig, bpf_run_time_stats

ROOT = Path(__file__).resolve().parents[2]
C = ROOT / "tests" / "probe" / "c"
INCLUDE = ROOT / "agent" / "include"
CALLS = 50_000
ROUNDS = 3
LABEL = "bench-ebpf-0"
TARGET = 100_000.0  # calls/s the CPU figure is stated at
PACED_RATES = (2_000.0, 20_000.0)  # two rates this VM reaches (~26k/s at most), 10x apart
PACED_S = 4.0  # seconds per paced run (four drains), ROUNDS runs per rate, alternating
ENTRY = "launch_drv_entry"  # the uprobe program on cuLaunchKernel: runs once per traced call
FLAT_PCT = 0.05  # percentage points of one core: two tracer CPU medians closer than this agree
DUTY_RATE = 20_000.0  # calls/s of the workload-cost runs
DUTY_S = 3.0  # seconds per workload-cost run
DUTY_INTERVAL_S = 0.1  # drain interval of the workload-cost runs (30 intervals per run)
DUTY_MODES = (("off", 0), ("1-in-10", 10), ("always", 1))


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


def _traced(
    prog: Path, launch_latency: bool = True, launch_every: int = 1, interval_s: float = 1.0
) -> Tracer:
    lib = str(prog.parent / "libcuda.so.1")
    return Tracer.start(
        TracerConfig(
            label_prefix="bench-ebpf-",
            libcuda=lib,
            launch_latency=launch_latency,
            launch_every=launch_every,
            drain_interval_s=interval_s,
        )
    )


def _child_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _workload_cpu_ns(prog: Path, tracer: Tracer | None) -> float:
    """The workload's own CPU (user + system: uprobe traps are charged to it) per call at DUTY_RATE."""
    calls = int(DUTY_RATE * DUTY_S)
    stop = threading.Event()
    drainer = None
    if tracer is not None:

        def drain() -> None:
            while not stop.is_set():
                tracer.drain()
                stop.wait(DUTY_INTERVAL_S)

        drainer = threading.Thread(target=drain)
        drainer.start()
    before = _child_cpu_s()
    _loop(prog, calls, DUTY_RATE)
    used = _child_cpu_s() - before
    stop.set()
    if drainer is not None:
        drainer.join()
    return used * 1e9 / calls


def _duty_costs(prog: Path) -> dict[str, float]:
    """Extra workload CPU ns per call in each launch_every mode (median of ROUNDS, minus untraced)."""
    runs: dict[str, list[float]] = {"untraced": []}
    for _ in range(ROUNDS):
        runs["untraced"].append(_workload_cpu_ns(prog, None))
        for name, every in DUTY_MODES:
            with _traced(prog, launch_every=every, interval_s=DUTY_INTERVAL_S) as tracer:
                runs.setdefault(name, []).append(_workload_cpu_ns(prog, tracer))
    base = statistics.median(runs["untraced"])
    return {name: statistics.median(runs[name]) - base for name, _ in DUTY_MODES} | {"untraced": base}


def _drain_every_second(tracer: Tracer, stop: threading.Event) -> None:
    while not stop.is_set():
        tracer.drain()
        stop.wait(1.0)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@dataclass(frozen=True, slots=True)
class Paced:
    """One paced run under the tracer: the rate reached, the tracer's CPU, the BPF programs' run time."""

    target: float
    rate: float
    calls: int
    tracer_cpu_pct: float  # this process (the tracer) per wall second, user + system
    bpf_run_ns: int  # all programs, summed over the run
    entry_runs: int  # runs of the launch entry program (one per traced call)
    per_program: dict[str, int]  # run time by program, ns


def _paced(tracer: Tracer, prog: Path, target: float) -> Paced:
    """Run the workload at ``target`` calls/s for PACED_S while the tracer drains once a second."""
    calls = int(target * PACED_S)
    before = tracer.program_stats()
    stop = threading.Event()
    drainer = threading.Thread(target=_drain_every_second, args=(tracer, stop))
    cpu0, t0 = _cpu_s(), time.monotonic()
    drainer.start()
    ns = _loop(prog, calls, target)
    stop.set()
    drainer.join()
    wall, cpu = time.monotonic() - t0, _cpu_s() - cpu0
    after = tracer.program_stats()
    per_program = {k: after[k].run_time_ns - before[k].run_time_ns for k in after}
    entry = after[ENTRY].run_cnt - before[ENTRY].run_cnt
    return Paced(target, 1e9 / ns, calls, 100 * cpu / wall, sum(per_program.values()), entry, per_program)


def _tracer_cpu_at(runs: list[Paced], rate: float) -> tuple[float, float, str]:
    """The tracer's CPU at ``rate`` and the measured figure at the higher paced rate, with the model used.

    Each paced rate ran ROUNDS times; the medians are compared.  They are
    called flat when they differ by no more than the spread of the repeats at
    either rate (or FLAT_PCT): the drain reads fixed-size maps once a second,
    so its cost should not follow the call rate.  Flat: the larger median.
    Otherwise a line through the two medians, extrapolated to ``rate``.
    """
    by_rate: dict[float, list[Paced]] = {}
    for r in runs:
        by_rate.setdefault(r.target, []).append(r)
    (lo_rate, lo), (hi_rate, hi) = sorted(
        (statistics.median(r.rate for r in rs), [r.tracer_cpu_pct for r in rs]) for rs in by_rate.values()
    )
    lo_med, hi_med = statistics.median(lo), statistics.median(hi)
    spread = max(max(lo) - min(lo), max(hi) - min(hi), FLAT_PCT)
    if abs(hi_med - lo_med) <= spread:
        return max(lo_med, hi_med), hi_med, "flat"
    slope = max(0.0, (hi_med - lo_med) / (hi_rate - lo_rate))
    return hi_med + slope * (rate - hi_rate), hi_med, "linear"


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
            with _traced(prog) as tracer, bpf_run_time_stats() as how:
                runs = [_paced(tracer, prog, target) for _ in range(ROUNDS) for target in PACED_RATES]
            duty = _duty_costs(prog)
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
    for r in runs:
        if r.entry_runs != r.calls:
            print(
                f"bench-ebpf: {ENTRY} ran {r.entry_runs} times for {r.calls} calls "
                "(BPF run-time statistics not counting?)",
                file=sys.stderr,
            )
            return 1
    print(
        f"untraced cuLaunchKernel: {base:.1f} ns; traced (count + host-time histogram): {full:.1f} ns "
        f"(unpaced: {1e6 / full:.0f}k calls/s); count only: {count_only:.1f} ns"
    )
    all_calls = sum(r.calls for r in runs)
    bpf_ns = sum(r.bpf_run_ns for r in runs) / all_calls
    split = "; ".join(
        f"{name} {sum(r.per_program[name] for r in runs) / all_calls:.0f} ns"
        for name in sorted(runs[0].per_program)
        if any(r.per_program[name] for r in runs)
    )
    print(f"BPF run time per traced call by program: {split}")
    for r in runs:
        print(
            f"paced at {r.target / 1000:.0f}k/s (reached {r.rate / 1000:.1f}k/s, {r.calls} calls): "
            f"tracer process {r.tracer_cpu_pct:.3f}% of one core; BPF programs {r.bpf_run_ns / r.calls:.0f} ns per call"
        )
    tracer_pct, measured, model = _tracer_cpu_at(runs, TARGET)
    bpf_pct = 100 * bpf_ns * TARGET / 1e9
    total = tracer_pct + bpf_pct
    print(
        f"at {TARGET / 1000:.0f}k calls/s: tracer process {tracer_pct:.3f}% ({model} in the call rate) + "
        f"BPF programs {bpf_ns:.0f} ns x {TARGET / 1000:.0f}k/s = {bpf_pct:.3f}% -> {total:.2f}% of one core "
        f"(stats via {how}; excludes the uprobe trap, which the traced threads pay: ns_per_call)"
    )
    print(
        f"workload CPU per call at {DUTY_RATE / 1000:.0f}k/s, drains every {DUTY_INTERVAL_S} s: untraced "
        f"{duty['untraced']:.0f} ns; extra with launch uprobes "
        + ", ".join(
            f"{name} {duty[name]:.0f} ns ({100 * duty[name] * TARGET / 1e9:.2f}% of a core at "
            f"{TARGET / 1000:.0f}k launches/s)"
            for name, _ in DUTY_MODES
        )
    )
    rate_reached = statistics.median(r.rate for r in runs if r.target == max(PACED_RATES))
    print(
        f"BENCH ebpf ns_per_call={full - base:.0f} cpu_pct_at_100k={total:.2f} "
        f"bpf_ns_per_call={bpf_ns:.0f} tracer_cpu_pct_measured={measured:.3f} "
        f"tracer_cpu_model={model} rate_reached={rate_reached:.0f} "
        f"ns_per_call_count_only={count_only - base:.0f} untraced_ns={base:.1f} "
        f"workload_ns_per_call_off={duty['off']:.0f} workload_ns_per_call_1in10={duty['1-in-10']:.0f} "
        f"workload_ns_per_call_always={duty['always']:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
