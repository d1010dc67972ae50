"""Build the C kernel producer (kernel_producer.c) that make bench-histogram and the agent tests run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
INCLUDE = HERE.parents[1] / "agent" / "include"
SOURCE = HERE / "kernel_producer.c"

__all__ = ["build_producer"]


def build_producer(out_dir: Path) -> Path:
    """Compile kernel_producer into ``out_dir`` (a C compiler is part of the bootstrap)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler: run scripts/bootstrap.sh (build-essential)")
    out = out_dir / "kernel_producer"
    flags = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE}"]
    subprocess.run([cc, *flags, str(SOURCE), "-o", str(out), "-lrt", "-lm"], check=True)
    return out
