"""make bench-histogram: kernel histograms on the path users run (issue 14).

Real processes on loopback: the C kernel producer (kernel_producer.c) writes long-tailed
KERNEL records into a ring, the real ki-agent (histograms on, its defaults) aggregates them
and ships histograms and kept spans to a real ``ki collector``. Three agent runs:

- ``ns_per_kernel``: agent CPU time (its threads' schedstat, to the ns) while the producer writes
  1M kernels/s over 100 kernel names for ``--seconds``, divided by the kernels written: the median
  of ``--cpu-runs`` such runs into one agent (``ns_per_kernel_min``, ``ns_per_kernel_max``).
- ``hwm_kb``: the agent's VmHWM after 10,000 distinct kernel names (2M kernels, as fast as the
  ring takes them) and an export of every histogram (``--histogram-interval-s 1`` in this run);
  ``hwm_4p_kb``: the same agent's VmHWM once three more producer processes wrote the same 2M
  kernels over the same names (a key per pid: the table fills its default 12,288 keys, the rest
  refused and counted, ``hwm_4p_refused``), the keys and names a host of several processes holds.
- ``wire_bytes_per_gpu_s``: frame bytes (compressed bodies plus 80 bytes of header and tag
  per batch, from the agent's own counters as the collector stored them) per second at 100k
  kernels/s over 100 names as long as real ones (``kernel_names.txt``: PyTorch, cuBLAS, cutlass,
  flash-attention, Triton and NCCL kernels as Nsight Systems shows them, 181 bytes on average;
  ``wire_short_names``: the same with the producer's 9-byte ``kernel_17`` names, which hid what
  names cost) for ``--wire-seconds`` (300: the first export gives the tail threshold,
  so a short run flatters the figure; cumulative histograms, --histogram-snapshot-s 0, also grow
  with the agent's uptime), with the frame bytes per second minute by minute and of the first and
  last minute (``wire_first_min``, ``wire_last_min``: increments keep them flat); ``hist_only``
  the same without kept spans (--span-sample-rate 0 --span-tail-rate 0).

``--phases wire --skip-kql`` runs only the wire figures.

Then kql (bench/histogram/quantile.py): ``histogram_quantile(0.99, sum by (kernel)
(rate(kernel_duration_seconds[5m])))`` as a range query over 1 h at 15 s on 1,000 kernel
histograms against the same on classic ``_bucket`` series of the same data, both read from an
EmbeddedStore by a real ``ki collector`` answering ``/api/v1/query_range`` to a keep-alive
client (``quantile_ms``/``classic_quantile_ms``: client wall; ``*_cpu_ms``: the collector's
CPU), and in-process over MemoryStorage (``memory_*``); the classic query also on Prometheus and
VictoriaMetrics over the same buckets (``prometheus_classic_quantile_ms``,
``vm_classic_quantile_ms``). Ends with one ``BENCH histogram ...`` line.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.e2e.fleet import smaps_kb
from bench.kql.servers import process_cpu_s

REPO = Path(__file__).resolve().parents[2]

__all__ = ["main"]


def _agent_binary() -> Path:
    """The worktree's ki-agent, or ``$KI_BENCH_AGENT`` (an A/B run against a copy of another build)."""
    return Path(os.environ.get("KI_BENCH_AGENT") or REPO / "agent" / "bin" / "ki-agent")


