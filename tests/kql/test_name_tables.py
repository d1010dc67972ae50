"""No table keyed by function, operator or aggregation names outside the registries (issue 36): a
walk over kql's modules finds every literal tuple, list, set or dict whose strings include two or
more registered names; each must be one of the entries below, which say why they stay (field
names that happen to be function names). The registries themselves (kql/functions/registry.py's
decorator, kql/aggregators.py's, kql/operators.py's table) are where the names live."""

from __future__ import annotations

import ast
from pathlib import Path

from kernel_insight.kql import AGGREGATORS, FUNCTIONS
from kernel_insight.kql.operators import OPERATORS

KQL = Path(__file__).resolve().parents[2] / "kql"

#: (module, the registered names in the literal) -> why it is not a registry's job.
KNOWN: dict[tuple[str, frozenset[str]], str] = {
    ("engine.py", frozenset({"time", "start", "end"})): "query fields (time, start, end), not the functions",
    ("parser.py", frozenset({"start", "end"})): "the @ modifier's start()/end(), not the functions",
    ("histogram/notation.py", frozenset({"sum", "count"})): "histogram fields in the test notation",
    ("sparsehists.py", frozenset({"count", "sum"})): "column names",
    ("values.py", frozenset({"count", "sum"})): "the HTTP API's histogram fields",
    ("histdense.py", frozenset({"count", "sum"})): "histogram fields",
    ("promqltest.py", frozenset({"info"})): "annotation levels",
}


def _tables() -> dict[tuple[str, frozenset[str]], int]:
    names = set(FUNCTIONS) | set(AGGREGATORS) | set(OPERATORS)
    found: dict[tuple[str, frozenset[str]], int] = {}
    for path in sorted(KQL.rglob("*.py")):
        if path.relative_to(KQL).as_posix() == "operators.py":
            continue  # the operator registry
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Tuple | ast.List | ast.Set):
                elements = node.elts
            elif isinstance(node, ast.Dict):
                elements = [k for k in node.keys if k is not None]
            else:
                continue
            hits = [
                e.value
                for e in elements
                if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in names
            ]
            if len(hits) >= 2:
                found.setdefault((str(path.relative_to(KQL)), frozenset(hits)), node.lineno)
    return found


def test_no_name_keyed_table_outside_the_registries() -> None:
    found = _tables()
    new = {f"{key[0]}:{line} {sorted(key[1])}" for key, line in found.items() if key not in KNOWN}
    assert not new, (
        f"name-keyed tables outside the registries (put the property in the registry entry): {new}"
    )


def test_every_known_table_is_still_there() -> None:
    stale = [f"{key[0]} {sorted(key[1])}" for key in KNOWN if key not in _tables()]
    assert not stale, f"gone from the code, remove from KNOWN: {stale}"
