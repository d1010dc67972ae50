"""The CUPTI activity probe: every kernel's device time, with no change to the workload.

``libki_cupti.so.1`` (agent/cupti/, built by the package build) is a CUPTI injection library: the
CUDA driver loads it at ``cuInit`` when ``CUDA_INJECTION64_PATH`` names it, and it writes KERNEL
(with their LAUNCH_SPAN), MEMOP and SYNC records into each GPU's ring (docs/probes.md). This
module finds the library and builds the environment a workload needs; ``ki probe cupti -- CMD``
runs a command with it::

    env = cupti_environment(os.environ, label_prefix="")
    subprocess.run(["python", "train.py"], env=env)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "CUPTI_SEARCH",
    "INJECTION_ENV",
    "LIBRARY_ENV",
    "CuptiUnavailable",
    "cupti_environment",
    "find_cupti",
    "injection_library",
]

#: Variable naming an injection library to use instead of the packaged one.
INJECTION_ENV = "KI_CUPTI_INJECTION"
#: Variable naming the CUPTI library the probe loads (default: as the loader finds libcupti.so.13).
LIBRARY_ENV = "KI_CUPTI_LIBRARY"
#: Where a CUPTI is looked for to serve NVTX ranges when KI_CUPTI_LIBRARY names none.
CUPTI_SEARCH = (
    "/usr/local/cuda/lib64/libcupti.so.13",
    "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
)


class CuptiUnavailable(Exception):
    """The injection library is not built (no CUDA headers at build time) or not where it was named."""


def injection_library() -> Path:
    """The packaged libki_cupti.so.1, or $KI_CUPTI_INJECTION."""
    override = os.environ.get(INJECTION_ENV)
    path = Path(override) if override else Path(__file__).resolve().parents[1] / "bin" / "libki_cupti.so.1"
    if not path.is_file():
        raise CuptiUnavailable(
            f"CUPTI injection library not found at {path}: the package build makes it when the CUDA "
            "headers (cupti.h) are installed (CUDA_HOME, default /usr/local/cuda); rebuild with make build"
        )
    return path


def find_cupti(env: Mapping[str, str]) -> str | None:
    """The CUPTI library for NVTX_INJECTION64_PATH: $KI_CUPTI_LIBRARY, else a toolkit's, else None."""
    named = env.get(LIBRARY_ENV)
    if named:
        return named
    return next((p for p in CUPTI_SEARCH if Path(p).is_file()), None)


def cupti_environment(
    base: Mapping[str, str], *, label_prefix: str = "", library: Path | None = None
) -> dict[str, str]:
    """``base`` with what the driver and the probe need: CUDA_INJECTION64_PATH, the ring prefix and,
    unless already set, NVTX_INJECTION64_PATH (NVTX ranges reach CUPTI, hence the probe's labels,
    only through it)."""
    env = dict(base)
    env["CUDA_INJECTION64_PATH"] = str(library or injection_library())
    env["KI_PROBE_LABEL_PREFIX"] = label_prefix
    if "NVTX_INJECTION64_PATH" not in env:
        cupti = find_cupti(env)
        if cupti:
            env["NVTX_INJECTION64_PATH"] = cupti
    return env
