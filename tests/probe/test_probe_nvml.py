"""The NVML sampler against a stand-in libnvidia-ml.so.1, through the real pynvml code path."""

from __future__ import annotations

import ctypes.util
import importlib.metadata
import os
import subprocess
import sys
import time

import pytest
from nvmlutil import SCRIPT, samples
from probeutil import ROOT, drain, names_of

from kernel_insight.agent import ring_name
from kernel_insight.agent.metric_ids import MetricId
from kernel_insight.agent.probe.nvml import NvmlSampler, NvmlUnavailable
from kernel_insight.agent.records import (
    ErrorKind,
    ErrorRecord,
    FingerprintField,
    FingerprintRecord,
    SampleRecord,
)

pytestmark = pytest.mark.nvml


def test_pynvml_is_nvidias_binding():
    assert "nvidia-ml-py" in importlib.metadata.packages_distributions()["pynvml"]


def test_samples_are_scripted_values_in_metric_units(fake_nvml, script, label_prefix):
    with NvmlSampler.open([0], library=str(fake_nvml), label_prefix=label_prefix, events=False) as s:
        s.sample_once()
        got = samples(label_prefix)
    assert got == {
        (MetricId.MEMORY_USED, 0): 20 * 2**30,
        (MetricId.MEMORY_FREE, 0): 60 * 2**30,
        (MetricId.MEMORY_TOTAL, 0): 80 * 2**30,
        (MetricId.TEMPERATURE, 0): 61.0,
        (MetricId.POWER, 0): pytest.approx(412.345),
        (MetricId.POWER_LIMIT, 0): 700.0,
        (MetricId.ENERGY, 0): pytest.approx(123456.789),
        (MetricId.THROTTLE_REASONS, 0): 36.0,
        (MetricId.GPU_UTIL, 0): 0.87,
        (MetricId.MEMORY_UTIL, 0): 0.42,
        (MetricId.SM_CLOCK, 0): 1980e6,
        (MetricId.MEMORY_CLOCK, 0): 2619e6,
        (MetricId.PCIE_TX, 0): 1000 * 1024.0,
        (MetricId.PCIE_RX, 0): 2000 * 1024.0,
        (MetricId.ECC_CORRECTED, 0): 3.0,
        (MetricId.ECC_UNCORRECTED, 0): 0.0,
        (MetricId.RETIRED_PAGES, 0): 3.0,
        (MetricId.PROCESS_MEMORY, 4242): 2.0**30,
        (MetricId.PROCESS_MEMORY, 4343): 2.0**31,
        (MetricId.MEMORY_TEMPERATURE, 0): 70.0,
        (MetricId.PCIE_REPLAYS, 0): 5.0,
        (MetricId.NVLINK_TX, 0): 100 * 1024.0,
        (MetricId.NVLINK_RX, 0): 200 * 1024.0,
        (MetricId.NVLINK_TX, 1): 300 * 1024.0,
        (MetricId.NVLINK_RX, 1): 400 * 1024.0,
    }  # FAN_SPEED is NS in the script, so absent


def test_sm_utilisation_comes_from_gpm_between_two_samples(fake_nvml, script, label_prefix):
    with NvmlSampler.open([0, 1], library=str(fake_nvml), label_prefix=label_prefix, events=False) as s:
        s.sample_once()
        assert (MetricId.SM_UTIL, 0) not in samples(label_prefix)  # GPM needs two samples
        s.sample_once()
        assert samples(label_prefix)[(MetricId.SM_UTIL, 0)] == pytest.approx(0.735)
        s.sample_once()
        assert (MetricId.SM_UTIL, 0) not in samples(label_prefix, 1)  # GPU 1 has no GPM


