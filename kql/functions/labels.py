"""Label and ordering functions: label_replace, label_join, sort*, absent."""

from __future__ import annotations

import re
from functools import cmp_to_key
from typing import TYPE_CHECKING

import numpy as np

from kernel_insight.kql.ast import MatrixSelector, VectorSelector
from kernel_insight.kql.errors import KqlEvaluationError
from kernel_insight.kql.functions._common import STR, V, labels_from_equal_matchers
from kernel_insight.kql.functions.registry import function
from kernel_insight.kql.lexical import go_quote, is_valid_label_name
from kernel_insight.kql.regex import RegexError, compile_anchored
from kernel_insight.kql.storage import Labels
from kernel_insight.kql.values import Arg, CallContext, StepVector, as_string, as_vector
from kernel_insight.kql.vectors import consolidate

if TYPE_CHECKING:
    from re2 import _Match

__all__ = ["expand_template", "natural_less"]

_TEMPLATE = re.compile(r"\$(?:\$|\{([A-Za-z0-9_]+)\}|([A-Za-z0-9_]+))")


def expand_template(template: str, match: _Match[str]) -> str:
    """Go's ``Regexp.Expand``: ``$1``, ``${1}``, ``$name``; unknown groups expand to nothing."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(2)
        try:
            value = match.group(int(name)) if name.isdigit() else match.group(name)
        except IndexError:  # no such group: Go expands it to nothing
            return ""
        return value or ""

    return _TEMPLATE.sub(sub, template)


def _with_label(labels: Labels, name: str, value: str) -> Labels:
    items = {k: v for k, v in labels if k != name}
    if value:
        items[name] = value
    return tuple(sorted(items.items()))


def _relabel(vec: StepVector, dst: str, new_labels: list[Labels]) -> StepVector:
    drop = vec.drop_name.copy()
    if dst == "__name__":
        drop[:] = False  # a name written by the user survives delayed name removal
    out = StepVector(new_labels, vec.values, vec.present, drop, vec.sample_ts, vec.hists)
    return consolidate(out)


@function("label_replace", (V, STR, STR, STR, STR), V, histogram_samples="pass_through")
def _label_replace(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Set ``dst`` to the expanded ``replacement`` where ``regex`` fully matches label ``src``."""
    vec = as_vector(args[0])
    dst, replacement, src, regex = (as_string(a) for a in args[1:])
    try:
        pattern = compile_anchored(regex)
    except RegexError as exc:
        raise KqlEvaluationError(
            f"invalid regular expression in label_replace(): {go_quote(regex)}: {exc}"
        ) from None
    if not is_valid_label_name(dst):
        raise KqlEvaluationError(f"invalid destination label name in label_replace(): {go_quote(dst)}")
    new_labels = []
    for i, labels in enumerate(vec.labels):
        if i % 1024 == 1023:
            ctx.check()
        m = pattern.match(dict(labels).get(src, ""))
        new_labels.append(_with_label(labels, dst, expand_template(replacement, m)) if m else labels)
    return _relabel(vec, dst, new_labels)


@function("label_join", (V, STR, STR, STR), V, variadic=-1, histogram_samples="pass_through")
def _label_join(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Set ``dst`` to the values of the ``src`` labels joined by ``separator``."""
    vec, dst, sep = as_vector(args[0]), as_string(args[1]), as_string(args[2])
    srcs = [as_string(a) for a in args[3:]]
    if not is_valid_label_name(dst):
        raise KqlEvaluationError(f"invalid destination label name in label_join(): {go_quote(dst)}")
    for src in srcs:
        if not is_valid_label_name(src):
            raise KqlEvaluationError(f"invalid source label name in label_join(): {go_quote(src)}")
    new_labels = []
    for labels in vec.labels:
        lookup = dict(labels)
        new_labels.append(_with_label(labels, dst, sep.join(lookup.get(s, "") for s in srcs)))
    return _relabel(vec, dst, new_labels)


def _sort_warning(ctx: CallContext) -> None:
    if ctx.is_range_query:
        ctx.warn("sort is ineffective for range queries since results are always ordered by labels")


def _sorted_by_value(ctx: CallContext, vec: StepVector, descending: bool) -> StepVector:
    _sort_warning(ctx)
    if ctx.steps != 1 or len(vec) < 2:
        return vec
    values = vec.values[:, 0]
    nan = np.isnan(values)
    key = np.where(nan, np.inf, -values if descending else values)
    order = np.lexsort((key, nan))
    return vec.take(order)


@function("sort", (V,), V)
def _sort(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Order an instant vector by value, ascending (NaN last)."""
    return _sorted_by_value(ctx, as_vector(args[0]), descending=False)


@function("sort_desc", (V,), V)
def _sort_desc(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Order an instant vector by value, descending (NaN last)."""
    return _sorted_by_value(ctx, as_vector(args[0]), descending=True)


_CHUNK = re.compile(r"(\d+|\D+)")


def natural_less(a: str, b: str) -> bool:
    """``facette/natsort.Compare``: digit runs compare as numbers, everything else as text."""
    ca, cb = _CHUNK.findall(a), _CHUNK.findall(b)
    for i, x in enumerate(ca):
        if i >= len(cb):
            return False
        y = cb[i]
        if x.isdigit() and y.isdigit():
            if int(x) == int(y):
                if i == len(ca) - 1:
                    return True
                if i == len(cb) - 1:
                    return False
                continue
            return int(x) < int(y)
        if x == y:
            if i == len(ca) - 1:
                return True
            if i == len(cb) - 1:
                return False
            continue
        return bool(x < y)
    return False


def _sort_by_label(ctx: CallContext, args: list[Arg], descending: bool) -> StepVector:
    vec = as_vector(args[0])
    names = [as_string(a) for a in args[1:]]
    _sort_warning(ctx)
    sign = -1 if descending else 1

    def compare(i: int, j: int) -> int:
        a, b = dict(vec.labels[i]), dict(vec.labels[j])
        for name in names:
            x, y = a.get(name, ""), b.get(name, "")
            if x == y:
                continue
            return -sign if natural_less(x, y) else sign
        la, lb = vec.labels[i], vec.labels[j]
        return 0 if la == lb else (-sign if la < lb else sign)

    order = sorted(range(len(vec)), key=cmp_to_key(compare))
    return vec.take(order)


@function("sort_by_label", (V, STR), V, variadic=-1, histogram_samples="pass_through")
def _sort_by_label_asc(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Order by the given labels' values (natural order), then by the full label set."""
    return _sort_by_label(ctx, args, descending=False)


@function("sort_by_label_desc", (V, STR), V, variadic=-1, histogram_samples="pass_through")
def _sort_by_label_desc(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Like sort_by_label, descending."""
    return _sort_by_label(ctx, args, descending=True)


@function("absent", (V,), V, histogram_samples="presence", result_unit="unitless")
def _absent(ctx: CallContext, args: list[Arg]) -> StepVector:
    """1 with the selector's equality labels at steps where the vector is empty."""
    vec = as_vector(args[0])
    arg = ctx.node.args[0]
    labels: Labels = ()
    if isinstance(arg, VectorSelector):
        labels = labels_from_equal_matchers(arg.all_matchers())
    elif isinstance(arg, MatrixSelector):
        labels = labels_from_equal_matchers(arg.vector.all_matchers())
    empty = ~vec.present.any(axis=0) if len(vec) else np.ones(ctx.steps, dtype=bool)
    out = StepVector([labels], np.ones((1, ctx.steps)), empty.reshape(1, -1), np.zeros(1, dtype=bool))
    return out.compact()
