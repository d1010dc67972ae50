"""One owner of ClickHouse: SQL statements are written in collector/clickhouse/ only, and
kql names no ClickHouse function and writes no SQL (docs/architecture.md, "Dependency rules").

A statement is a string literal (an f-string's literal parts too; docstrings aside) that starts
like one (SELECT, INSERT INTO, ALTER TABLE, ...) or holds a ``FROM t WHERE``/``SETTINGS x =``
clause. A module elsewhere that needs a statement calls a function or method of the package.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("agent", "collector", "kql", "api", "rules", "sdk", "kernel_insight")

#: The package that owns the SQL: the store, its schema and kql's reads over it.
OWNER = "collector/clickhouse/"

_SQL = re.compile(
    r"^\s*\(?\s*(SELECT|INSERT\s+INTO|ALTER\s+TABLE|CREATE\s+(TABLE|DATABASE|VIEW|MATERIALIZED)"
    r"|DROP\s+(TABLE|DATABASE|VIEW)|OPTIMIZE\s+TABLE|SYSTEM\s|TRUNCATE|DELETE\s+FROM|EXCHANGE\s+TABLES"
    r"|RENAME\s+TABLE|WITH\s+\w+\s+AS)\b"
    r"|\bSETTINGS\s+\w+\s*="
    r"|\bFROM\s+[{`\w.]+\s+(WHERE|FINAL|GROUP|ORDER|PREWHERE|LIMIT)\b"
)
#: ClickHouse's own names that kql must not hold (its functions, settings, SQL clauses).
_CLICKHOUSE = re.compile(
    r"timeSeries\w*ToGrid|allow_experimental|max_execution_time|max_result_rows|reinterpretAs"
    r"|(to|from)UnixTimestamp64|\b(SELECT|GROUP BY|ORDER BY|PREWHERE)\b"
)


def _statements(path: Path) -> list[int]:
    """Lines of the SQL statements written in ``path`` (string literals, docstrings aside)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and _SQL.search(node.value)
    )


def _writers() -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for component in PRODUCT:
        for path in sorted((ROOT / component).rglob("*.py")):
            lines = _statements(path)
            if lines:
                out[path.relative_to(ROOT).as_posix()] = lines
    return out


def test_the_statement_finder_finds_statements(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text(
        '"""SELECT in a docstring is prose."""\n'
        'a = "SELECT 1"\n'
        'b = f"SELECT x FROM {table} WHERE y"\n'
        'c = "  ALTER TABLE t DELETE WHERE 1"\n'
        'd = "select the series"\n'
        'e = "q SETTINGS max_threads = 1"\n'
    )
    assert _statements(sample) == [2, 3, 4, 6]


def test_sql_is_written_only_by_the_store() -> None:
    found = _writers()
    assert any(p.startswith(OWNER) for p in found), f"the finder finds no statement in {OWNER}"
    strays = {p: lines for p, lines in found.items() if not p.startswith(OWNER)}
    assert not strays, f"SQL outside {OWNER} (call one of its functions instead): {strays}"


def test_kql_names_no_clickhouse_function_and_writes_no_sql() -> None:
    """kql's storage contract is the protocol; which ClickHouse aggregate computes a function is
    the adapter's table (collector/clickhouse/query.py RANGE_GRID_AGGREGATES), keyed by kql's names."""
    hits = []
    for path in sorted((ROOT / "kql").rglob("*")):
        if path.suffix not in (".py", ".lark", ".pyi", ".c", ".h"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _CLICKHOUSE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hits, "\n".join(hits)
