"""Probes that fill a GPU's ring: eBPF tracer, NVML sampler, CUDA-event spans and a simulator (docs/probes.md).

Example::

    from kernel_insight.agent.probe import span, instrument_torch

    with span("flash_attn"):
        out = attention(q, k, v)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_insight._lazy import lazy_exports

if TYPE_CHECKING:
    from kernel_insight.agent.probe.ebpf import (
        EbpfUnavailable,
        LaunchStats,
        Tracer,
        TracerConfig,
        find_library,
    )
    from kernel_insight.agent.probe.nvml import NvmlSampler, NvmlUnavailable
    from kernel_insight.agent.probe.simulate import SimConfig, Simulator
    from kernel_insight.agent.probe.timing import (
        Backend,
        CpuBackend,
        CupyBackend,
        Probe,
        TorchBackend,
        TorchHooks,
        configure,
        default_probe,
        instrument_torch,
        span,
    )

_EXPORTS: dict[str, tuple[str, ...]] = {
    "kernel_insight.agent.probe.ebpf": (
        "EbpfUnavailable",
        "LaunchStats",
        "Tracer",
        "TracerConfig",
        "find_library",
    ),
    "kernel_insight.agent.probe.nvml": (
        "NvmlSampler",
        "NvmlUnavailable",
    ),
    "kernel_insight.agent.probe.simulate": (
        "SimConfig",
        "Simulator",
    ),
    "kernel_insight.agent.probe.timing": (
        "Backend",
        "CpuBackend",
        "CupyBackend",
        "Probe",
        "TorchBackend",
        "TorchHooks",
        "configure",
        "default_probe",
        "instrument_torch",
        "span",
    ),
}

__all__ = [
    "Backend",
    "CpuBackend",
    "CupyBackend",
    "EbpfUnavailable",
    "LaunchStats",
    "NvmlSampler",
    "NvmlUnavailable",
    "Probe",
    "SimConfig",
    "Simulator",
    "TorchBackend",
    "TorchHooks",
    "Tracer",
    "TracerConfig",
    "configure",
    "default_probe",
    "find_library",
    "instrument_torch",
    "span",
]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