def test_fingerprint_at_start_and_every_period(fake_nvml, script, label_prefix, monkeypatch):
    monkeypatch.setenv("NODE_NAME", "node-a7")  # a DaemonSet's downward API; else the host name
    now = [10**18]
    with NvmlSampler.open(
        [0],
        library=str(fake_nvml),
        label_prefix=label_prefix,
        events=False,
        fingerprint_every_s=60,
        clock=lambda: now[0],
    ) as s:
        for step in range(4):  # t = 0, 30, 60, 90 s
            now[0] = 10**18 + step * 30 * 10**9
            s.sample_once()
        recs = drain(ring_name(f"{label_prefix}0"))
    fps = [r for r in recs if isinstance(r, FingerprintRecord)]
    assert sorted({(r.ts_ns - 10**18) // 10**9 for r in fps}) == [0, 60]
    table = names_of(recs)
    first = {
        r.field: (table.get(r.producer, r.value) if r.is_string else r.value)
        for r in fps
        if r.ts_ns == 10**18
    }
    assert first == {
        FingerprintField.NAME: "NVIDIA H100 80GB HBM3",
        FingerprintField.UUID: "GPU-0b1c2d3e-0000-4000-8000-000000000000",
        FingerprintField.DRIVER_VERSION: "550.54.15",
        FingerprintField.PCI_BUS_ID: "00000000:18:00.0",
        FingerprintField.HOSTNAME: "node-a7",
        FingerprintField.CUDA_VERSION: 12040,
        FingerprintField.MEMORY_TOTAL: 80 * 2**30,
        FingerprintField.COMPUTE_CAPABILITY: 90,
        FingerprintField.NVLINK_LINKS: 2,
        FingerprintField.NVLINK_BANDWIDTH: 2 * 25_000 * 10**6,
    }


def test_unsupported_metric_is_not_asked_again(fake_nvml, script, label_prefix):
    script.write_text(SCRIPT.replace("0.power_mw 412345", "0.power_mw NS"))
    with NvmlSampler.open([0], library=str(fake_nvml), label_prefix=label_prefix, events=False) as s:
        s.sample_once()
        assert (MetricId.POWER, 0) not in samples(label_prefix)
        time.sleep(0.01)
        script.write_text(SCRIPT + "0.power_mw 500000\n")  # would now answer, but is not asked
        s.sample_once()
        got = samples(label_prefix)
    assert (MetricId.POWER, 0) not in got
    assert got[(MetricId.TEMPERATURE, 0)] == 61.0


def test_values_change_between_samples(fake_nvml, script, label_prefix):
    with NvmlSampler.open([0], library=str(fake_nvml), label_prefix=label_prefix, events=False) as s:
        s.sample_once()
        assert samples(label_prefix)[(MetricId.TEMPERATURE, 0)] == 61.0
        time.sleep(0.01)
        script.write_text(SCRIPT + "0.temperature 83\n")
        s.sample_once()
        assert samples(label_prefix)[(MetricId.TEMPERATURE, 0)] == 83.0


def test_lost_gpu_reports_one_error_and_is_no_longer_sampled(fake_nvml, script, label_prefix):
    script.write_text(SCRIPT + "0.temperature LOST\n")
    with NvmlSampler.open([0], library=str(fake_nvml), label_prefix=label_prefix, events=False) as s:
        s.sample_once()
        s.sample_once()
        recs = drain(ring_name(f"{label_prefix}0"))
    errors = [r for r in recs if isinstance(r, ErrorRecord)]
    assert len(errors) == 1
    assert errors[0].kind == ErrorKind.OTHER
    assert "is lost" in (names_of(recs).get(errors[0].producer, errors[0].detail_id) or "")
    # the first sample's memory readings (taken before the loss was seen) and nothing after
    assert sum(1 for r in recs if isinstance(r, SampleRecord) and r.metric == MetricId.MEMORY_USED) == 1


def test_xid_event_becomes_an_error_record(fake_nvml, script, label_prefix):
    with NvmlSampler.open([0, 1], library=str(fake_nvml), label_prefix=label_prefix) as s:
        assert s.indices == [0, 1]
        with script.open("a") as f:
            f.write("event 1 8 79\nevent 0 2 1\n")
        deadline = time.monotonic() + 5
        got: list[ErrorRecord] = []
        recs1 = []
        while time.monotonic() < deadline and len(got) < 2:
            time.sleep(0.05)
            recs1 += drain(ring_name(f"{label_prefix}1"))
            got = [r for r in recs1 if isinstance(r, ErrorRecord)]
            got += [r for r in drain(ring_name(f"{label_prefix}0")) if isinstance(r, ErrorRecord)]
    xid = next(r for r in got if r.kind == ErrorKind.XID)
    assert (xid.device, xid.code) == (1, 79)
    assert "Xid 79 on GPU 1" in (names_of(recs1).get(xid.producer, xid.detail_id) or "")
    ecc = next(r for r in got if r.kind == ErrorKind.ECC)
    assert ecc.device == 0


def test_gpu_that_does_not_exist_is_refused(fake_nvml, script, label_prefix):
    with pytest.raises(NvmlUnavailable, match=r"no GPU 5: NVML sees 2 GPU\(s\)"):
        NvmlSampler.open([5], library=str(fake_nvml), label_prefix=label_prefix)


def test_driver_not_loaded_is_said_plainly(fake_nvml, script, label_prefix):
    script.write_text("init DRIVER_NOT_LOADED\n")
    with pytest.raises(NvmlUnavailable, match="driver is not loaded"):
        NvmlSampler.open(None, library=str(fake_nvml), label_prefix=label_prefix)


def _ki(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernel_insight.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, **env},
        check=False,
    )


def test_cli_samples_with_a_library_override(fake_nvml, script, label_prefix):
    proc = _ki(
        ["probe", "nvml", "--library", str(fake_nvml), "--seconds", "1.2", "--label-prefix", label_prefix],
        {"KI_FAKE_NVML_SCRIPT": str(script)},
    )
    assert proc.returncode == 0, proc.stderr
    recs = drain(ring_name(f"{label_prefix}1"))
    assert sum(1 for r in recs if isinstance(r, SampleRecord) and r.metric == MetricId.MEMORY_USED) == 2


def test_cli_without_the_library_says_so(label_prefix):
    proc = _ki(
        ["probe", "nvml", "--library", "/nonexistent/libnvidia-ml.so.1", "--label-prefix", label_prefix], {}
    )
    assert proc.returncode == 2
    assert "ki probe nvml: cannot load NVML library /nonexistent/libnvidia-ml.so.1" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has a real NVML")
def test_cli_on_a_machine_without_nvml_says_so(label_prefix):
    proc = _ki(["probe", "nvml", "--label-prefix", label_prefix], {})
    assert proc.returncode == 2
    assert "NVML not found: libnvidia-ml.so.1 is not installed" in proc.stderr