def _hwm_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def _start_collector(tmp: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernel_insight.cli", "collector", "--store", str(tmp / "data"),
         "--keys", str(tmp / "keys.json"), "--tokens", str(tmp / "tokens.json"), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if "listening on " not in line:
        raise RuntimeError(f"collector did not start: {line}")
    return proc, line.split("listening on ")[1].strip()


class _Run:
    """One ring, one enrolled agent, one collector store under ``tmp``."""

    def __init__(
        self, tmp: Path, producer: Path, name: str, *agent_args: str, ring_name: str | None = None
    ) -> None:
        from kernel_insight.agent.ring import Ring
        from kernel_insight.collector.keys import KeyStore

        self.tmp, self.producer = tmp, producer
        self.ring_name = ring_name or f"/ki_bench_hist.{os.getpid()}.{name}"
        KeyStore(tmp / "keys.json").add_agent(name).write_key_file(tmp / "agent.key")
        with contextlib.suppress(OSError):
            Ring.unlink(self.ring_name)
        self.ring = Ring.create(self.ring_name)  # the default capacity, as a probe creates it
        self.collector, url = _start_collector(tmp)
        self.agent = subprocess.Popen(
            [str(_agent_binary()), "--ring", self.ring_name, "--collector", url, "--key-file", str(tmp / "agent.key"),
             "--spool-dir", str(tmp / "spool"), "--shutdown-timeout-s", "60", "--log-level", "warn", *agent_args],
        )  # fmt: skip

    def produce(self, count: int, kernels: int, rate: int, names: Path | None = None) -> float:
        """Run the producer (``names``: its kernel names file, else ``kernel_<k>``); its wall seconds."""
        t = time.monotonic()
        subprocess.run(
            [str(self.producer), self.ring_name, str(count), str(kernels), str(rate), "1",
             *(("-", str(names)) if names else ())],
            check=True, capture_output=True, timeout=600,
        )  # fmt: skip
        return time.monotonic() - t

    def finish(self, windows: bool = False) -> dict[str, float]:
        """Stop agent and collector; the agent's last counters as stored (with ``windows``, also
        the frame bytes per second of the run's first and last minute: ``first_min_bytes_per_s``,
        ``last_min_bytes_per_s``)."""
        from kernel_insight.agent.ring import Ring
        from kernel_insight.collector.clickhouse.store import EmbeddedStore

        self.agent.send_signal(signal.SIGTERM)
        self.agent.wait(120)
        self.collector.send_signal(signal.SIGTERM)
        self.collector.communicate(timeout=120)
        self.ring.close()
        with contextlib.suppress(OSError):
            Ring.unlink(self.ring_name)
        store = EmbeddedStore(self.tmp / "data")
        try:
            rows = store.query(
                "SELECT metric, argMax(value, ts) AS v FROM ki.samples WHERE metric LIKE 'ki_agent_%' GROUP BY metric"
            ).to_pylist()
            series = (
                store.query(
                    "SELECT metric, toUnixTimestamp64Milli(ts) AS t, value AS v FROM ki.samples"
                    " WHERE metric IN ('ki_agent_bytes_compressed_total', 'ki_agent_batches_sealed_total')"
                    " ORDER BY ts"
                ).to_pylist()
                if windows
                else []
            )
        finally:
            store.close()
        out = {r["metric"]: float(r["v"]) for r in rows}
        if series:
            out.update(_minute_rates(series))
        return out


def _minute_rates(series: list[dict[str, float]]) -> dict[str, float]:
    """Frame bytes per second (compressed bodies + 80 bytes a batch) over the first and the last
    60 s of the agent's counter samples: whether the bytes grow with the agent's uptime."""
    by: dict[str, list[tuple[float, float]]] = {}
    for r in series:
        by.setdefault(str(r["metric"]), []).append((float(r["t"]) / 1000, float(r["v"])))
    b, n = by.get("ki_agent_bytes_compressed_total", []), by.get("ki_agent_batches_sealed_total", [])
    if len(b) < 4 or len(b) != len(n):
        return {}
    frames = [(t, v + 80 * nb) for (t, v), (_, nb) in zip(b, n, strict=True)]
    t0, t1 = frames[0][0], frames[-2][0]  # the last sample is SIGTERM's final export: left out

    def rate(lo: float, hi: float) -> float:
        inside = [(t, v) for t, v in frames if lo <= t <= hi]
        return (
            (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])
            if len(inside) > 1
            else float("nan")
        )

    minutes = [rate(t, t + 60) for t in np.arange(t0, t1 - 59, 60.0).tolist()]
    print("frame bytes per second, minute by minute:", " ".join(f"{m:.0f}" for m in minutes), flush=True)
    return {"first_min_bytes_per_s": rate(t0, t0 + 60), "last_min_bytes_per_s": rate(t1 - 60, t1)}


