"""The real-GPU check of the probes (issue 37), driven by bench/gpu/check.sh, which builds the
CUPTI probe, the ring extension and ring_tool first and puts a shadow ``kernel_insight`` package
(this checkout's folders, linked) on PYTHONPATH. Runs with the machine's own python3 and PyTorch:

- a transformer block (TransformerEncoderLayer, bf16, forward + backward + SGD) for STEPS steps in
  separate processes, interleaved: plain, under the CUPTI probe (CUDA_INJECTION64_PATH), and with
  the CUDA-event spans (instrument_torch); the step-time overhead of each is the ratio of medians;
- the probe's kernels in the measured steps against torch.profiler's on the same steps (another
  process: CUPTI serves one subscriber), count and summed device time;
- the NVML sampler's readings, ours and dcgm-exporter's (issue 38), against nvidia-smi's; the
  GPM profiling fields (``DCGM_FI_PROF_*``) under a GEMM load, beside nvidia-smi dmon's GPM
  readings; the two ``gpu``-marked tests.

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


#: Our series and dcgm-exporter's that nvidia-smi also reports: name -> (the sampler's GPU_SAMPLE
#: metric, the ``nvidia-smi --query-gpu`` field (nounits: MiB, MHz, W, C, percent), the factor from
#: nvidia-smi's unit to the series', the tolerance: relative ("rel") or absolute ("abs", in the
#: series' unit)). Volatile readings (use, power) are compared on the idle GPU after the workloads.
def _smi_table() -> dict[str, tuple[int, str, float, str, float]]:
    from kernel_insight.agent.dcgm import dcgm_id
    from kernel_insight.agent.metric_ids import MetricId

    mib = float(2**20)
    return {
        "memory_total_bytes": (MetricId.MEMORY_TOTAL, "memory.total", mib, "rel", 0.01),
        "memory_used_bytes": (MetricId.MEMORY_USED, "memory.used", mib, "rel", 0.05),
        "temperature_c": (MetricId.TEMPERATURE, "temperature.gpu", 1.0, "abs", 3.0),
        "power_w": (MetricId.POWER, "power.draw", 1.0, "rel", 0.25),
        "sm_clock_hz": (MetricId.SM_CLOCK, "clocks.sm", 1e6, "rel", 0.25),
        "DCGM_FI_DEV_SM_CLOCK": (dcgm_id(100), "clocks.sm", 1.0, "rel", 0.25),
        "DCGM_FI_DEV_MEM_CLOCK": (dcgm_id(101), "clocks.mem", 1.0, "rel", 0.05),
        "DCGM_FI_DEV_MEMORY_TEMP": (dcgm_id(140), "temperature.memory", 1.0, "abs", 3.0),
        "DCGM_FI_DEV_GPU_TEMP": (dcgm_id(150), "temperature.gpu", 1.0, "abs", 3.0),
        "DCGM_FI_DEV_POWER_USAGE": (dcgm_id(155), "power.draw", 1.0, "rel", 0.25),
        "DCGM_FI_DEV_GPU_UTIL": (dcgm_id(203), "utilization.gpu", 1.0, "abs", 30.0),
        "DCGM_FI_DEV_MEM_COPY_UTIL": (dcgm_id(204), "utilization.memory", 1.0, "abs", 30.0),
        "DCGM_FI_DEV_ENC_UTIL": (dcgm_id(206), "utilization.encoder", 1.0, "abs", 5.0),
        "DCGM_FI_DEV_DEC_UTIL": (dcgm_id(207), "utilization.decoder", 1.0, "abs", 5.0),
        "DCGM_FI_DEV_FB_FREE": (dcgm_id(251), "memory.free", 1.0, "rel", 0.05),
        "DCGM_FI_DEV_FB_USED": (dcgm_id(252), "memory.used", 1.0, "rel", 0.05),
        "DCGM_FI_DEV_FB_RESERVED": (dcgm_id(253), "memory.reserved", 1.0, "rel", 0.05),
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (
            dcgm_id(393),
            "remapped_rows.uncorrectable",
            1.0,
            "abs",
            0.0,
        ),
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": (dcgm_id(394), "remapped_rows.correctable", 1.0, "abs", 0.0),
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": (dcgm_id(395), "remapped_rows.failure", 1.0, "abs", 0.0),
    }


def smi_value(field: str) -> float | str:
    """One ``nvidia-smi --query-gpu`` field of GPU 0 as a number, or why there is none (one call per
    field: a field this nvidia-smi does not know fails the whole query)."""
    done = subprocess.run(
        ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    text = (done.stdout or done.stderr).strip()
    if done.returncode != 0:
        return f"nvidia-smi: {text[:120]}"
    if text in ("No", "Yes"):  # remapped_rows.failure / .pending
        return float(text == "Yes")
    try:
        return float(text)
    except ValueError:
        return f"nvidia-smi says {text[:60]!r}"


def _sampled(prefix: str, seconds: float) -> dict[int, list[float]]:
    """Every GPU_SAMPLE value the NVML sampler (DCGM set on) wrote for GPU 0 over ``seconds``, by metric id."""
    from kernel_insight.agent.probe.nvml import NvmlSampler
    from kernel_insight.agent.records import SampleRecord
    from kernel_insight.agent.ring import RingReader, ring_name

    with NvmlSampler.open(gpus=[0], label_prefix=prefix, interval_s=0.5) as s:
        s.run(seconds)
    got: dict[int, list[float]] = {}
    with RingReader.open(ring_name(f"{prefix}0")) as r:
        while batch := r.read():
            for rec in batch:
                if isinstance(rec, SampleRecord) and rec.aux == 0:
                    got.setdefault(rec.metric, []).append(rec.value)
    return got


def nvml_vs_smi(env: dict[str, str]) -> dict[str, Any]:
    """Our NVML series and dcgm-exporter's of the same samples against nvidia-smi's, in each one's
    units (issue 38): a field nvidia-smi cannot report on this GPU is listed, not failed."""
    try:
        import pynvml  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        return {"skipped": "no pynvml (nvidia-ml-py) for this python"}
    try:
        got = _sampled(f"{PREFIX}nvml", 1.6)
    except ImportError as e:  # the sampler's own dependencies (grpcio for the kubelet's pods, ...)
        return {"skipped": f"the NVML sampler needs {e.name}, not installed for this python"}
    out: dict[str, Any] = {}
    ok = True
    for name, (metric, field, factor, kind, tol) in _smi_table().items():
        theirs = smi_value(field)
        values = got.get(metric)
        mine = values[-1] if values else None
        if isinstance(theirs, str):
            out[name] = {"sampler": mine, "nvidia_smi": None, "not_compared": theirs}
            continue
        theirs *= factor
        bound = tol * max(abs(theirs), 1.0) if kind == "rel" else tol
        agree = mine is not None and abs(mine - theirs) <= bound
        ok &= agree
        out[name] = {"sampler": mine, "nvidia_smi": theirs, "agree": agree}
    out["ok"] = ok
    return out


#: bf16 GEMMs on GPU 0 until killed (at most 120 s): the busy GPU the GPM metrics are read under.
_BUSY = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
(a @ a).sum().item()
open(sys.argv[1], "w").close()
end = time.time() + 120
while time.time() < end:
    for _ in range(20):
        b = a @ a
    torch.cuda.synchronize()
"""
#: nvidia-smi dmon's GPM metric ids (``nvidia-smi dmon --help``) for the DCGM fields, as percent.
_DMON_GPM = {"DCGM_FI_PROF_SM_ACTIVE": 2, "DCGM_FI_PROF_SM_OCCUPANCY": 3, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 5,
             "DCGM_FI_PROF_DRAM_ACTIVE": 10}  # fmt: skip


