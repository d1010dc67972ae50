"""The NVML stand-in's script and reading the samples the sampler wrote (shared by the NVML sampler tests)."""

from __future__ import annotations

from probeutil import drain

from kernel_insight.agent import ring_name
from kernel_insight.agent.dcgm import DCGM_ID_BASE
from kernel_insight.agent.records import SampleRecord

SCRIPT = """\
count 2
driver 550.54.15
cuda 12040
0.name NVIDIA H100 80GB HBM3
0.uuid GPU-0b1c2d3e-0000-4000-8000-000000000000
0.bus_id 00000000:18:00.0
0.compute_capability 90
0.memory_total 85899345920
0.memory_used 21474836480
0.temperature 61
0.power_mw 412345
0.power_limit_mw 700000
0.energy_mj 123456789
0.util_gpu 87
0.util_memory 42
0.clock_sm_mhz 1980
0.clock_mem_mhz 2619
0.pcie_tx_kbs 1000
0.pcie_rx_kbs 2000
0.ecc_corrected 3
0.ecc_uncorrected 0
0.throttle 36
0.fan_pct NS
0.nvlink_links 2
0.field82.0 70
0.field94.0 5
0.field138.0 100
0.field139.0 200
0.field138.1 300
0.field139.1 400
0.field90.0 25000
0.remapped_corr 2
0.gpm_supported 1
0.gpm2 73.5
0.remapped_unc 1
0.process 4242 1073741824
0.process 4343 2147483648
1.name NVIDIA H100 80GB HBM3
1.memory_total 85899345920
1.memory_used 1
"""


def samples(prefix: str, gpu: int = 0, dcgm: bool = False) -> dict[tuple[int, int], float]:
    """The ring's samples by (metric, aux): ours, or (``dcgm``) dcgm-exporter's."""
    return {
        (r.metric, r.aux): r.value
        for r in drain(ring_name(f"{prefix}{gpu}"))
        if isinstance(r, SampleRecord) and (r.metric >= DCGM_ID_BASE) == dcgm
    }
