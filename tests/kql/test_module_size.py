"""No kql module over 1,200 lines (issue 36): a module that size holds more than one concept;
split it by responsibility (as kql/histogram/ splits the value type)."""

from __future__ import annotations

from pathlib import Path

KQL = Path(__file__).resolve().parents[2] / "kql"
LIMIT = 1_200


def test_no_kql_module_over_the_limit() -> None:
    sizes = {
        path.relative_to(KQL).as_posix(): len(path.read_text().splitlines()) for path in KQL.rglob("*.py")
    }
    assert len(sizes) > 40  # the walk found kql's modules
    over = {name: n for name, n in sizes.items() if n > LIMIT}
    assert not over, f"kql modules over {LIMIT} lines (split them by responsibility): {over}"
