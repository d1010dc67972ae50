"""Native parts of the package build: the C extensions (ring, decoding, kql windows), the ki-agent binary
and, where the CUDA headers are installed, the CUPTI probe libki_cupti.so.1."""

import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-Wno-missing-field-initializers"]

HERE = Path(__file__).resolve().parent


class build_ext_and_agent(build_ext):
    """Also build the native agent (agent/src/Makefile) into kernel_insight/agent/bin/ki-agent, and
    the CUPTI probe (agent/cupti/Makefile) into .../bin/libki_cupti.so.1 when cupti.h is found
    (CUDA_HOME, default /usr/local/cuda; without it the probe is left out and the build says so).

    A wheel gets it from build_lib; an editable install (or --inplace) also gets
    it in the source tree, agent/bin/, which kernel_insight.agent's launcher finds
    by resolving its own (linked) file.
    """

    def run(self) -> None:
        super().run()
        targets = [Path(self.build_lib) / "kernel_insight" / "agent" / "bin"]
        if self.inplace or getattr(self, "editable_mode", False):
            targets.append(HERE / "agent" / "bin")
        for out in targets:
            out.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                ["make", "-s", "-C", str(HERE / "agent" / "src"), f"OUT={out.resolve()}"], check=True
            )
            cupti = ["make", "-s", "-C", str(HERE / "agent" / "cupti"), f"OUT={out.resolve()}"]
            if subprocess.run([*cupti, "check-headers"], capture_output=True, check=False).returncode == 0:
                subprocess.run(cupti, check=True)
            else:
                print("CUPTI headers (cupti.h) not found: libki_cupti.so.1, the CUPTI probe, is not built")


setup(
    cmdclass={"build_ext": build_ext_and_agent},
    ext_modules=[
        Extension(
            "kernel_insight.agent._ring",
            sources=["agent/python/ringmodule.c"],
            include_dirs=["agent/include"],
            depends=["agent/include/ki_ring.h"],
            extra_compile_args=CFLAGS,
        ),
        Extension(
            "kernel_insight.collector._decode",
            sources=[
                "collector/native/decodemodule.c",
                "collector/native/series_labels.c",
                "collector/native/ki_blake2b.c",
            ],
            depends=["collector/native/series_labels.h", "collector/native/ki_blake2b.h"],
            extra_compile_args=CFLAGS,
        ),
        Extension(
            "kernel_insight.kql._windows",
            sources=["kql/native/windowsmodule.c"],
            # No fused multiply-adds: the loops must round as numpy's separate operations do.
            extra_compile_args=[*CFLAGS, "-ffp-contract=off"],
        ),
        Extension(
            "kernel_insight.collector._valuecodec",
            sources=["collector/native/valuecodecmodule.c"],
            # No fused multiply-adds: the loop must round as the numpy reference does.
            extra_compile_args=[*CFLAGS, "-ffp-contract=off"],
        ),
    ],
)
