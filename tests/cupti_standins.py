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
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))


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


def build_cupti(out: Path) -> CuptiBuild:
    """Build everything into out (agent/cupti/Makefile: the probe and its stand-ins); a machine without
    a C compiler or the CUDA headers skips, saying so."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler (cc) on PATH to build the CUPTI probe and its stand-ins")
    if not (CUDA_HOME / "include" / "cupti.h").is_file():
        pytest.skip(f"no CUDA headers at {CUDA_HOME}/include (cupti.h): the CUPTI probe is not built here")
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["make", "-s", "-C", str(ROOT / "agent" / "cupti"), f"OUT={out}", f"CUDA_HOME={CUDA_HOME}", "all", "standins"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"build failed:\n{done.stdout}{done.stderr}")
    return CuptiBuild(out / "libki_cupti.so.1", out, out / "cupti_workload")
