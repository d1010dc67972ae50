"""dcgm-exporter's series from the NVML sampler: DCGM names and units against the stand-in's readings,
and against our own series of the same instant (docs/metrics.md, "dcgm-exporter's series")."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nvmlutil import SCRIPT, samples
from probeutil import ROOT, drain

from kernel_insight.agent import ring_name
from kernel_insight.agent.dcgm import DCGM_FIELDS, DCGM_ID_BASE, dcgm_id
from kernel_insight.agent.metric_ids import METRIC_SPECS, MetricId
from kernel_insight.agent.probe.nvml import NvmlSampler
from kernel_insight.agent.records import SampleRecord

pytestmark = pytest.mark.nvml

#: Readings only DCGM names: encoder and decoder use, reserved memory, a failed row remap, GPM metrics.
EXTRA = """\
0.util_enc 12
0.util_dec 3
0.memory_reserved 536870912
0.remap_failure 1
0.gpm1 55
0.gpm3 40.5
0.gpm5 61.25
0.gpm10 33
0.gpm11 1
0.gpm12 20
0.gpm13 7
0.gpm20 100
0.gpm21 200
0.gpm60 7
0.gpm61 8
"""

MIB = 2**20


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "nvml.script"
    path.write_text(SCRIPT + EXTRA)
    monkeypatch.setenv("KI_FAKE_NVML_SCRIPT", str(path))
    return path


def by_name(got: dict[tuple[int, int], float]) -> dict[str, float]:
    return {METRIC_SPECS[m].name + (f"/{aux}" if aux else ""): v for (m, aux), v in got.items()}


def test_dcgm_series_are_the_stand_ins_readings_in_dcgms_units(fake_nvml, script, label_prefix):
    with NvmlSampler.open([0], library=str(fake_nvml), label_prefix=label_prefix, events=False) as s:
        s.sample_once()
        first = by_name(samples(label_prefix, dcgm=True))
        s.sample_once()  # GPM needs two samples
        second = by_name(samples(label_prefix, dcgm=True))
    expected = {
        "DCGM_FI_DEV_SM_CLOCK": 1980.0,  # MHz as NVML gives them, not hertz
        "DCGM_FI_DEV_MEM_CLOCK": 2619.0,
        "DCGM_FI_DEV_MEMORY_TEMP": 70.0,
        "DCGM_FI_DEV_GPU_TEMP": 61.0,
        "DCGM_FI_DEV_POWER_USAGE": pytest.approx(412.345),  # W from 412345 mW
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 123456789.0,  # mJ, as NVML counts them
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 5.0,
        "DCGM_FI_DEV_GPU_UTIL": 87.0,  # percent, not a ratio
        "DCGM_FI_DEV_MEM_COPY_UTIL": 42.0,
        "DCGM_FI_DEV_ENC_UTIL": 12.0,
        "DCGM_FI_DEV_DEC_UTIL": 3.0,
        "DCGM_FI_DEV_XID_ERRORS": 0.0,  # no Xid yet
        "DCGM_FI_DEV_FB_FREE": 60 * 1024.0,  # MiB, not bytes
        "DCGM_FI_DEV_FB_USED": 20 * 1024.0,
        "DCGM_FI_DEV_FB_RESERVED": 512.0,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 1.0,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 2.0,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": 1.0,
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 100.0 + 200 + 300 + 400,  # KiB, both ways, every link
    }
    assert first == expected
    assert second == {
        **expected,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": pytest.approx(0.55),  # ratios, from GPM's percent
        "DCGM_FI_PROF_SM_ACTIVE": pytest.approx(0.735),
        "DCGM_FI_PROF_SM_OCCUPANCY": pytest.approx(0.405),
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": pytest.approx(0.6125),
        "DCGM_FI_PROF_DRAM_ACTIVE": pytest.approx(0.33),
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE": pytest.approx(0.01),
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE": pytest.approx(0.2),
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE": pytest.approx(0.07),
        "DCGM_FI_PROF_PCIE_TX_BYTES": 100.0 * MIB,  # bytes/s, from GPM's MiB/s
        "DCGM_FI_PROF_PCIE_RX_BYTES": 200.0 * MIB,
        "DCGM_FI_PROF_NVLINK_RX_BYTES": 7.0 * MIB,
        "DCGM_FI_PROF_NVLINK_TX_BYTES": 8.0 * MIB,
    }
    # every field the table names was produced: the table holds nothing the sampler cannot read
    assert set(second) == {f.name for f in DCGM_FIELDS}


def test_dcgm_series_equal_our_own_series_of_the_same_instant(fake_nvml, script, label_prefix):
    with NvmlSampler.open([0], library=str(fake_nvml), label_prefix=label_prefix, events=False) as s:
        for step in range(3):
            time.sleep(0.01)
            script.write_text(SCRIPT + EXTRA + f"0.temperature {60 + step}\n0.util_gpu {57 + step}\n")
            s.sample_once()
    recs = [r for r in drain(ring_name(f"{label_prefix}0")) if isinstance(r, SampleRecord)]
    instants = sorted({r.ts_ns for r in recs})
    assert len(instants) == 3
    checked = 0
    for ts in instants:
        at = {(r.metric, r.aux): r.value for r in recs if r.ts_ns == ts}
        for f in DCGM_FIELDS:
            if f.source is None:
                continue
            ours, theirs = at[(MetricId[f.source], 0)], at[(f.id, 0)]
            assert theirs == pytest.approx(ours * f.factor, abs=1.0 if f.integer else 1e-9), f.name
            checked += 1
        # 0.57 * 100 is 56.99999999999999 in floats: DCGM's integer percent is 57
        assert at[(dcgm_id(203), 0)] == 57 + instants.index(ts)
        assert at[(dcgm_id(150), 0)] == at[(MetricId.TEMPERATURE, 0)] == 60 + instants.index(ts)
    assert checked == 3 * sum(1 for f in DCGM_FIELDS if f.source is not None)


def test_last_xid_is_the_xid_gauge_and_its_err_code(fake_nvml, script, label_prefix):
    with NvmlSampler.open([0], library=str(fake_nvml), label_prefix=label_prefix) as s:
        with script.open("a") as f:
            f.write("event 0 8 79\n")
        deadline = time.monotonic() + 10
        got: dict[tuple[int, int], float] = {}
        while time.monotonic() < deadline and (dcgm_id(230), 79) not in got:
            time.sleep(0.05)
            s.sample_once()
            got = samples(label_prefix, dcgm=True)
    assert got[(dcgm_id(230), 79)] == 79.0  # value and err_code label: Xid 79, fallen off the bus


def test_dcgm_names_off_writes_only_ours(fake_nvml, script, label_prefix):
    with NvmlSampler.open(
        [0], library=str(fake_nvml), label_prefix=label_prefix, events=False, dcgm_names=False
    ) as s:
        s.sample_once()
        s.sample_once()
        recs = [r for r in drain(ring_name(f"{label_prefix}0")) if isinstance(r, SampleRecord)]
    assert recs
    assert all(r.metric < DCGM_ID_BASE for r in recs)
    assert any(r.metric == MetricId.SM_UTIL for r in recs)  # GPM still read for ours


def test_collector_gives_dcgm_series_dcgm_exporters_labels(fake_nvml, script, label_prefix, monkeypatch):
    from kernel_insight.agent import RingReader
    from kernel_insight.collector.derive import Deriver

    monkeypatch.setenv("NODE_NAME", "node-a7")
    with NvmlSampler.open([0], library=str(fake_nvml), label_prefix=label_prefix, events=False) as s:
        s.sample_once()
        with RingReader.open(ring_name(f"{label_prefix}0")) as reader:
            records = reader.read_array()
    derived = Deriver("host-1").derive(records)
    series = {dict(labels)["__name__"]: dict(labels) for labels in derived.samples.series}
    assert series["DCGM_FI_DEV_GPU_TEMP"] == {
        "__name__": "DCGM_FI_DEV_GPU_TEMP",
        "instance": "host-1",
        "gpu": "0",
        "gpu_product": "NVIDIA H100 80GB HBM3",
        "UUID": "GPU-0b1c2d3e-0000-4000-8000-000000000000",
        "pci_bus_id": "00000000:18:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "node-a7",
        "hostname": "node-a7",
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
    }
    assert series["DCGM_FI_DEV_XID_ERRORS"]["err_code"] == "0"
    # our own series keep their labels
    assert "UUID" not in series["gpu_temperature_celsius"]
    assert series["gpu_temperature_celsius"]["gpu"] == "0"


def test_every_dcgm_field_is_documented_as_the_table_says():
    text = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    for f in DCGM_FIELDS:
        row = f"| {f.id} | {f.field_id} | `{f.name}` | {f.type} | {f.unit} |"
        assert row in text, row


@pytest.mark.parametrize(("flag", "dcgm"), [("--dcgm-names=false", False), ("--dcgm-names=true", True)])
def test_cli_switches_the_dcgm_series(fake_nvml, script, label_prefix, flag, dcgm):
    proc = subprocess.run(
        [sys.executable, "-m", "kernel_insight.cli", "probe", "nvml", "--library", str(fake_nvml),
         "--seconds", "1.2", "--label-prefix", label_prefix, flag],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "KI_FAKE_NVML_SCRIPT": str(script)}, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    recs = [r for r in drain(ring_name(f"{label_prefix}0")) if isinstance(r, SampleRecord)]
    assert any(r.metric == MetricId.TEMPERATURE for r in recs)
    assert any(r.metric >= DCGM_ID_BASE for r in recs) == dcgm


def test_cli_refuses_a_dcgm_names_value_that_is_not_a_boolean(label_prefix):
    proc = subprocess.run(
        [sys.executable, "-m", "kernel_insight.cli", "probe", "nvml", "--dcgm-names=maybe"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "expected true or false, got 'maybe'" in proc.stderr
