"""The `ki` command line: ring subcommands and the main job, run as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

KI = [sys.executable, "-m", "kernel_insight.cli"]


def ki(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KI, *args], capture_output=True, text=True, timeout=60)


def test_ring_create_stat_unlink_from_the_shell() -> None:
    gpu = f"cli-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    created = ki("ring", "create", gpu, "--capacity", "1024")
    assert created.returncode == 0, created.stderr
    assert f"created /kernel_insight.{gpu}: 1024 slots, mode 0600" in created.stdout
    try:
        stat = ki("ring", "stat", gpu)
        assert stat.returncode == 0
        doc = json.loads(stat.stdout)
        assert (doc["capacity"], doc["label"], doc["dropped"]) == (1024, gpu, 0)
    finally:
        assert ki("ring", "unlink", gpu).returncode == 0
    missing = ki("ring", "stat", gpu)
    assert missing.returncode == 1
    assert "no such ring" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_ring_create_rejects_a_bad_capacity_with_one_line() -> None:
    out = ki("ring", "create", f"bad-{os.getpid()}", "--capacity", "1000")
    assert out.returncode == 1
    assert "capacity must be a power of two" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("label", ["../etc", "a b", ""])
def test_ring_names_are_validated(label: str) -> None:
    out = ki("ring", "stat", label)
    assert out.returncode == 1
    assert "invalid GPU label" in out.stderr


@pytest.mark.slow
def test_main_job_runs_collector_agent_and_simulator_and_data_arrives(tmp_path) -> None:
    prefix = f"runtest{os.getpid()}-"
    out = subprocess.run(
        [*KI, "run", "--data", str(tmp_path), "--seconds", "8", "--every", "3", "--ring-prefix", prefix],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr
    reports = [line for line in out.stdout.splitlines() if "kernels stored" in line]
    assert reports, out.stdout
    final = reports[-1].replace(",", "").split()
    assert int(final[1]) > 0  # kernel spans went ring -> agent -> collector -> ClickHouse -> kql
    assert "1 healthy" in reports[-1]
    assert (tmp_path / "read.token").stat().st_mode & 0o777 == 0o600
    assert not os.path.exists(f"/dev/shm/kernel_insight.{prefix}0")
