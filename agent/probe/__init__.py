"""Probes that fill a GPU's ring: eBPF tracer, NVML sampler, CUDA-event spans and a simulator (docs/probes.md).

Example::

    from kernel_insight.agent.probe import SimConfig, Simulator
    from kernel_insight.agent import Ring, ring_name

    ring = Ring.attach(ring_name(0), create=True)
    Simulator(SimConfig(gpus=1), [ring.write_raw]).run(seconds=5)
"""

from __future__ import annotations

from kernel_insight.agent.probe._writer import FlaggedWriter
from kernel_insight.agent.probe.simulate import SimConfig, Simulator

__all__ = ["FlaggedWriter", "SimConfig", "Simulator"]
