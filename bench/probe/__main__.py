"""make bench-probe: host cost of a span, and instrument_torch's share of a transformer layer's step.

Uses the CUDA back end when PyTorch sees a GPU, else the CPU clock back end
(the figures then measure the probe's own Python cost, not CUDA event
records).  Targets (issue 7): < 2 us of host time per span, < 0.3% of the
step time of a transformer layer.  Then the NVML sampler with the DCGM set on
(bench/probe/nvml.py; issue 38): its CPU at 1 Hz over 8 GPUs < 0.5% of a core, the agent's
VmHWM <= 5 MB and <= 4 KB on the wire per GPU-second beside 100k kernels/s.
``--phases spans,nvml`` picks; ``--nvml-seconds`` (300) sets the NVML run's length.
Ends with one ``BENCH probe ...`` line.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import statistics
import sys
import time
from typing import Any

from kernel_insight.agent import Ring, ring_name
from kernel_insight.agent.probe.timing import Probe, instrument_torch, span
from kernel_insight.agent.probe.timing import _choose_backend as choose_backend

PREFIX = "bench-probe-"
SPANS = 20_000
ROUNDS = 5


def _span_ns(probe: Probe) -> float:
    """Median host ns per ``with span(...)`` (an empty body), over ROUNDS rounds."""
    s = span("bench_span", probe=probe)
    out = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter_ns()
        for _ in range(SPANS):
            with s:
                pass
        out.append((time.perf_counter_ns() - t0) / SPANS)
        probe.flush(30)
    return statistics.median(out)


def _layer_overhead(torch: Any, probe: Probe) -> tuple[float, float, int]:
    """(step ms without spans, % added by instrument_torch, spans per step) for one TransformerEncoderLayer forward."""
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    layer = torch.nn.TransformerEncoderLayer(
        d_model=1024, nhead=16, dim_feedforward=4096, batch_first=True
    ).to(dev)
    layer.eval()
    x = torch.randn(8, 512 if cuda else 128, 1024, device=dev)

    def step_ms(n: int) -> float:
        with torch.no_grad():
            for _ in range(3):
                layer(x)
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                layer(x)
            if cuda:
                torch.cuda.synchronize()
            return (time.perf_counter() - t0) * 1e3 / n

    n = 50 if cuda else 10
    base, hooked = [], []
    spans = 0
    for _ in range(ROUNDS):
        base.append(step_ms(n))
        with instrument_torch(layer, probe=probe) as hooks:
            spans = len(hooks.modules)
            hooked.append(step_ms(n))
        probe.flush(30)
    b, h = statistics.median(base), statistics.median(hooked)
    return b, 100 * (h - b) / b, spans


class _Empty:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _calibration_ns() -> float:
    """ns of an empty ``with`` on this machine now: spans cost a few of these, so shared or slow CPUs show."""
    e = _Empty()
    t0 = time.perf_counter_ns()
    for _ in range(SPANS):
        with e:
            pass
    return (time.perf_counter_ns() - t0) / SPANS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--phases", default="spans,nvml", help="spans, nvml or both (default)")
    ap.add_argument("--nvml-seconds", type=int, default=300, help="length of the NVML run (default 300)")
    ap.add_argument("--no-dcgm", action="store_true", help="the NVML run without the DCGM set (a baseline)")
    args = ap.parse_args()
    phases = set(args.phases.split(","))
    nvml = {"nvml_cpu_pct": math.nan, "nvml_records_per_gpu_s": math.nan, "agent_hwm_kb": math.nan}
    nvml["wire_bytes_per_gpu_s"] = math.nan
    if "nvml" in phases:
        from bench.probe.nvml import nvml_figures

        nvml = nvml_figures(args.nvml_seconds, dcgm_names=not args.no_dcgm)
        print(
            f"NVML sampler, 8 GPUs at 1 Hz, DCGM set {'off' if args.no_dcgm else 'on'}: "
            f"{nvml['nvml_cpu_pct']:.3f}% of a core (target < 0.5), "
            f"{nvml['nvml_records_per_gpu_s']:.1f} records per GPU-second; agent VmHWM "
            f"{nvml['agent_hwm_kb']:.0f} kB (target <= 5120), {nvml['wire_bytes_per_gpu_s']:.0f} wire bytes per "
            "GPU-second at 100k kernels/s (target <= 4096)"
        )
    nvml_line = " ".join(f"{k}={v:.3f}" for k, v in nvml.items())
    if "spans" not in phases:
        print(f"BENCH probe {nvml_line}")
        return 0
    backend = choose_backend()
    probe = Probe(backend, label_prefix=PREFIX)
    try:
        calib = _calibration_ns()
        ns = _span_ns(probe)
        try:
            torch = importlib.import_module("torch")
        except ImportError:
            print("bench-probe: PyTorch not installed: no transformer-layer figure", file=sys.stderr)
            step_ms, pct, spans = float("nan"), float("nan"), 0
        else:
            step_ms, pct, spans = _layer_overhead(torch, probe)
        # The measured difference drowns in run-to-run noise on a busy machine; spans x cost does not.
        est = 100 * spans * ns / (step_ms * 1e6)
        print(
            f"back end {backend.name}: {ns:.0f} ns of host time per span (target < 2000); empty with: {calib:.0f} ns"
        )
        print(
            f"TransformerEncoderLayer step {step_ms:.2f} ms; instrument_torch adds {pct:.3f}% (target < 0.3%)"
        )
        print(
            f"BENCH probe backend={backend.name} ns_per_span={ns:.0f} layer_step_ms={step_ms:.3f} "
            f"layer_overhead_pct={pct:.3f} layer_overhead_est_pct={est:.4f} empty_with_ns={calib:.0f} "
            f"{nvml_line}"
        )
    finally:
        probe.close()
        with contextlib.suppress(OSError):
            Ring.unlink(ring_name(f"{PREFIX}0"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