def _dmon_gpm() -> dict[str, Any]:
    """nvidia-smi's own GPM readings (``dmon --gpm-metrics``, 3 one-second rows) as mean ratios by
    DCGM name, with its output; a dmon without GPM says why."""
    ids = ",".join(str(i) for i in _DMON_GPM.values())
    done = subprocess.run(
        ["nvidia-smi", "dmon", "-i", "0", "-c", "3", "-d", "1", "-s", "u", "--gpm-metrics", ids],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    text = done.stdout.strip()
    if done.returncode != 0:
        return {"skipped": f"nvidia-smi dmon --gpm-metrics: {(text or done.stderr)[:200]}"}
    lines = text.splitlines()
    header = next((ln.lstrip("#").split() for ln in lines if ln.startswith("#")), [])
    rows = [ln.split() for ln in lines if ln.strip() and not ln.startswith("#")]
    # The GPM columns are dmon's last ones, in the order asked (after gpu and the -s u columns).
    out: dict[str, Any] = {"output": text[:1500], "header": header}
    try:
        cols = list(zip(*[[float(v) for v in r[-len(_DMON_GPM) :]] for r in rows], strict=True))
        out["ratios"] = {n: sum(c) / len(c) / 100.0 for n, c in zip(_DMON_GPM, cols, strict=True)}
    except (ValueError, ZeroDivisionError) as e:
        out["unparsed"] = str(e)
    return out


def gpm_under_load(env: dict[str, str]) -> dict[str, Any]:
    """The GPM profiling fields (DCGM_FI_PROF_*) while bf16 GEMMs keep GPU 0 busy: on Hopper and
    later each is there, ratios in [0, 1], SM and tensor activity well above idle; beside them
    nvidia-smi's own GPM readings of the same load, compared within 20 points where it gives them."""
    import torch

    cap = torch.cuda.get_device_capability(0)
    if cap < (9, 0):
        return {"skipped": f"compute capability {cap[0]}.{cap[1]}: NVML GPM needs Hopper (9.0) or later"}
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return {"skipped": "no pynvml (nvidia-ml-py) for this python"}
    from kernel_insight.agent.dcgm import DCGM_FIELDS

    started = Path(f"/tmp/{PREFIX}busy")
    busy = subprocess.Popen([sys.executable, "-c", _BUSY, str(started)], env=env)
    try:
        deadline = time.monotonic() + 90
        while not started.exists():
            if busy.poll() is not None or time.monotonic() > deadline:
                return {"ok": False, "error": f"the GEMM load did not start (exit {busy.poll()})"}
            time.sleep(0.2)
        time.sleep(1.0)
        got = _sampled(f"{PREFIX}gpm", 3.1)
        smi = _dmon_gpm()
    finally:
        busy.kill()
        busy.wait()
        started.unlink(missing_ok=True)
    prof = {f.name: got.get(f.id, []) for f in DCGM_FIELDS if "_PROF_" in f.name}
    means = {name: (sum(v) / len(v) if v else None) for name, v in prof.items()}
    ratios = [n for n in means if not n.endswith("_BYTES")]
    checks = {
        "every_field": all(v is not None for v in means.values()),
        "ratios_in_0_1": all(v is None or 0.0 <= v <= 1.0 for v in (means[n] for n in ratios)),
        "sm_active": (means.get("DCGM_FI_PROF_SM_ACTIVE") or 0.0) >= 0.3,
        "tensor_active": (means.get("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE") or 0.0) >= 0.05,
    }
    out: dict[str, Any] = {
        "sampler": means,
        "samples": {n: len(v) for n, v in prof.items()},
        "nvidia_smi": smi,
    }
    for name, theirs in smi.get("ratios", {}).items():
        mine = means.get(name)
        checks[f"smi_{name}"] = mine is not None and abs(mine - theirs) <= 0.2
    out["checks"] = checks
    out["ok"] = all(checks.values())
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
    for key, part in (("nvml", nvml_vs_smi), ("gpm", gpm_under_load), ("gpu_tests", gpu_tests)):
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