#: Realistic kernel names, one a line (the wire runs' names unless asked for short ones).
KERNEL_NAMES = Path(__file__).resolve().parent / "kernel_names.txt"


def _wire(
    root: Path, producer: Path, name: str, seconds: int, *agent_args: str, names: Path | None = KERNEL_NAMES
) -> dict[str, float]:
    """Frame bytes and batches per second at 100k kernels/s over 100 names (the last export at
    SIGTERM included, so a longer run measures closer to the steady state), and the frame bytes
    per second of its first and last minute."""
    tmp = root / name
    tmp.mkdir()
    run = _Run(tmp, producer, name, *agent_args)
    took = run.produce(100_000 * seconds, 100, 100_000, names)
    c = run.finish(windows=True)
    batches = c.get("ki_agent_batches_sealed_total", 0.0)
    frames = c.get("ki_agent_bytes_compressed_total", 0.0) + 80 * batches
    nan = float("nan")
    return {
        "bytes_per_s": frames / took,
        "batches_per_s": batches / took,
        "first_min_bytes_per_s": c.get("first_min_bytes_per_s", nan),
        "last_min_bytes_per_s": c.get("last_min_bytes_per_s", nan),
        "increments": c.get("ki_agent_histogram_increments_total", 0.0),
        "histograms": c.get("ki_agent_histograms_shipped_total", 0.0),
    }


PHASES = ("cpu", "hwm", "wire")


def agent_figures(
    seconds: int,
    cpu_runs: int = 5,
    phases: tuple[str, ...] = PHASES,
    wire_seconds: int = 300,
    wire_args: tuple[str, ...] = (),
    hist_only: bool = True,
    show_smaps: bool = False,
    short_names: bool = True,
) -> dict[str, float]:
    """The agent's figures of ``phases`` (each absent one is NaN); ``show_smaps`` prints the hwm
    run's resident memory by mapping to stderr; ``short_names`` adds the wire run with the
    producer's short names (``wire_short_names``)."""
    from bench.histogram.producer import build_producer

    nan = float("nan")
    out: dict[str, float] = dict.fromkeys(
        ("ns_per_kernel", "hwm_kb", "hwm_4p_kb", "wire_bytes_per_gpu_s"), nan
    )
    out["hist_only_bytes_per_gpu_s"] = out["wire_short_names"] = nan
    out["ns_per_kernel_min"] = out["ns_per_kernel_max"] = nan
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        producer = build_producer(root)
        if "cpu" in phases:
            _cpu(root, producer, seconds, out, cpu_runs)
        if "hwm" in phases:
            _hwm(root, producer, out, show_smaps)
        if "wire" in phases:
            # 3. Wire bytes per GPU-second at 100k kernels/s, with and without kept spans, over a
            # run long enough to hold several histogram exports (histogram_interval_s).
            w = _wire(root, producer, "wire", wire_seconds, *wire_args)
            out["wire_bytes_per_gpu_s"], out["wire_batches_per_s"] = w["bytes_per_s"], w["batches_per_s"]
            out["wire_first_min"], out["wire_last_min"] = (
                w["first_min_bytes_per_s"],
                w["last_min_bytes_per_s"],
            )
            out["wire_increments"], out["wire_histograms"] = w["increments"], w["histograms"]
            if short_names:
                out["wire_short_names"] = _wire(
                    root, producer, "short", wire_seconds, *wire_args, names=None
                )["bytes_per_s"]
            if hist_only:
                h = _wire(root, producer, "histonly", wire_seconds, *wire_args, "--span-sample-rate", "0",
                          "--span-tail-rate", "0")  # fmt: skip
                out["hist_only_bytes_per_gpu_s"] = h["bytes_per_s"]
                out["hist_only_first_min"], out["hist_only_last_min"] = (
                    h["first_min_bytes_per_s"],
                    h["last_min_bytes_per_s"],
                )
    return out


