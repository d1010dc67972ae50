"""The storage contract is explicit: every read carries its SelectHints, and what a store can do
beyond select is what it declares in ``capabilities``, never what its methods happen to be."""

from __future__ import annotations

import ast
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from kernel_insight.kql import Capability, Engine, EngineLimits, MemoryStorage, SelectHints
from kernel_insight.kql.pushdown import SeriesColumns, columns_of
from kernel_insight.kql.storage import NO_HINTS, Matcher, SeriesData

KQL = Path(__file__).resolve().parents[2] / "kql"
MIN = 60_000


class Recording(MemoryStorage):
    """Remembers the hints of every select."""

    def __init__(self) -> None:
        super().__init__()
        self.hints: list[SelectHints] = []
        for gpu in ("0", "1"):
            self.add({"__name__": "x", "gpu": gpu}, range(0, 10 * MIN, 15_000), [float(i) for i in range(40)])
            self.add({"__name__": "y", "gpu": gpu}, [0, 5 * MIN], [1.0, 2.0])

    def select(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> list[SeriesData]:
        self.hints.append(hints)
        return super().select(matchers, start_ms, end_ms, hints)


def _hints(query: str, *, range_query: bool = True) -> list[SelectHints]:
    s = Recording()
    engine = Engine(s, EngineLimits(timeout_s=30))
    began = time.monotonic()
    if range_query:
        engine.range_query(query, 5 * MIN, 9 * MIN, MIN)
    else:
        engine.instant_query(query, 9 * MIN)
    assert s.hints, "the engine read nothing"
    for h in s.hints:
        assert h.budget is not None
        assert began + 20 < h.budget.deadline <= time.monotonic() + 30
        assert h.budget.timeout_s == 30
    return s.hints


def test_a_range_function_read_names_the_function_its_range_and_the_step() -> None:
    (h,) = _hints("sum by (gpu) (rate(x[5m]))")
    assert (h.func, h.range_ms, h.step_ms) == ("rate", 300_000, MIN)
    assert h.start_timestamps  # rate reads start timestamps of its selector
    assert h.grouping == ()  # the aggregation is not directly around the selector


def test_an_aggregated_selector_read_names_the_aggregation_and_its_grouping() -> None:
    (h,) = _hints("sum by (gpu) (x)", range_query=False)
    assert (h.func, h.grouping, h.by, h.range_ms, h.step_ms) == ("sum", ("gpu",), True, 0, 0)
    assert not h.start_timestamps
    (h,) = _hints("max without (gpu) (x)")
    assert (h.func, h.grouping, h.by) == ("max", ("gpu",), False)


def test_a_binary_operator_hides_the_function_around_it() -> None:
    hints = _hints("abs(x - y)")
    assert [h.func for h in hints] == ["", ""]
    (h,) = _hints("max_over_time(x[2m])")
    assert (h.func, h.range_ms, h.start_timestamps) == ("max_over_time", 120_000, False)


def test_the_budget_shrinks_by_what_the_query_already_holds() -> None:
    first, second = _hints("x + y")
    assert first.budget is not None
    assert second.budget is not None
    assert second.budget.max_samples < first.budget.max_samples


class Undeclared(MemoryStorage):
    """Has a ``select_columns`` that would answer wrongly, but does not declare it."""

    calls = 0

    def select_columns(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> SeriesColumns:
        type(self).calls += 1
        return columns_of([])


class Declared(Undeclared):
    capabilities = frozenset({Capability.COLUMNS})


@pytest.mark.parametrize(("cls", "used"), [(Undeclared, False), (Declared, True)])
def test_capabilities_are_declared_not_probed(cls: type[Undeclared], used: bool) -> None:
    s = cls()
    s.add({"__name__": "x"}, [0], [1.0])
    cls.calls = 0
    samples = Engine(s).instant_query("x", 0).value.samples
    assert (cls.calls > 0) == used
    assert len(samples) == (0 if used else 1)


def test_an_undeclared_capability_refuses_to_run() -> None:
    with pytest.raises(NotImplementedError, match=r"does not declare Capability\.LAST_ON_GRID"):
        MemoryStorage().select_last_on_grid([], 0, 0, SelectHints(step_ms=1), 1)


def test_kql_has_no_hidden_storage_parameters() -> None:
    """No ContextVar in kql (the budget and start timestamps are hints), and no isinstance
    probe of a storage protocol (capabilities are declared)."""
    for path in sorted(KQL.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id == "ContextVar":
                pytest.fail(f"{path.relative_to(KQL.parent)}:{node.lineno}: ContextVar in kql")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "isinstance"
                and len(node.args) == 2
                and ast.unparse(node.args[1]).endswith("Storage")
            ):
                pytest.fail(f"{path.relative_to(KQL.parent)}:{node.lineno}: isinstance probe of a storage")
