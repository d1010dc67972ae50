"""kql against Prometheus 3.x semantics the vendored promqltest scripts do not reach (issue 36):
the cases in tests/fixtures/kql/prometheus3_semantics.test, over object and columnar reads."""

from __future__ import annotations

from pathlib import Path

import pytest
from columnar_memory import ColumnarMemory

from kernel_insight.kql.promqltest import run_file
from kernel_insight.kql.storage import MemoryStorage

SCRIPT = Path(__file__).resolve().parent.parent / "fixtures" / "kql" / "prometheus3_semantics.test"


@pytest.mark.parametrize("storage_type", [MemoryStorage, ColumnarMemory], ids=["objects", "columns"])
def test_every_prometheus3_case_passes(storage_type: type[MemoryStorage]) -> None:
    report = run_file(SCRIPT, storage_type=storage_type)
    failing = [f"{r.case.id}: {r.case.expr}: {r.reason}" for r in report.results if not r.passed]
    assert len(report.results) >= 11
    assert not failing, "\n".join(failing)
