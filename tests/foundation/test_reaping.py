"""The suite's check for child processes dropped unreaped (tests/support/reaping.py): the test that
drops one fails, naming it, and the next test does not pay for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

PROBES = """
import subprocess, sys

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_drops_in_a_cycle():
    p = subprocess.Popen(SLEEPER)
    holder = {"p": p}
    holder["self"] = holder  # freed only by the garbage collector, in whatever test runs then
    p.kill()


def test_innocent_after_the_cycle():
    assert True


def test_kills_without_wait():
    p = subprocess.Popen(SLEEPER)
    p.kill()


def test_reaps():
    p = subprocess.Popen(SLEEPER)
    p.kill()
    p.wait()


def test_innocent_last():
    assert True
"""


def test_the_test_that_drops_a_child_fails_and_no_other(tmp_path: Path) -> None:
    (tmp_path / "test_probes.py").write_text(PROBES)
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "support.reaping", "-p", "no:randomly", "-p", "no:cacheprovider",
         "-p", "no:xdist", "-rA", "-q", str(tmp_path)],
        cwd=tmp_path, env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    # "PASSED x" for each call that passed, "ERROR x - ..." for a teardown that failed
    outcomes = {
        (line.split()[0], line.split()[1].split("::")[1])
        for line in out.splitlines()
        if line.startswith(("PASSED ", "ERROR ", "FAILED "))
    }
    assert outcomes == {
        ("PASSED", "test_drops_in_a_cycle"),
        ("ERROR", "test_drops_in_a_cycle"),
        ("PASSED", "test_innocent_after_the_cycle"),
        ("PASSED", "test_kills_without_wait"),
        ("ERROR", "test_kills_without_wait"),
        ("PASSED", "test_reaps"),
        ("PASSED", "test_innocent_last"),
    }, out
    assert "started in test_probes.py::test_drops_in_a_cycle" in out
    assert "started in test_probes.py::test_kills_without_wait" in out
    assert "ResourceWarning" not in out
