"""``Any`` in kql's signatures only where a value really is any (issue 36): the evaluator's values
are typed (``kql.values.Value``, ``Operand``, ``Param``, ``Arg``; the histogram cells
``kql.histcells.Hists``), and a function implementation narrows each argument to what its registry
entry declares (``as_vector``, ``as_range``, ``as_scalar``, ``as_string`` in kql.values).

Counted: every parameter or return annotation of a function in kql that names ``Any`` anywhere
(``Any``, ``list[Any]``, ``Callable[..., Any]``). What is left: the parser's lark children (31),
JSON objects, numpy element types, ragged rows and a comparison key. The ceilings may only go
down: lower them when a change types more. kql/functions names ``Any`` in no signature, and a
function implementation's argument list is ``list[Arg]``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

KQL = Path(__file__).resolve().parents[2] / "kql"
FUNCTIONS = KQL / "functions"
#: Annotations naming ``Any`` anywhere in them.
CEILING = 43
#: Annotations that are ``Any`` itself: the parser's keyword arguments forwarded to ``dataclasses.replace``.
BARE_CEILING = 1


def _names_any(annotation: ast.expr) -> bool:
    return any(
        (isinstance(n, ast.Name) and n.id == "Any") or (isinstance(n, ast.Attribute) and n.attr == "Any")
        for n in ast.walk(annotation)
    )


Signature = tuple[str, str, ast.expr | None]


def _signatures(root: Path) -> Iterator[Signature]:
    """(``file:line function``, parameter name or "return", annotation) of every function under ``root``."""
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
            where = f"{path.relative_to(KQL).as_posix()}:{node.lineno} {node.name}"
            for name, ann in [(p.arg, p.annotation) for p in params] + [("return", node.returns)]:
                yield where, name, ann


def _any_annotations(root: Path = KQL) -> tuple[list[str], list[str]]:
    anywhere, bare = [], []
    for where, name, ann in _signatures(root):
        if ann is None or not _names_any(ann):
            continue
        anywhere.append(f"{where} {name}: {ast.unparse(ann)}")
        if isinstance(ann, ast.Name):
            bare.append(anywhere[-1])
    return anywhere, bare


def test_any_in_kql_signatures_only_goes_down() -> None:
    anywhere, bare = _any_annotations()
    assert len(anywhere) > 20  # the walk found kql's signatures
    assert len(anywhere) <= CEILING, "\n".join(anywhere)
    assert len(bare) <= BARE_CEILING, "\n".join(bare)


def test_function_implementations_take_typed_arguments() -> None:
    """A function implementation's evaluated arguments (``args`` beside the call context ``ctx``)
    are ``list[Arg]``, each narrowed to what the registry entry declares, never ``list[Any]``;
    nothing else in kql/functions names Any."""
    by_function: dict[str, dict[str, ast.expr | None]] = {}
    for where, name, ann in _signatures(FUNCTIONS):
        by_function.setdefault(where, {})[name] = ann
    impls = {
        where: params["args"] for where, params in by_function.items() if {"ctx", "args"} <= params.keys()
    }
    assert len(impls) > 60  # the walk found the implementations
    untyped = [
        f"{where} args: {ann and ast.unparse(ann)}"
        for where, ann in impls.items()
        if ann is None or ast.unparse(ann) != "list[Arg]"
    ]
    assert not untyped, "\n".join(untyped)
    anywhere, _ = _any_annotations(FUNCTIONS)
    assert not anywhere, "\n".join(anywhere)