def _cpu(root: Path, producer: Path, seconds: int, out: dict[str, float], runs: int) -> None:
    """1. CPU per kernel at 1M kernels/s: the median of ``runs`` producer runs into one agent
    (``ns_per_kernel_min``/``_max``: the spread; on this 2-vCPU VM one run alone moved by a fifth
    from run to run, docs/benchmarks.md)."""
    (root / "cpu").mkdir()
    run = _Run(root / "cpu", producer, "cpu")
    time.sleep(0.5)
    per_kernel, took = [], 0.0
    for _ in range(runs):
        before = process_cpu_s(run.agent.pid)
        took += run.produce(1_000_000 * seconds, 100, 1_000_000)
        time.sleep(0.3)  # the last drain tick
        per_kernel.append((process_cpu_s(run.agent.pid) - before) * 1e9 / (1_000_000 * seconds))
    counters = run.finish()
    out["ns_per_kernel"] = float(np.median(per_kernel))
    out["ns_per_kernel_min"], out["ns_per_kernel_max"] = min(per_kernel), max(per_kernel)
    out["achieved_kernels_per_s"] = 1_000_000 * seconds * runs / took
    out["aggregated"] = counters.get("ki_agent_kernels_aggregated_total", 0.0)


#: Producer processes of the hwm phase's second figure (each a pid of its own: keys, not names).
HWM_PRODUCERS = 4


def _hwm(root: Path, producer: Path, out: dict[str, float], show_smaps: bool = False) -> None:
    """2. VmHWM with 10,000 kernel names from one producer process, then from four."""
    (root / "hwm").mkdir()
    # Histograms shipped every second in this run (default histogram_interval_s: 10), so that the
    # peak includes an export of every key, as a longer run's does.
    run = _Run(root / "hwm", producer, "hwm", "--names-max", "16384", "--names-bytes", "1048576",
               "--histogram-interval-s", "1")  # fmt: skip
    run.produce(2_000_000, 10_000, 0)
    time.sleep(1.5)  # one histogram export of every key
    out["hwm_kb"] = _hwm_kb(run.agent.pid)
    maps = smaps_kb(run.agent.pid)
    out["rss_anon_kb"] = sum(a for _, a in maps.values())
    out["rss_file_kb"] = sum(r - a for r, a in maps.values())
    if show_smaps:
        for path, (rss, anon) in sorted(maps.items(), key=lambda kv: -kv[1][0]):
            print(f"smaps {rss:6d} kB rss {anon:6d} kB anon  {path}", file=sys.stderr)
    for _ in range(HWM_PRODUCERS - 1):
        run.produce(2_000_000, 10_000, 0)
        time.sleep(1.5)
    out["hwm_4p_kb"] = _hwm_kb(run.agent.pid)
    out["rss_anon_4p_kb"] = sum(a for _, a in smaps_kb(run.agent.pid).values())
    counters = run.finish()
    out["hwm_4p_keys"] = counters.get("ki_agent_histogram_keys", 0.0)
    out["hwm_4p_refused"] = counters.get("ki_agent_histogram_refused_total", 0.0)


