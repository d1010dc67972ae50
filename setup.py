"""Native parts of the package build: the ring extension (and, later, the agent binary)."""

from setuptools import Extension, setup

CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-Wno-missing-field-initializers"]

setup(
    ext_modules=[
        Extension(
            "kernel_insight.agent._ring",
            sources=["agent/python/ringmodule.c"],
            include_dirs=["agent/include"],
            depends=["agent/include/ki_ring.h"],
            extra_compile_args=CFLAGS,
        ),
    ],
)
