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


def test_main_job_moves_records_from_a_producer_process_to_the_reader() -> None:
    gpu = f"run-{os.getpid()}"
    out = subprocess.run(
        [*KI, "run", "--gpu", gpu, "--seconds", "1", "--rate", "5000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    summary = next(line for line in out.stdout.splitlines() if line.startswith("producer wrote"))
    words = summary.replace(",", "").split()
    written, read = int(words[2]), int(words[5])
    assert written > 1000
    assert read == written
    assert "flash_attn_fwd" in out.stdout  # names resolved through STRING records