#: The kql figures the BENCH line carries (bench.histogram.quantile; NaN with --skip-kql).
_KQL_KEYS = (
    "quantile_ms",
    "classic_quantile_ms",
    "quantile_cpu_ms",
    "classic_quantile_cpu_ms",
    "memory_quantile_cpu_ms",
    "memory_classic_quantile_cpu_ms",
    "prometheus_classic_quantile_ms",
    "vm_classic_quantile_ms",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=5, help="seconds of each paced producer run")
    ap.add_argument(
        "--cpu-runs",
        type=int,
        default=5,
        help="paced producer runs of the cpu phase (the figure: their median)",
    )
    ap.add_argument(
        "--wire-seconds", type=int, default=300,
        help="seconds of each wire run (several histogram exports: histograms are cumulative, so "
        "their bytes grow with the agent's uptime)",
    )  # fmt: skip
    ap.add_argument("--skip-kql", action="store_true", help="only the agent figures")
    ap.add_argument(
        "--histogram-interval-s", type=int, default=None,
        help="the wire runs' agent histogram_interval_s (default: the agent's own default)",
    )  # fmt: skip
    ap.add_argument(
        "--histogram-snapshot-s", type=int, default=None,
        help="the wire runs' agent histogram_snapshot_s (0: cumulative histograms only, as before increments)",
    )  # fmt: skip
    ap.add_argument(
        "--smaps", action="store_true",
        help="print the hwm agent's resident and anonymous kB by mapping (/proc/<pid>/smaps) to stderr",
    )  # fmt: skip
    ap.add_argument("--no-hist-only", action="store_true", help="skip the wire run without kept spans")
    ap.add_argument(
        "--no-short-names",
        action="store_true",
        help="skip the wire run with the producer's short kernel names",
    )
    ap.add_argument(
        "--agent-arg", action="append", default=[],
        help="one more ki-agent argument for the wire runs (repeat: --agent-arg=--span-sample-rate --agent-arg=0)",
    )  # fmt: skip
    ap.add_argument(
        "--phases", default=",".join(PHASES),
        help=f"comma-separated agent phases to run, of {','.join(PHASES)} (the others print nan)",
    )  # fmt: skip
    a = ap.parse_args()
    phases = tuple(p for p in a.phases.split(",") if p)
    if not set(phases) <= set(PHASES):
        ap.error(f"--phases: choose from {','.join(PHASES)}")
    if a.cpu_runs < 1 or a.seconds < 1:
        ap.error("--cpu-runs and --seconds: at least 1")
    load = os.getloadavg()
    wire_args: tuple[str, ...] = ()
    if a.histogram_interval_s is not None:
        wire_args += ("--histogram-interval-s", str(a.histogram_interval_s))
    if a.histogram_snapshot_s is not None:
        wire_args += ("--histogram-snapshot-s", str(a.histogram_snapshot_s))
    wire_args += tuple(a.agent_arg)
    figs = agent_figures(
        a.seconds,
        a.cpu_runs,
        phases,
        a.wire_seconds,
        wire_args,
        not a.no_hist_only,
        a.smaps,
        not a.no_short_names,
    )
    q = dict.fromkeys(_KQL_KEYS, float("nan"))
    if not a.skip_kql:
        from bench.histogram.quantile import quantile_figures

        q = quantile_figures()
    for k, v in {**figs, **q}.items():
        print(f"{k}: {v:.1f}")
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(
        f"BENCH histogram ns_per_kernel={figs['ns_per_kernel']:.1f}"
        f" ns_per_kernel_min={figs['ns_per_kernel_min']:.1f} ns_per_kernel_max={figs['ns_per_kernel_max']:.1f}"
        f" hwm_kb={figs['hwm_kb']:.0f}"
        f" hwm_4p_kb={figs['hwm_4p_kb']:.0f}"
        f" wire_bytes_per_gpu_s={figs['wire_bytes_per_gpu_s']:.0f}"
        f" wire_short_names={figs['wire_short_names']:.0f} quantile_ms={q['quantile_ms']:.1f}"
        f" classic_quantile_ms={q['classic_quantile_ms']:.1f}"
        f" quantile_cpu_ms={q['quantile_cpu_ms']:.1f} classic_quantile_cpu_ms={q['classic_quantile_cpu_ms']:.1f}"
        f" memory_quantile_cpu_ms={q['memory_quantile_cpu_ms']:.1f}"
        f" memory_classic_quantile_cpu_ms={q['memory_classic_quantile_cpu_ms']:.1f}"
        f" prometheus_classic_quantile_ms={q['prometheus_classic_quantile_ms']:.1f}"
        f" vm_classic_quantile_ms={q['vm_classic_quantile_ms']:.1f}"
        f" hist_only_bytes_per_gpu_s={figs['hist_only_bytes_per_gpu_s']:.0f}"
        f" wire_batches_per_s={figs.get('wire_batches_per_s', float('nan')):.2f}"
        f" wire_first_min={figs.get('wire_first_min', float('nan')):.0f}"
        f" wire_last_min={figs.get('wire_last_min', float('nan')):.0f} load1={load[0]:.2f}"
    )


if __name__ == "__main__":
    main()
