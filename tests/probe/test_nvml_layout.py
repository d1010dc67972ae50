"""The NVML stand-in's structs have NVIDIA's layouts: tests/probe/c/nvml_layout.c prints every size and
offset the stand-in relies on, once compiled against the real nvml.h (PyPI nvidia-nvml-dev-cu12, a dev
dependency, or a CUDA toolkit's) and once against the stand-in's fake_nvml_types.h; they must agree."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from probeutil import HERE, compile_c


def nvml_include() -> Path | None:
    """The directory of NVIDIA's nvml.h: $KI_NVML_INCLUDE, the nvidia-nvml-dev wheel's, or CUDA's."""
    candidates = [os.environ.get("KI_NVML_INCLUDE", "")]
    try:
        import nvidia.nvml_dev  # type: ignore[import-not-found]  # headers only

        candidates += [str(Path(p) / "include") for p in nvidia.nvml_dev.__path__]
    except ImportError:
        pass
    candidates.append("/usr/local/cuda/include")
    return next((Path(c) for c in candidates if c and (Path(c) / "nvml.h").is_file()), None)


def layout(tmp: Path, *flags: str) -> dict[str, int]:
    exe = compile_c([*flags, str(HERE / "c" / "nvml_layout.c")], tmp / ("real" if flags else "fake"))
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in out.splitlines()}


def test_the_stand_ins_structs_are_laid_out_as_nvml_h_lays_them_out(tmp_path):
    include = nvml_include()
    if include is None:
        pytest.skip("no nvml.h: install the dev extras (nvidia-nvml-dev-cu12) or set KI_NVML_INCLUDE")
    real = layout(tmp_path, "-DKI_REAL_NVML", f"-I{include}")
    fake = layout(tmp_path)
    assert len(real) >= 40
    assert fake == real
