"""kql against Prometheus 3.x semantics the vendored promqltest scripts do not reach (issue 36):
Prometheus' native_histograms.test (tests/fixtures/nativehist, the same commit as the vendored
scripts) and the cases in tests/fixtures/kql/prometheus3_semantics.test, every case passing over
object reads and over columnar reads with the dense paths taken wherever they can be."""

from __future__ import annotations

from pathlib import Path

import pytest
from columnar_memory import ColumnarMemory

from kernel_insight.kql import histdense
from kernel_insight.kql.promqltest import run_file
from kernel_insight.kql.storage import MemoryStorage

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SCRIPTS = {
    "prometheus3_semantics": (FIXTURES / "kql" / "prometheus3_semantics.test", 24),
    "native_histograms": (FIXTURES / "nativehist" / "native_histograms.test", 522),
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
@pytest.mark.parametrize("storage_type", [MemoryStorage, ColumnarMemory], ids=["objects", "columns"])
def test_every_case_passes(
    script: str, storage_type: type[MemoryStorage], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, evals = SCRIPTS[script]
    if storage_type is ColumnarMemory:
        monkeypatch.setattr(histdense, "DENSE_MIN_CELLS", 1)
    report = run_file(path, storage_type=storage_type)
    failing = [f"{r.case.id}: {r.case.query}: {r.reason}" for r in report.results if not r.passed]
    assert len(report.results) == evals
    assert not failing, "\n".join(failing)
