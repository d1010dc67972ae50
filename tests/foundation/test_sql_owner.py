"""One owner of ClickHouse: SQL statements are written in collector/clickhouse/ only, and
kql names no ClickHouse function and writes no SQL (docs/architecture.md, "Dependency rules").

A statement is a string literal (an f-string's literal parts too; docstrings aside) that starts
like one (SELECT, INSERT INTO, ALTER TABLE, ...) or holds a ``FROM t WHERE``/``SETTINGS x =``
clause. A module elsewhere that needs a statement calls a function or method of the package.
Tests read what was stored through the store's API, not its tables, except the store's own
tests; those that still query ``ki.*`` are listed in ``TABLE_READS_IN_TESTS``, counts that may
only go down.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("agent", "collector", "kql", "api", "rules", "sdk", "kernel_insight")

#: The package that owns the SQL: the store, its schema and kql's reads over it.
OWNER = "collector/clickhouse/"

#: The store's own tests, which may read its tables directly.
STORE_TESTS = frozenset(
    {
        "tests/collector/test_merges.py",
        "tests/collector/test_schema_ddl.py",
        "tests/collector/test_sql.py",
        "tests/collector/test_storage_errors.py",
        "tests/collector/test_store_embedded.py",
        "tests/collector/test_store_histograms.py",
        "tests/collector/test_store_migration.py",
        "tests/collector/test_store_server.py",
        "tests/collector/test_store_sink.py",
        "tests/collector/test_value_codec.py",
    }
)

#: Other tests (and test helpers) that still query ``ki.*`` tables in SQL of their own, and how
#: many statements: each is to use the store's API instead (issue #35). Counts may only go down.
TABLE_READS_IN_TESTS: dict[str, int] = {
    "tests/agent/test_agent_e2e.py": 1,
    "tests/agent/test_agent_heartbeat_samples.py": 3,
    "tests/agent/test_agent_hist_increments.py": 2,
    "tests/agent/test_collector_outage.py": 1,
    "tests/collector/test_batcher.py": 2,
    "tests/collector/test_hist_increments.py": 1,
    "tests/collector/test_names_once.py": 1,
    "tests/collector/test_remote_write.py": 2,
    "tests/collector/test_remote_write_histograms.py": 5,
    "tests/collector/test_remote_write_histograms_prometheus.py": 1,
    "tests/collector/test_sample_cache.py": 1,
    "tests/collector/test_series_rows.py": 1,
    "tests/upgrade/test_upgrade.py": 1,
}

_KI_TABLE = re.compile(r"\bki\.\w+")

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


def _table_reads(path: Path) -> list[int]:
    """Lines of the SQL statements in ``path`` that name a ``ki.*`` table."""
    tree = ast.parse(path.read_text(), str(path))
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _KI_TABLE.search(node.value)
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


def test_tests_use_the_stores_api_not_its_tables() -> None:
    """Outside the store's own tests, a test reads what was stored through the store's API (or
    kql, or the HTTP API), not by querying ``ki.*`` tables; the files that still do may only
    shrink."""
    found = {
        path.relative_to(ROOT).as_posix(): lines
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if (lines := _table_reads(path))
    }
    assert any(p in STORE_TESTS for p in found), "the finder finds no table read in the store's tests"
    strays = {
        p: lines for p, lines in found.items() if p not in STORE_TESTS and p not in TABLE_READS_IN_TESTS
    }
    assert not strays, f"tests querying ki.* tables (use the store's API instead): {strays}"
    changed = {
        p: len(found.get(p, [])) for p, n in TABLE_READS_IN_TESTS.items() if len(found.get(p, [])) != n
    }
    assert not changed, f"update TABLE_READS_IN_TESTS (counts may only go down): {changed}"
