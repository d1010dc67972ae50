"""make bench-cupti: the CUPTI probe's cost per activity record in its buffer-completed path, and
its resident memory beside a workload, with the stand-in CUPTI (docs/probes.md).

- ``bench_cupti`` (bench/cupti/bench_cupti.c, the probe compiled in): CUpti_ActivityKernel10
  records in 256 KiB buffers through ``ki_cupti_buffer_completed``, as CUPTI hands them, each
  written as a LAUNCH_SPAN and a KERNEL record into a default-sized ring that the program drains
  between buffers (as the agent would); the buffer's launch callbacks run just before, timed apart.
  Wall ns per record (median of ROUNDS) moves with the machine's load; instructions per record
  under callgrind (``--toggle-collect=ki_cupti_buffer_completed``; the records of a long run
  against a short one's, so once-per-process costs drop out) do not.
- Memory: the stand-in workload's resident memory with and without the probe injected: the probe's
  own (RssAnon + RssFile: its buffers and tables, its code, libstdc++ for demangling when the
  process had none, the CUPTI library) apart from the ring it maps (RssShmem: the agent's shared
  memory, the same pages the agent has mapped).

Targets (issue 37): <= 50 ns per record, <= 4 MB resident. Ends with one ``BENCH cupti ...`` line.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kernel_insight.agent import Ring, RingError, ring_name

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "bench-cupti-"
RECORDS = 200_000
ROUNDS = 7
CALLGRIND_RECORDS = 100_000
CALLGRIND_WARM = 20_000
RSS_STEPS = 20_000
KERNELS = (
    "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    "triton_poi_fused_add_mul_0",
)


def _build(out: Path) -> None:
    subprocess.run(
        ["make", "-s", "-C", str(ROOT / "agent" / "cupti"), f"OUT={out}", "all", "standins", "bench"],
        check=True,
    )


def _env(out: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KI_CUPTI", "CUDA_INJ"))}
    env.update(KI_CUPTI_LIBRARY=str(out / "libcupti.so.13"), KI_PROBE_LABEL_PREFIX=PREFIX, KI_CUPTI_QUIET="1")
    env.update(extra)
    return env


def _json(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    out: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def _callgrind_total(out: Path, ring: str, records: int) -> int | None:
    cg = out / f"callgrind.{records}.out"
    subprocess.run(
        ["valgrind", "--tool=callgrind", "--toggle-collect=ki_cupti_buffer_completed", f"--callgrind-out-file={cg}",
         str(out / "bench_cupti"), ring, str(records), "1"],
        env=_env(out), capture_output=True, text=True, check=True,
    )  # fmt: skip
    m = re.search(r"^totals:\s*(\d+)", cg.read_text(), re.MULTILINE)
    return int(m.group(1)) if m else None


def _instructions(out: Path, ring: str) -> float | None:
    """Instructions per record in ki_cupti_buffer_completed once the probe is warm, or None without
    valgrind: the difference between a run of CALLGRIND_RECORDS and one of CALLGRIND_WARM, per
    record between them, so what a process pays once (the first sight of each name, demangling
    and the symbol look-ups of its first calls) is not spread over the records of a short run."""
    if shutil.which("valgrind") is None:
        print("bench-cupti: valgrind not installed (scripts/bootstrap.sh installs it): no instruction count")
        return None
    short, full = _callgrind_total(out, ring, CALLGRIND_WARM), _callgrind_total(out, ring, CALLGRIND_RECORDS)
    if short is None or full is None:
        return None
    return (full - short) / (CALLGRIND_RECORDS - CALLGRIND_WARM)


def _rss(out: Path) -> tuple[dict[str, float], dict[str, float]]:
    """The stand-in workload's /proc/self/status figures (kB) without and with the probe."""
    args = [str(out / "cupti_workload"), "--rss", "--nvtx", "--steps", str(RSS_STEPS)]
    for k in KERNELS:
        args += ["--kernel", k]
    base = _env(out, LD_LIBRARY_PATH=str(out))
    without = _json(args, base)
    return without, _json(args, {**base, "CUDA_INJECTION64_PATH": str(out / "libki_cupti.so.1")})


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-cupti-") as tmp:
        out = Path(tmp)
        _build(out)
        ring = ring_name(f"{PREFIX}0")
        with contextlib.suppress(RingError):
            Ring.unlink(ring)
        Ring.create(ring).close()
        try:
            r = _json([str(out / "bench_cupti"), ring, str(RECORDS), str(ROUNDS)], _env(out))
            ir = _instructions(out, ring)
            without, with_probe = _rss(out)
        finally:
            with contextlib.suppress(RingError):
                Ring.unlink(ring)
    if r["refused"]:
        print(f"bench-cupti: the ring refused {r['refused']} records", file=sys.stderr)
        return 1
    own = ("rss_anon_kb", "rss_file_kb")
    probe_kb = int(sum(with_probe[k] - without[k] for k in own))
    ring_kb = int(with_probe["rss_shmem_kb"] - without["rss_shmem_kb"])
    print(
        f"kernel records {RECORDS} in {r['buffers']} buffers of {r['buffer_bytes'] // 1024} KiB, {ROUNDS} rounds: "
        f"{r['ns_per_record_median']:.1f} ns/record median ({r['ns_per_record_min']:.1f} best), each a KERNEL and "
        f"a LAUNCH_SPAN in the ring; launch callbacks {r['callback_ns_per_launch']:.1f} ns per launch"
    )
    if ir is not None:
        print(f"callgrind: {ir:.0f} instructions per record in ki_cupti_buffer_completed")
    print(
        f"workload resident {without['vmrss_kb']:.0f} kB without the probe, {with_probe['vmrss_kb']:.0f} kB with it: "
        f"{probe_kb} kB the probe's own (anon + file), {ring_kb} kB the ring's shared pages it maps"
    )
    ir_text = f" ir_per_record={ir:.0f}" if ir is not None else ""
    print(
        f"BENCH cupti ns_per_record={r['ns_per_record_median']:.1f} ns_per_record_best={r['ns_per_record_min']:.1f}"
        f"{ir_text} callback_ns={r['callback_ns_per_launch']:.1f} probe_rss_kb={probe_kb} ring_shmem_kb={ring_kb} "
        f"target_ns=50 target_rss_kb=4096"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
