"""The real-GPU check of the probes (issue 37), driven by bench/gpu/check.sh, which builds the
CUPTI probe, the ring extension and ring_tool first and puts a shadow ``kernel_insight`` package
(this checkout's folders, linked) on PYTHONPATH. Runs with the machine's own python3 and PyTorch:

- a transformer block (TransformerEncoderLayer, bf16, forward + backward + SGD) for STEPS steps in
  separate processes, interleaved: plain, under the CUPTI probe (CUDA_INJECTION64_PATH), and with
  the CUDA-event spans (instrument_torch); the step-time overhead of each is the ratio of medians;
- the probe's kernels in the measured steps against torch.profiler's on the same steps (another
  process: CUPTI serves one subscriber), count and summed device time;
- the NVML sampler's readings against nvidia-smi's; the two ``gpu``-marked tests.

Prints a JSON summary; the shell script turns it into the BENCH line and the exit status.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
STEPS = int(os.environ.get("KI_CHECK_STEPS", "300"))
WARMUP = 50
ROUNDS = int(os.environ.get("KI_CHECK_ROUNDS", "3"))
PREFIX = f"kigpucheck{os.getpid()}-"


# ---- the workload (run as: check.py workload MODE OUT_JSON) --------------------------------------


def workload(mode: str, out: str) -> None:
    import torch

    torch.manual_seed(0)
    dev = torch.device("cuda")
    layer = torch.nn.TransformerEncoderLayer(
        d_model=1024, nhead=16, dim_feedforward=4096, batch_first=True, dtype=torch.bfloat16, device=dev
    )
    opt = torch.optim.SGD(layer.parameters(), lr=1e-4)
    x = torch.randn(8, 512, 1024, dtype=torch.bfloat16, device=dev)
    hooks = None
    if mode == "span":
        from kernel_insight.agent.probe import instrument_torch

        hooks = instrument_torch(layer, max_depth=2)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        layer(x).float().square().mean().backward()
        opt.step()

    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    times: list[float] = []
    prof_kernels: list[tuple[str, float]] = []
    t0 = time.time_ns()
    if mode == "profiler":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(STEPS):
                step()
            torch.cuda.synchronize()
        for e in prof.events():
            if str(e.device_type).endswith("CUDA") and not e.name.startswith(("Memcpy", "Memset")):
                prof_kernels.append((e.name, e.time_range.elapsed_us() * 1000.0))
    else:
        for _ in range(STEPS):
            a = time.perf_counter_ns()
            step()
            torch.cuda.synchronize()
            times.append((time.perf_counter_ns() - a) / 1e6)
    t1 = time.time_ns()
    if hooks is not None:
        hooks.remove()
    Path(out).write_text(
        json.dumps(
            {
                "mode": mode,
                "pid": os.getpid(),
                "t0": t0,
                "t1": t1,
                "median_ms": statistics.median(times) if times else None,
                "kernels": len(prof_kernels),
                "kernel_ns": sum(ns for _, ns in prof_kernels),
            }
        )
    )


# ---- the driver -------------------------------------------------------------------------------


def run_workload(mode: str, build: Path, env: dict[str, str]) -> dict[str, Any]:
    out = build / f"w-{mode}-{time.monotonic_ns()}.json"
    subprocess.run([sys.executable, __file__, "workload", mode, str(out)], env=env, check=True, timeout=240)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def ring_tool(build: Path, *args: str) -> str:
    done = subprocess.run([str(build / "ring_tool"), *args], capture_output=True, text=True, check=True)
    return done.stdout


def drain_kernels(build: Path, gpu: int, t0: int, t1: int, pid: int) -> tuple[int, float, int]:
    """Kernels of pid starting in [t0, t1] from GPU gpu's ring (count, summed ns), and how many
    had their launch's LAUNCH_SPAN."""
    lines = ring_tool(build, "drain", f"/kernel_insight.{PREFIX}{gpu}").splitlines()
    n, ns, launched, spans = 0, 0.0, 0, set()
    kernels = []
    for line in lines:
        f = line.split()
        if f[0] == "L":
            spans.add(int(f[3]))
        elif f[0] == "K" and int(f[5]) == pid and t0 <= int(f[2]) <= t1:
            kernels.append((int(f[2]), int(f[3]), int(f[4])))
    for start, end, corr in kernels:
        n += 1
        ns += end - start
        launched += corr in spans
    return n, ns, launched


