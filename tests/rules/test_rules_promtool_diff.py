"""Differential: for rule unit-test files that use only PromQL, promtool (Debian's 2.42) and
``ki rules test`` agree on every case, failures included (same alerts, same samples, same
rule errors); only the wording of a query's parse error may differ."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
DIFF_FILES = sorted(p.name for p in FIXTURES.glob("*_test.yml") if not p.name.startswith("kql_"))
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool (Debian package prometheus) is not installed"
)


def _run(cmd: list[str]) -> tuple[int, str]:
    proc = subprocess.run(cmd, cwd=FIXTURES, capture_output=True, text=True, timeout=120)
    # Only a query's own parse error message is worded by each engine; the case it belongs to is not.
    text = re.sub(r"err: \d+:\d+: parse error: .*", "err: <parse error>", proc.stdout + proc.stderr)
    return proc.returncode, text


def _cases(text: str) -> list[str]:
    """The failing cases, one entry per error, in order."""
    return re.findall(r"^    (?:alertname|expr|rule): .*$", text, re.M)


@pytest.mark.parametrize("name", DIFF_FILES)
def test_promtool_and_ki_agree_on_every_case(name):
    rc_p, out_p = _run([PROMTOOL, "test", "rules", name])
    rc_k, out_k = _run([sys.executable, "-m", "kernel_insight.cli", "rules", "test", name])
    assert rc_k == rc_p
    assert _cases(out_k) == _cases(out_p)
    assert sorted(out_k.splitlines()) == sorted(out_p.splitlines())


def test_the_fixtures_exercise_failures_as_well_as_successes():
    results = {name: _run([PROMTOOL, "test", "rules", name]) for name in DIFF_FILES}
    assert any(rc == 0 for rc, _ in results.values())
    failing = [out for rc, out in results.values() if rc != 0]
    assert failing
    kinds = {c.split(":")[0].strip() for out in failing for c in _cases(out)}
    assert kinds == {"alertname", "expr", "rule"}
