"""The CUPTI probe with its stand-ins, built from the sources for the probe, agent and bench tests.

The probe (agent/cupti/, its own Makefile) is built as the package builds it; the stand-in
libcupti.so.13 and libcuda.so.1 (tests/probe/c/) use the CUDA 13 headers' layouts; the workload
links the stand-in driver, which loads the probe through CUDA_INJECTION64_PATH at cuInit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
C = ROOT / "tests" / "probe" / "c"
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-isystem", str(CUDA_HOME / "include")]


@dataclass(frozen=True)
class CuptiBuild:
    """Where the built pieces are: the probe, the stand-ins' directory and the workload."""

    probe: Path
    libdir: Path
    workload: Path

    def env(self, label_prefix: str, **extra: str) -> dict[str, str]:
        """A workload environment: the probe injected, the stand-ins found first, rings under the prefix."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KI_CUPTI", "KIFAKE", "CUDA_INJ"))}
        env.update(
            CUDA_INJECTION64_PATH=str(self.probe),
            LD_LIBRARY_PATH=str(self.libdir),
            KI_CUPTI_LIBRARY=str(self.libdir / "libcupti.so.13"),
            KI_PROBE_LABEL_PREFIX=label_prefix,
        )
        env.update(extra)
        return env


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise AssertionError(f"build failed: {' '.join(cmd)}\n{done.stdout}{done.stderr}")


def build_cupti(out: Path) -> CuptiBuild:
    """Build everything into out; a machine without a C compiler or the CUDA headers skips, saying so."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) on PATH to build the CUPTI probe and its stand-ins")
    if not (CUDA_HOME / "include" / "cupti.h").is_file():
        pytest.skip(f"no CUDA headers at {CUDA_HOME}/include (cupti.h): the CUPTI probe is not built here")
    out.mkdir(parents=True, exist_ok=True)
    _run(["make", "-s", "-C", str(ROOT / "agent" / "cupti"), f"OUT={out}"])
    lib = [cc, *CFLAGS, "-shared", "-fPIC", "-fvisibility=hidden"]
    _run(
        [
            *lib,
            "-Wl,-soname,libcupti.so.13",
            str(C / "fake_cupti.c"),
            "-o",
            str(out / "libcupti.so.13"),
            "-lpthread",
        ]
    )
    _run(
        [
            *lib,
            "-Wl,-soname,libcuda.so.1",
            str(C / "fake_cuda_inject.c"),
            "-o",
            str(out / "libcuda.so.1"),
            "-ldl",
        ]
    )
    _run(
        [cc, *CFLAGS, str(C / "cupti_workload.c"), "-o", str(out / "cupti_workload"), f"-L{out}",
         "-l:libcuda.so.1", "-ldl", "-lpthread", f"-Wl,-rpath,{out}"]
    )  # fmt: skip
    return CuptiBuild(out / "libki_cupti.so", out, out / "cupti_workload")