def nvml_vs_smi(env: dict[str, str]) -> dict[str, Any]:
    try:
        import pynvml  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        return {"skipped": "no pynvml (nvidia-ml-py) for this python"}
    try:
        from kernel_insight.agent.probe.nvml import NvmlSampler
    except ImportError as e:  # the sampler's own dependencies (grpcio for the kubelet's pods, ...)
        return {"skipped": f"the NVML sampler needs {e.name}, not installed for this python"}

    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used,memory.total,temperature.gpu,power.draw,clocks.sm",
         "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True, text=True, check=True,
    ).stdout.split(",")  # fmt: skip
    used_mib, total_mib, temp_c, power_w, sm_mhz = (float(v) for v in smi)
    from kernel_insight.agent.metric_ids import MetricId
    from kernel_insight.agent.records import SampleRecord
    from kernel_insight.agent.ring import RingReader, ring_name

    name = ring_name(f"{PREFIX}nvml0")
    with NvmlSampler.open(gpus=[0], label_prefix=f"{PREFIX}nvml", interval_s=0.5) as s:
        s.run(1.6)
    got: dict[int, float] = {}
    with RingReader.open(name) as r:
        while batch := r.read():
            for rec in batch:
                if isinstance(rec, SampleRecord):
                    got[rec.metric] = rec.value
    ours = {
        "memory_total_bytes": (got.get(MetricId.MEMORY_TOTAL), total_mib * 2**20, 0.01),
        "memory_used_bytes": (got.get(MetricId.MEMORY_USED), used_mib * 2**20, 0.05),
        "temperature_c": (got.get(MetricId.TEMPERATURE), temp_c, 0.1),
        "power_w": (got.get(MetricId.POWER), power_w, 0.25),
        "sm_clock_hz": (got.get(MetricId.SM_CLOCK), sm_mhz * 1e6, 0.25),
    }
    # dcgm-exporter's series (issue 38) of the same samples, in DCGM's units; the GPM profiling
    # fields (DCGM_FI_PROF_*) on Hopper and later, from the second sample on.
    from kernel_insight.agent.dcgm import dcgm_id
    from kernel_insight.agent.metric_ids import METRIC_SPECS

    ours["dcgm_fb_used_mib"] = (got.get(dcgm_id(252)), used_mib, 0.05)
    ours["dcgm_gpu_temp_c"] = (got.get(dcgm_id(150)), temp_c, 0.1)
    ours["dcgm_power_w"] = (got.get(dcgm_id(155)), power_w, 0.25)
    ours["dcgm_sm_clock_mhz"] = (got.get(dcgm_id(100)), sm_mhz, 0.25)
    out: dict[str, Any] = {
        "dcgm_prof": {
            METRIC_SPECS[m].name: v
            for m, v in got.items()
            if m in METRIC_SPECS and "_PROF_" in METRIC_SPECS[m].name
        }
    }
    ok = True
    for k, (mine, theirs, tol) in ours.items():
        agree = mine is not None and abs(mine - theirs) <= tol * max(abs(theirs), 1.0)
        ok &= agree
        out[k] = {"sampler": mine, "nvidia_smi": theirs, "agree": agree}
    out["ok"] = ok
    return out


def gpu_tests(env: dict[str, str]) -> dict[str, Any]:
    try:
        import pytest  # noqa: F401
    except ImportError:
        return {"skipped": "no pytest for this python"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-c", "/dev/null", "--rootdir", str(ROOT), "-p", "no:cacheprovider",
         "-m", "gpu", "-rs", str(ROOT / "tests" / "probe" / "test_probe_timing.py")],
        env=env, capture_output=True, text=True, check=False, cwd=ROOT, timeout=180,
    )  # fmt: skip
    tail = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
    return {"ok": done.returncode == 0 and "2 passed" in tail, "summary": tail, "output": done.stdout[-3000:]}


def main() -> int:
    build = Path(sys.argv[1])
    probe = build / "libki_cupti.so.1"
    base = dict(os.environ)
    base["KI_PROBE_LABEL_PREFIX"] = PREFIX
    import torch

    gpu = torch.cuda.current_device()
    ring_tool(build, "create", f"/kernel_insight.{PREFIX}{gpu}", str(1 << 20))  # 64 MiB: every run's records
    cupti_env = {**base, "CUDA_INJECTION64_PATH": str(probe)}
    span_env = {**base, "KI_PROBE_BACKEND": "torch"}
    summary: dict[str, Any] = {"gpu": torch.cuda.get_device_name(gpu), "torch": torch.__version__}
    medians: dict[str, list[float]] = {"plain": [], "cupti": [], "span": []}
    cupti_runs = []
    span_error = None
    for _ in range(ROUNDS):  # interleaved, so drifts in clocks and temperature fall on every mode
        medians["plain"].append(run_workload("plain", build, base)["median_ms"])
        r = run_workload("cupti", build, cupti_env)
        medians["cupti"].append(r["median_ms"])
        cupti_runs.append(r)
        if span_error is None:
            try:
                medians["span"].append(run_workload("span", build, span_env)["median_ms"])
            except subprocess.CalledProcessError as e:
                span_error = f"span workload failed: {e}"
    plain = statistics.median(medians["plain"])
    summary["step_ms"] = {k: v for k, v in medians.items()}
    summary["cupti_overhead_pct"] = 100.0 * (statistics.median(medians["cupti"]) / plain - 1.0)
    summary["span_overhead_pct"] = (
        100.0 * (statistics.median(medians["span"]) / plain - 1.0) if medians["span"] else None
    )
    if span_error:
        summary["span_error"] = span_error
    # The last CUPTI run's kernels in its measured window (its ring was drained after each run: the
    # first runs' records were read and dropped by this drain too, filtered by pid).
    last = cupti_runs[-1]
    n, ns, launched = drain_kernels(build, gpu, last["t0"], last["t1"], last["pid"])
    prof = run_workload("profiler", build, base)
    summary["kernels"] = {
        "probe": n,
        "torch_profiler": prof["kernels"],
        "probe_device_ms": ns / 1e6,
        "torch_profiler_device_ms": prof["kernel_ns"] / 1e6,
        "with_launch": launched,
    }
    summary["device_time_diff_pct"] = 100.0 * (ns / prof["kernel_ns"] - 1.0) if prof["kernel_ns"] else None
    for key, part in (("nvml", nvml_vs_smi), ("gpu_tests", gpu_tests)):
        try:
            summary[key] = part(base)
        except Exception as e:  # a part that cannot run is a failed part, said, not a crash
            summary[key] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "workload":
        workload(sys.argv[2], sys.argv[3])
        sys.exit(0)
    sys.exit(main())
