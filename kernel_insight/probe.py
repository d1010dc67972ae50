"""CUDA-event kernel timings from inside a workload: ``from kernel_insight.probe import span``.

Example::

    from kernel_insight.probe import span

    with span("flash_attn", stream=stream):
        out = flash_attn(q, k, v)

The implementation lives with the other producers in ``kernel_insight.agent.probe.timing``;
this module is the short import path the workload uses.
"""

from __future__ import annotations

from kernel_insight.agent.probe.timing import (
    CpuBackend,
    CupyBackend,
    Probe,
    TorchBackend,
    configure,
    default_probe,
    instrument_torch,
    span,
)

__all__ = [
    "CpuBackend",
    "CupyBackend",
    "Probe",
    "TorchBackend",
    "configure",
    "default_probe",
    "instrument_torch",
    "span",
]
