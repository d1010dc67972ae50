"""``Any`` in kql's signatures only where a value really is any (issue 36): the evaluator's values
are typed (``kql.values.Value``, ``Operand``, ``Param``; the histogram cells ``kql.histcells.Hists``).

Counted: every parameter or return annotation of a function in kql that names ``Any`` anywhere
(``Any``, ``list[Any]``, ``Callable[..., Any]``). What is left: the function implementations'
argument lists (``args: list[Any]``, 71: each reads its arguments as its registry entry's
``arg_types`` declare them; typing them means an accessor per argument kind), the parser's lark
children (27), JSON objects, numpy element types and ragged rows. The ceilings may only go down:
lower them when a change types more."""

from __future__ import annotations

import ast
from pathlib import Path

KQL = Path(__file__).resolve().parents[2] / "kql"
#: Annotations naming ``Any`` anywhere in them.
CEILING = 119
#: Annotations that are ``Any`` itself: the parser's keyword arguments forwarded to ``dataclasses.replace``.
BARE_CEILING = 1


def _names_any(annotation: ast.expr) -> bool:
    return any(
        (isinstance(n, ast.Name) and n.id == "Any") or (isinstance(n, ast.Attribute) and n.attr == "Any")
        for n in ast.walk(annotation)
    )


def _any_annotations() -> tuple[list[str], list[str]]:
    anywhere, bare = [], []
    for path in sorted(KQL.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
            annotated = [(p.arg, p.annotation) for p in params] + [("return", node.returns)]
            for name, ann in annotated:
                if ann is None or not _names_any(ann):
                    continue
                where = (
                    f"{path.relative_to(KQL).as_posix()}:{node.lineno} {node.name} {name}: {ast.unparse(ann)}"
                )
                anywhere.append(where)
                if isinstance(ann, ast.Name):
                    bare.append(where)
    return anywhere, bare


def test_any_in_kql_signatures_only_goes_down() -> None:
    anywhere, bare = _any_annotations()
    assert len(anywhere) > 20  # the walk found kql's signatures
    assert len(anywhere) <= CEILING, "\n".join(anywhere)
    assert len(bare) <= BARE_CEILING, "\n".join(bare)
