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
    # The package's exports: each name is imported from its module on first use
    # (kernel_insight/_lazy.py reads this block); ``X as X`` marks it re-exported.
    from kernel_insight.agent.probe.ebpf import EbpfUnavailable as EbpfUnavailable
    from kernel_insight.agent.probe.ebpf import LaunchStats as LaunchStats
    from kernel_insight.agent.probe.ebpf import Tracer as Tracer
    from kernel_insight.agent.probe.ebpf import TracerConfig as TracerConfig
    from kernel_insight.agent.probe.ebpf import find_library as find_library
    from kernel_insight.agent.probe.nvml import NvmlSampler as NvmlSampler
    from kernel_insight.agent.probe.nvml import NvmlUnavailable as NvmlUnavailable
    from kernel_insight.agent.probe.simulate import SimConfig as SimConfig
    from kernel_insight.agent.probe.simulate import Simulator as Simulator
    from kernel_insight.agent.probe.timing import Backend as Backend
    from kernel_insight.agent.probe.timing import CpuBackend as CpuBackend
    from kernel_insight.agent.probe.timing import CupyBackend as CupyBackend
    from kernel_insight.agent.probe.timing import Probe as Probe
    from kernel_insight.agent.probe.timing import TorchBackend as TorchBackend
    from kernel_insight.agent.probe.timing import TorchHooks as TorchHooks
    from kernel_insight.agent.probe.timing import configure as configure
    from kernel_insight.agent.probe.timing import default_probe as default_probe
    from kernel_insight.agent.probe.timing import instrument_torch as instrument_torch
    from kernel_insight.agent.probe.timing import span as span


__getattr__, __dir__ = lazy_exports(globals())
