"""make bench-probe, the NVML sampler: its CPU at 1 Hz over 8 GPUs, and what the DCGM set costs the agent.

Real processes: ``ki probe nvml`` (DCGM names on, the default) samples 8 GPUs of the NVML
stand-in (tests/probe/c/fake_nvml.c, every reading scripted, GPM on) once a second into their
rings; GPU 0's ring is drained by a real ki-agent (histograms on, its defaults) into a real
``ki collector`` while the C kernel producer writes 100k kernels/s over 100 realistic names into
the same ring, as bench-histogram's wire run does.

- ``nvml_cpu_pct``: the sampler's CPU time (utime + stime from /proc) over the run after its
  first 10 s (start-up imports left out), per wall second, in % of one core (target < 0.5).
- ``nvml_samples_per_gpu_s``: GPU_SAMPLE records it wrote per GPU-second (ours and DCGM's).
- ``agent_hwm_kb``: the agent's VmHWM at the end (target <= 5,120 kB).
- ``wire_bytes_per_gpu_s``: frame bytes (compressed bodies + 80 bytes a batch, from the agent's
  counters as the collector stored them) per second of the run (target <= 4,096).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.histogram.pipeline import KERNEL_NAMES, _hwm_kb, _Run
from bench.histogram.producer import build_producer

REPO = Path(__file__).resolve().parents[2]
FAKE_NVML = REPO / "tests" / "probe" / "c" / "fake_nvml.c"
GPUS = 8
_CLK = os.sysconf("SC_CLK_TCK")

__all__ = ["nvml_figures"]


def _script(gpus: int) -> str:
    """Every reading the sampler asks for (ours and DCGM's), on every GPU."""
    lines = ["driver 550.54.15", "cuda 12040", f"count {gpus}"]
    for g in range(gpus):
        lines += [
            f"{g}.{k} {v}"
            for k, v in (
                ("name", "NVIDIA H100 80GB HBM3"),
                ("uuid", f"GPU-0b1c2d3e-0000-4000-8000-{g:012d}"),
                ("bus_id", f"00000000:{0x18 + g:02X}:00.0"),
                ("compute_capability", 90),
                ("memory_total", 85899345920),
                ("memory_used", 21474836480),
                ("memory_reserved", 484442112),
                ("temperature", 61),
                ("power_mw", 412345),
                ("power_limit_mw", 700000),
                ("energy_mj", 123456789),
                ("util_gpu", 87),
                ("util_memory", 42),
                ("util_enc", 0),
                ("util_dec", 0),
                ("clock_sm_mhz", 1980),
                ("clock_mem_mhz", 2619),
                ("pcie_tx_kbs", 1000),
                ("pcie_rx_kbs", 2000),
                ("ecc_corrected", 0),
                ("ecc_uncorrected", 0),
                ("throttle", 0),
                ("fan_pct", "NS"),
                ("remapped_corr", 0),
                ("remapped_unc", 0),
                ("nvlink_links", 18),
                ("field82.0", 70),
                ("field94.0", 0),
                ("field90.0", 25000),
                ("gpm_supported", 1),
                ("process", "4242 21474836480"),
            )
        ]
        lines += [f"{g}.field{f}.{link} {1000 * link}" for link in range(18) for f in (138, 139)]
        lines += [f"{g}.gpm{m} {10 + m}" for m in (1, 2, 3, 5, 10, 11, 12, 13, 20, 21, 60, 61)]
    return "\n".join(lines) + "\n"


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK  # utime, stime


def nvml_figures(seconds: int = 300, dcgm_names: bool = True) -> dict[str, float]:
    """The figures above over a run of ``seconds`` (at least 30); ``dcgm_names`` False: ours only."""
    from kernel_insight.agent.ring import Ring, ring_name

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler: run scripts/bootstrap.sh (build-essential)")
    seconds = max(30, seconds)
    prefix = f"bench-nvml-{os.getpid()}-"
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        lib = root / "libnvidia-ml.so.1"
        subprocess.run(
            [cc, "-std=c11", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-Wl,-soname,libnvidia-ml.so.1",
             str(FAKE_NVML), "-o", str(lib)],
            check=True,
        )  # fmt: skip
        script = root / "nvml.script"
        script.write_text(_script(GPUS))
        producer = build_producer(root)
        (root / "run").mkdir()
        run = _Run(root / "run", producer, "nvml", ring_name=ring_name(f"{prefix}0"))
        sampler = subprocess.Popen(
            [sys.executable, "-m", "kernel_insight.cli", "probe", "nvml", "--library", str(lib),
             "--label-prefix", prefix, "--seconds", str(seconds + 5), f"--dcgm-names={str(dcgm_names).lower()}"],
            env={**os.environ, "KI_FAKE_NVML_SCRIPT": str(script)},
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        cpu: list[tuple[float, float]] = []

        def watch() -> None:  # the sampler's CPU after its first 10 s, and at the end of the run
            time.sleep(10)
            cpu.append((time.monotonic(), _cpu_s(sampler.pid)))
            time.sleep(seconds - 12)
            cpu.append((time.monotonic(), _cpu_s(sampler.pid)))

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            took = run.produce(100_000 * seconds, 100, 100_000, KERNEL_NAMES)
            watcher.join()
            hwm = _hwm_kb(run.agent.pid)
            sampler.wait(timeout=120)
            written = 0
            with Ring.attach(ring_name(f"{prefix}1")) as other:  # an undrained GPU: what the sampler wrote
                st = other.stats()
                written = int(st["head"]) + int(st["dropped"])
            c = run.finish()
        finally:
            if sampler.poll() is None:
                sampler.kill()
                sampler.wait()
            for g in range(GPUS):
                with contextlib.suppress(OSError):
                    Ring.unlink(ring_name(f"{prefix}{g}"))
    (t0, c0), (t1, c1) = cpu
    batches = c.get("ki_agent_batches_sealed_total", 0.0)
    frames = c.get("ki_agent_bytes_compressed_total", 0.0) + 80 * batches
    return {
        "nvml_cpu_pct": 100 * (c1 - c0) / (t1 - t0),
        "nvml_records_per_gpu_s": written / (seconds + 5),
        "agent_hwm_kb": float(hwm),
        "wire_bytes_per_gpu_s": frames / took,
        "nvml_seconds": float(seconds),
    }
