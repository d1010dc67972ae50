"""Binary operators: arithmetic, comparisons, set operators and vector matching, over all steps at once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from kernel_insight.kql.ast import BinaryExpr, PosRange, VectorMatching
from kernel_insight.kql.errors import KqlEvaluationError
from kernel_insight.kql.histcells import object_cells
from kernel_insight.kql.histogram import GAUGE_TYPE as GAUGE
from kernel_insight.kql.histsamples import (
    OBJ,
    H,
    Incompatible,
    counter_reset_collision,
    hadd,
    hcompact,
    hdiv,
    hequals,
    hmul,
    hsub,
    incompatible_bucket_layout,
    incompatible_types,
    reconciled_custom_buckets,
)
from kernel_insight.kql.lexical import go_quote
from kernel_insight.kql.operators import ARITHMETIC as ARITH
from kernel_insight.kql.operators import COMPARISON, OPERATORS
from kernel_insight.kql.parser import COMPARISON_OPS, SET_OPS, TRIM_OPS
from kernel_insight.kql.storage import Labels
from kernel_insight.kql.values import Operand, StepVector, labels_to_str
from kernel_insight.kql.vectors import LabelsMemo, consolidate

if TYPE_CHECKING:
    from kernel_insight.kql.engine import _Evaluator as Evaluator

__all__ = ["ARITHMETIC", "COMPARE", "binary_op", "evaluate_binary"]

F64 = npt.NDArray[np.float64]
BOOL = npt.NDArray[np.bool_]

#: The float operation of each arithmetic operator and of each comparison (from the registry).
ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    name: spec.floats for name, spec in OPERATORS.items() if spec.kind == ARITH and spec.floats
}
COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    name: spec.floats for name, spec in OPERATORS.items() if spec.kind == COMPARISON and spec.floats
}

_DEFAULT_MATCHING = VectorMatching()


def _apply(op: str, lhs: F64, rhs: F64) -> F64:
    out: F64 = ARITHMETIC[op](lhs, rhs) if op in ARITHMETIC else COMPARE[op](lhs, rhs)
    return out


def evaluate_binary(ev: Evaluator, node: BinaryExpr, lhs: Operand, rhs: Operand) -> Operand:
    """``lhs op rhs`` for the evaluator ``ev`` (its annotations): float samples columnar
    (:func:`binary_op`), histogram samples one pair at a time (Prometheus' vectorElemBinop)."""
    if node.op in TRIM_OPS:
        if not isinstance(lhs, StepVector) and not isinstance(rhs, StepVector):
            # Prometheus' scalarBinop has no case for them (its evaluator panics with this text).
            raise KqlEvaluationError(f"operator {go_quote(node.op)} not allowed for Scalar operations")
        return histogram_binary(ev, node, lhs, rhs)
    if (isinstance(lhs, StepVector) and lhs.has_hists) or (isinstance(rhs, StepVector) and rhs.has_hists):
        return histogram_binary(ev, node, lhs, rhs)
    return binary_op(node, lhs, rhs)


def binary_op(node: BinaryExpr, lhs: Operand, rhs: Operand) -> Operand:
    """Evaluate ``lhs op rhs`` where each side is a scalar array (steps,) or a StepVector."""
    op = node.op
    if isinstance(lhs, StepVector):
        if isinstance(rhs, StepVector):
            matching = node.matching or _DEFAULT_MATCHING
            if op in SET_OPS:
                return _set_op(op, lhs, rhs, matching)
            return _vector_vector(node, lhs, rhs, matching)
        return _vector_scalar(node, lhs, rhs, swapped=False)
    if isinstance(rhs, StepVector):
        return _vector_scalar(node, rhs, lhs, swapped=True)
    result = _apply(op, lhs, rhs)
    return result.astype(np.float64) if op in COMPARE else result


def _vector_scalar(node: BinaryExpr, vec: StepVector, scalar: F64, swapped: bool) -> StepVector:
    op = node.op
    lv, rv = (scalar[None, :], vec.values) if swapped else (vec.values, scalar[None, :])
    if op in COMPARE:
        cond = COMPARE[op](lv, rv)
        if node.return_bool:
            return StepVector(vec.labels, cond.astype(np.float64), vec.present, np.ones(len(vec), dtype=bool))
        # The vector's own value survives a comparison, whichever side it is on.
        return StepVector(vec.labels, vec.values, vec.present & cond, vec.drop_name, vec.sample_ts).compact()
    values = ARITHMETIC[op](lv, rv)
    return StepVector(
        vec.labels, np.broadcast_to(values, vec.values.shape).copy(), vec.present, _ones(len(vec))
    )


def _ones(n: int) -> npt.NDArray[np.bool_]:
    return np.ones(n, dtype=bool)


#: (on, labels) -> {id(label set): (label set, its signature)}: as aggregation's _GROUP_KEYS, a
#: rule's join computes the same signatures of the same series at every evaluation.
_SIGNATURES: dict[tuple[bool, tuple[str, ...]], dict[int, tuple[Labels, Labels]]] = {}
_SIGNATURES_MAX = 1_000_000


def signature_fn(matching: VectorMatching) -> Callable[[Labels], Labels]:
    """Labels two series must agree on to match: the ``on`` labels, or all but ``ignoring`` and the name."""
    names = frozenset(matching.labels)
    on = matching.on
    memo = _SIGNATURES.setdefault((on, tuple(matching.labels)), {})
    if len(memo) > _SIGNATURES_MAX:
        memo.clear()

    def sig(labels: Labels) -> Labels:
        hit = memo.get(id(labels))
        if hit is not None and hit[0] is labels:
            return hit[1]
        if on:
            out = tuple(p for p in labels if p[0] in names)
        else:
            out = tuple(p for p in labels if p[0] not in names and p[0] != "__name__")
        memo[id(labels)] = (labels, out)
        return out

    return sig


def _presence_by_sig(vec: StepVector, sigs: list[Labels]) -> dict[Labels, BOOL]:
    out: dict[Labels, BOOL] = {}
    for sig, present in zip(sigs, vec.present, strict=True):
        seen = out.get(sig)
        out[sig] = present.copy() if seen is None else seen | present
    return out


#: (on, labels) and both sides' labels -> each side's rows' signature ids (shared numbering).
_SET_PLANS: LabelsMemo[tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], int]] = LabelsMemo()


def _signature_ids(
    lhs: list[Labels], rhs: list[Labels], matching: VectorMatching
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], int]:
    """Each row's signature as an id, numbered over both sides, and the number of signatures."""
    spec = (matching.on, matching.labels)
    hit = _SET_PLANS.get(spec, lhs, rhs)
    if hit is not None:
        return hit
    sig = signature_fn(matching)
    ids: dict[Labels, int] = {}
    left = np.fromiter((ids.setdefault(sig(lb), len(ids)) for lb in lhs), dtype=np.intp, count=len(lhs))
    right = np.fromiter((ids.setdefault(sig(lb), len(ids)) for lb in rhs), dtype=np.intp, count=len(rhs))
    return _SET_PLANS.put(spec, (lhs, rhs), (left, right, len(ids)))


def _any_by(gid: npt.NDArray[np.intp], present: BOOL, n: int) -> BOOL:
    """Per signature id and step: whether any row of that signature is present."""
    out = np.zeros((n, present.shape[1]), dtype=bool)
    np.logical_or.at(out, gid, present)
    return out


def _set_op(op: str, lhs: StepVector, rhs: StepVector, matching: VectorMatching) -> StepVector:
    left, right_ids, n = _signature_ids(lhs.labels, rhs.labels, matching)
    if op == "or":
        r_present = rhs.present & ~_any_by(left, lhs.present, n)[right_ids]
        right = StepVector(rhs.labels, rhs.values, r_present, rhs.drop_name, rhs.sample_ts).compact()
        sample_ts = None
        if lhs.sample_ts is not None and right.sample_ts is not None:
            sample_ts = np.concatenate([lhs.sample_ts, right.sample_ts])
        return StepVector(
            lhs.labels + right.labels,
            np.concatenate([lhs.values, right.values]),
            np.concatenate([lhs.present, right.present]),
            np.concatenate([lhs.drop_name, right.drop_name]),
            sample_ts,
        )
    r_any = _any_by(right_ids, rhs.present, n)[left]
    mask = lhs.present & (r_any if op == "and" else ~r_any)
    return StepVector(lhs.labels, lhs.values, mask, lhs.drop_name, lhs.sample_ts).compact()


def _first_two_overlapping(rows: list[int], present: BOOL) -> tuple[int, int] | None:
    sub = present[rows]
    both = np.flatnonzero(sub.sum(axis=0) > 1)
    if len(both) == 0:
        return None
    hits = [rows[k] for k in np.flatnonzero(sub[:, both[0]])]
    return hits[0], hits[1]


def _result_labels(
    many: Labels, one: Labels, matching: VectorMatching, one_to_one: bool, include: frozenset[str]
) -> Labels:
    if one_to_one:
        names = frozenset(matching.labels)
        if matching.on:
            many = tuple(p for p in many if p[0] in names)
        else:
            many = tuple(p for p in many if p[0] not in names)
    if include:
        one_map = dict(one)
        kept = {k: v for k, v in many if k not in include}
        for name in include:
            value = one_map.get(name, "")
            if value:
                kept[name] = value
        many = tuple(sorted(kept.items()))
    return many


@dataclass(frozen=True, slots=True)
class _JoinPlan:
    """What a join works out from the two sides' label sets alone (see :class:`LabelsMemo`)."""

    many_sigs: list[Labels]
    one_sigs: list[Labels]
    one_groups: dict[Labels, list[int]]  # signature -> the one side's rows
    one_multi: dict[Labels, list[int]]  # the one side's signatures with several rows
    many_multi: dict[Labels, list[int]]  # the many side's matched signatures with several rows
    pm: npt.NDArray[np.intp]  # the pairs (many row, one row) when no signature has several one rows
    po: npt.NDArray[np.intp]
    pair_labels: list[Labels] | None  # their result labels (None: one_multi is not empty)


#: (matching, swapped) and both sides' labels -> their :class:`_JoinPlan`.
_JOIN_PLANS: LabelsMemo[_JoinPlan] = LabelsMemo()


def _join_plan(many_labels: list[Labels], one_labels: list[Labels], matching: VectorMatching) -> _JoinPlan:
    sig = signature_fn(matching)
    many_sigs = [sig(lb) for lb in many_labels]
    one_sigs = [sig(lb) for lb in one_labels]
    one_groups: dict[Labels, list[int]] = {}
    for j, s in enumerate(one_sigs):
        one_groups.setdefault(s, []).append(j)
    one_multi = {s: rows for s, rows in one_groups.items() if len(rows) > 1}
    many_multi: dict[Labels, list[int]] = {}
    if matching.card == "one-to-one":
        many_groups: dict[Labels, list[int]] = {}
        for i, s in enumerate(many_sigs):
            if s in one_groups:
                many_groups.setdefault(s, []).append(i)
        many_multi = {s: rows for s, rows in many_groups.items() if len(rows) > 1}
    empty = np.empty(0, dtype=np.intp)
    if one_multi:
        return _JoinPlan(many_sigs, one_sigs, one_groups, one_multi, many_multi, empty, empty, None)
    partner = {s: rows[0] for s, rows in one_groups.items()}
    match = np.fromiter((partner.get(s, -1) for s in many_sigs), dtype=np.intp, count=len(many_sigs))
    pm = np.flatnonzero(match >= 0)
    po = match[pm]
    labels = _pair_labels(
        pm, po, many_labels, one_labels, many_sigs, one_sigs, matching, matching.card == "one-to-one"
    )
    return _JoinPlan(many_sigs, one_sigs, one_groups, one_multi, many_multi, pm, po, labels)


def _pair_labels(
    pm: npt.NDArray[np.intp],
    po: npt.NDArray[np.intp],
    many_labels: list[Labels],
    one_labels: list[Labels],
    many_sigs: list[Labels],
    one_sigs: list[Labels],
    matching: VectorMatching,
    one_to_one: bool,
) -> list[Labels]:
    """The result labels of every pair (-1: a side synthesised by a fill modifier)."""
    include = frozenset(matching.include)
    labels: list[Labels] = []
    cache: dict[tuple[Labels, Labels], Labels] = {}
    for i, j in zip(pm.tolist(), po.tolist(), strict=True):
        many_side = many_labels[i] if i >= 0 else one_sigs[j]
        one_side = one_labels[j] if j >= 0 else many_sigs[i]
        if not one_to_one and not include:
            labels.append(many_side)  # many-to-one without group_left labels keeps the many side's
            continue
        key = (many_side, one_side)
        result = cache.get(key)
        if result is None:
            result = cache[key] = _result_labels(many_side, one_side, matching, one_to_one, include)
        labels.append(result)
    return labels


def _vector_vector(
    node: BinaryExpr, lhs: StepVector, rhs: StepVector, matching: VectorMatching
) -> StepVector:
    op = node.op
    comparison = op in COMPARISON_OPS
    keeps_name = comparison and not node.return_bool
    swapped = matching.card == "one-to-many"
    many, one = (rhs, lhs) if swapped else (lhs, rhs)
    # After the swap, fill_left fills the many side and fill_right the one side (as upstream).
    fill_many, fill_one = matching.fill_left, matching.fill_right
    one_to_one = matching.card == "one-to-one"
    steps = many.present.shape[1] if len(many) else one.present.shape[1]
    spec = (matching.card, matching.on, matching.labels, matching.include, swapped)
    plan = _JOIN_PLANS.get(spec, many.labels, one.labels) or _JOIN_PLANS.put(
        spec, (many.labels, one.labels), _join_plan(many.labels, one.labels, matching)
    )
    many_sigs, one_sigs, one_groups = plan.many_sigs, plan.one_sigs, plan.one_groups
    for s, rows in plan.one_multi.items():
        if (pair := _first_two_overlapping(rows, one.present)) is not None:
            a, b = sorted((one.labels[pair[0]], one.labels[pair[1]]))
            side = "left" if swapped else "right"
            raise KqlEvaluationError(
                f"found duplicate series for the match group {labels_to_str(s)} on the {side} hand-side of the "
                f"operation: [{labels_to_str(a)}, {labels_to_str(b)}];many-to-many matching not allowed: "
                "matching labels must be unique on one side"
            )
    # Where each signature's "one" side is present: needed to check one-to-one matches and to fill.
    one_any: dict[Labels, BOOL] = (
        {s: np.asarray(one.present[rows].any(axis=0)) for s, rows in one_groups.items()}
        if fill_one is not None
        else {s: np.asarray(one.present[one_groups[s]].any(axis=0)) for s in plan.many_multi}
    )
    if one_to_one:
        for s, rows in plan.many_multi.items():
            matched = many.present[rows] & one_any[s][None, :]
            if (matched.sum(axis=0) > 1).any():
                raise KqlEvaluationError(
                    "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)"
                )

    # Pairs (many row, one row); -1 stands for a side synthesised by a fill modifier.
    labels: list[Labels] | None = None
    if fill_one is None and fill_many is None and not plan.one_multi:
        # The usual join: one series per signature on the "one" side, so every many row has at
        # most one partner (the plan's pairs), and the pairs' masks are one gather.
        pm, po = plan.pm, plan.po
        if len(pm) == 0:
            return StepVector.empty(steps)
        mask = many.present[pm] & one.present[po]
        many_vals, one_vals = many.values[pm], one.values[po]
        labels = plan.pair_labels
    else:
        pm, po, mask, many_vals, one_vals = _pairs_general(
            many, one, many_sigs, one_sigs, one_groups, one_any, fill_many, fill_one, steps
        )
        if len(pm) == 0:
            return StepVector.empty(steps)
    lv, rv = (one_vals, many_vals) if swapped else (many_vals, one_vals)
    if comparison:
        cond = COMPARE[op](lv, rv)
        if node.return_bool:
            values = cond.astype(np.float64)
        else:
            values = lv
            mask &= cond
    else:
        values = ARITHMETIC[op](lv, rv)

    if labels is None:
        labels = _pair_labels(pm, po, many.labels, one.labels, many_sigs, one_sigs, matching, one_to_one)
    else:
        labels = list(labels)
    if keeps_name:
        drop = np.where(pm >= 0, many.drop_name[np.maximum(pm, 0)] if len(many) else False, False)
    else:
        drop = np.ones(len(pm), dtype=bool)
    out = StepVector(
        labels, np.asarray(values, dtype=np.float64), mask, np.asarray(drop, dtype=bool)
    ).compact()
    if not one_to_one:
        out = consolidate(
            out, message="multiple matches for labels: grouping labels must ensure unique matches"
        )
    return out


def _pairs_general(
    many: StepVector,
    one: StepVector,
    many_sigs: list[Labels],
    one_sigs: list[Labels],
    one_groups: dict[Labels, list[int]],
    one_any: dict[Labels, BOOL],
    fill_many: float | None,
    fill_one: float | None,
    steps: int,
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], BOOL, F64, F64]:
    """(many rows, one rows, masks, many values, one values) of every pair, fill modifiers included:
    -1 stands for a side a fill synthesises (its value is the fill)."""
    pairs_many: list[int] = []
    pairs_one: list[int] = []
    masks: list[BOOL] = []
    for i, s in enumerate(many_sigs):
        for j in one_groups.get(s, ()):
            pairs_many.append(i)
            pairs_one.append(j)
            masks.append(many.present[i] & one.present[j])
        if fill_one is not None:
            missing = many.present[i] & ~one_any.get(s, np.zeros(steps, dtype=bool))
            if missing.any():
                pairs_many.append(i)
                pairs_one.append(-1)
                masks.append(missing)
    if fill_many is not None:
        many_any: dict[Labels, BOOL] = _presence_by_sig(many, many_sigs)
        for j, s in enumerate(one_sigs):
            missing = one.present[j] & ~many_any.get(s, np.zeros(steps, dtype=bool))
            if missing.any():
                pairs_many.append(-1)
                pairs_one.append(j)
                masks.append(missing)
    pm = np.asarray(pairs_many, dtype=np.intp)
    po = np.asarray(pairs_one, dtype=np.intp)
    if len(pm) == 0:
        empty = np.empty((0, steps))
        return pm, po, np.empty((0, steps), dtype=bool), empty, empty
    mask = np.array(masks, dtype=bool).reshape(len(pm), steps)
    many_vals = np.where(
        (pm >= 0)[:, None], many.values[np.maximum(pm, 0)] if len(many) else 0.0, fill_many or 0.0
    )
    one_vals = np.where(
        (po >= 0)[:, None], one.values[np.maximum(po, 0)] if len(one) else 0.0, fill_one or 0.0
    )
    return pm, po, mask, many_vals, one_vals


# ------------------------------------------------------------------------------ native histograms


def _arith(op: str, a: float, b: float) -> float:
    return float(ARITHMETIC[op](np.float64(a), np.float64(b)))


class ElemResult:
    """What one pair of samples gives under a binary operator (Prometheus' vectorElemBinop)."""

    __slots__ = ("f", "h", "info", "keep", "warn")

    def __init__(
        self, f: float, h: H | None, keep: bool, info: str | None = None, warn: str | None = None
    ) -> None:
        self.f, self.h, self.keep, self.info, self.warn = f, h, keep, info, warn


def elem_binop(op: str, lf: float, rf: float, lh: H | None, rh: H | None) -> ElemResult:
    """One pair: floats, float and histogram, or two histograms; ``keep`` False drops the pair.

    Raises :class:`Incompatible` for exponential and custom-bucket histograms added or subtracted.
    """
    if lh is None and rh is None:
        compare = OPERATORS[op].compare
        if compare is not None:
            return ElemResult(lf, None, compare(lf, rf))
        if op in TRIM_OPS:
            return ElemResult(0.0, None, False, info=incompatible_types("float", op, "float"))
        return ElemResult(_arith(op, lf, rf), None, True)
    if lh is None:
        assert rh is not None
        if op == "*":
            return ElemResult(0.0, hcompact(hmul(rh, lf)), True)
        return ElemResult(0.0, None, False, info=incompatible_types("float", op, "histogram"))
    if rh is None:
        if op == "*":
            return ElemResult(0.0, hcompact(hmul(lh, rf)), True)
        if op == "/":
            return ElemResult(0.0, hcompact(hdiv(lh, rf)), True)
        if op in TRIM_OPS:
            return ElemResult(0.0, lh.trim_buckets(rf, upper=op == "</"), True)
        return ElemResult(0.0, None, False, info=incompatible_types("histogram", op, "float"))
    if op == "+":
        res, collision, reconciled = hadd(lh, rh)
        return ElemResult(
            0.0,
            hcompact(res),
            True,
            info=reconciled_custom_buckets("addition") if reconciled else None,
            warn=counter_reset_collision("addition") if collision else None,
        )
    if op == "-":
        res, collision, reconciled = hsub(lh, rh)
        res.counter_reset_hint = GAUGE
        return ElemResult(
            0.0,
            hcompact(res),
            True,
            info=reconciled_custom_buckets("subtraction") if reconciled else None,
            warn=counter_reset_collision("subtraction") if collision else None,
        )
    if op == "==":
        return ElemResult(0.0, lh, hequals(lh, rh))
    if op == "!=":
        return ElemResult(0.0, lh, not hequals(lh, rh))
    return ElemResult(0.0, None, False, info=incompatible_types("histogram", op, "histogram"))


def _annotate_elem(ev: Evaluator, res: ElemResult, pos: PosRange) -> None:
    if res.info is not None:
        ev.annotate("info", res.info, pos)
    if res.warn is not None:
        ev.annotate("warning", res.warn, pos)


class _Builder:
    """Output rows of a histogram-bearing operation, keyed by labels, filled cell by cell."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.rows: dict[Labels, int] = {}
        self.labels: list[Labels] = []
        self.values: list[F64] = []
        self.present: list[BOOL] = []
        self.hists: list[OBJ] = []
        self.drop: list[bool] = []
        self.any_hist = False

    def row(self, labels: Labels, drop: bool) -> int:
        r = self.rows.get(labels)
        if r is None:
            r = self.rows[labels] = len(self.labels)
            self.labels.append(labels)
            self.values.append(np.zeros(self.steps))
            self.present.append(np.zeros(self.steps, dtype=bool))
            self.hists.append(np.full(self.steps, None, dtype=object))
            self.drop.append(drop)
        elif drop:
            self.drop[r] = True
        return r

    def filled(self, labels: Labels, j: int) -> bool:
        r = self.rows.get(labels)
        return r is not None and (bool(self.present[r][j]) or self.hists[r][j] is not None)

    def put(self, labels: Labels, j: int, f: float, h: H | None, drop: bool) -> None:
        r = self.row(labels, drop)
        if h is None:
            self.values[r][j] = f
            self.present[r][j] = True
        else:
            self.hists[r][j] = h
            self.any_hist = True

    def vector(self) -> StepVector:
        n = len(self.labels)
        if n == 0:
            return StepVector.empty(self.steps)
        return StepVector(
            self.labels,
            np.array(self.values).reshape(n, self.steps),
            np.array(self.present, dtype=bool).reshape(n, self.steps),
            np.array(self.drop, dtype=bool),
            None,
            object_cells(
                np.array(self.hists, dtype=object).reshape(n, self.steps) if self.any_hist else None
            ),
        )


def _hist_vector_scalar(
    ev: Evaluator, node: BinaryExpr, vec: StepVector, scalar: F64, swapped: bool
) -> StepVector:
    """``vec op scalar`` (or ``scalar op vec``) where ``vec`` holds histograms: Prometheus' VectorscalarBinop."""
    op = node.op
    columns = None if node.return_bool else sparse_times_scalar(vec, op, scalar, swapped)
    if columns is not None:
        return columns
    comparison = op in COMPARISON_OPS
    changes_schema = not comparison and op not in TRIM_OPS
    out = _Builder(vec.values.shape[1])
    hists = vec.hist_objects()
    for j in range(vec.values.shape[1]):
        s = float(scalar[j])
        for i in range(len(vec)):
            h = hists[i, j] if hists is not None else None
            if h is None and not vec.present[i, j]:
                continue
            f = float(vec.values[i, j])
            lf, rf, lh, rh = (s, f, None, h) if swapped else (f, s, h, None)
            res = elem_binop(op, lf, rf, lh, rh)
            if res.info is not None or res.warn is not None:
                _annotate_elem(ev, res, node.pos)
                if not res.keep and (lh is not None or rh is not None):
                    continue
            value, hist = res.f, res.h
            if comparison and swapped:
                value, hist = rf, rh
            keep = res.keep
            if node.return_bool:
                value, hist, keep = (1.0 if res.keep else 0.0), None, True
            if keep:
                drop = bool(vec.drop_name[i]) or changes_schema or node.return_bool
                out.put(vec.labels[i], j, value, hist, drop)
    return out.vector()


def sparse_times_scalar(vec: StepVector, op: str, scalar: F64, swapped: bool) -> StepVector | None:
    """``x * s``, ``s * x`` and ``x / s`` of a vector holding only histogram cells that scale
    where they are (a selector's columns: ``Hists.scaled``); no annotations arise. None (the
    per-cell path) for float samples, cells that do not scale so, or another operator."""
    if vec.hists is None or vec.present.any():
        return None
    scaled = vec.hists.scaled(op, scalar, swapped)
    if scaled is None:
        return None
    shape = vec.values.shape
    return StepVector(
        vec.labels, np.zeros(shape), np.zeros(shape, dtype=bool), np.ones(len(vec), dtype=bool), None, scaled
    ).compact()


def _hist_set_op(op: str, lhs: StepVector, rhs: StepVector, matching: VectorMatching) -> StepVector:
    """``and``/``or``/``unless`` over vectors of either sample kind (presence is what counts)."""

    sig = signature_fn(matching)
    steps = lhs.values.shape[1] if len(lhs) else rhs.values.shape[1]
    none = np.zeros(steps, dtype=bool)
    l_all, r_all = lhs.any_present(), rhs.any_present()

    def by_sig(vec: StepVector, present: BOOL) -> dict[Labels, BOOL]:
        acc: dict[Labels, BOOL] = {}
        for lb, p in zip(vec.labels, present, strict=True):
            key = sig(lb)
            acc[key] = p.copy() if key not in acc else acc[key] | p
        return acc

    if op == "or":
        l_any = by_sig(lhs, l_all)
        keep = np.array([~l_any.get(sig(lb), none) for lb in rhs.labels], dtype=bool).reshape(r_all.shape)
        right = rhs.where(keep).compact()
        lh = lhs.hist_objects()
        rh = right.hist_objects()
        if lh is None:
            lh = np.full(lhs.values.shape, None, dtype=object)
        if rh is None:
            rh = np.full(right.values.shape, None, dtype=object)
        return StepVector(
            lhs.labels + right.labels,
            np.concatenate([lhs.values, right.values]),
            np.concatenate([lhs.present, right.present]),
            np.concatenate([lhs.drop_name, right.drop_name]),
            None,
            object_cells(np.concatenate([lh, rh])),
        )
    r_any = by_sig(rhs, r_all)
    if op == "and":
        keep = np.array([r_any.get(sig(lb), none) for lb in lhs.labels], dtype=bool)
    else:
        keep = np.array([~r_any.get(sig(lb), none) for lb in lhs.labels], dtype=bool)
    return lhs.where(keep.reshape(l_all.shape)).compact()


def _hist_vector_vector(
    ev: Evaluator, node: BinaryExpr, lhs: StepVector, rhs: StepVector, matching: VectorMatching
) -> StepVector:
    """Arithmetic or comparison between vectors holding histograms: Prometheus' VectorBinop, step by step."""

    op = node.op
    comparison = op in COMPARISON_OPS
    keeps_name = (comparison or op in TRIM_OPS) and not node.return_bool
    swapped = matching.card == "one-to-many"
    many, one = (rhs, lhs) if swapped else (lhs, rhs)
    one_to_one = matching.card == "one-to-one"
    include = frozenset(matching.include)
    sig = signature_fn(matching)
    steps = lhs.values.shape[1] if len(lhs) else rhs.values.shape[1]
    m_all, o_all = many.any_present(), one.any_present()
    many_sigs = [sig(lb) for lb in many.labels]
    one_sigs = [sig(lb) for lb in one.labels]
    out = _Builder(steps)
    cache: dict[tuple[Labels, Labels], Labels] = {}

    many_h, one_h = many.hist_objects(), one.hist_objects()

    def sample(vec: StepVector, hists: OBJ | None, i: int, j: int) -> tuple[float, H | None]:
        return float(vec.values[i, j]), None if hists is None else hists[i, j]

    for j in range(steps):
        right: dict[Labels, int] = {}
        for r in np.flatnonzero(o_all[:, j]).tolist():
            s = one_sigs[r]
            if s in right:
                a, b = sorted((one.labels[r], one.labels[right[s]]))
                side = "left" if swapped else "right"
                raise KqlEvaluationError(
                    f"found duplicate series for the match group {labels_to_str(s)} on the {side} hand-side of "
                    f"the operation: [{labels_to_str(a)}, {labels_to_str(b)}];many-to-many matching not allowed: "
                    "matching labels must be unique on one side"
                )
            right[s] = r
        matched_one: set[Labels] = set()
        matched_many: dict[Labels, set[Labels]] = {}
        for i in np.flatnonzero(m_all[:, j]).tolist():
            s = many_sigs[i]
            found = right.get(s)
            if found is None:
                continue
            k = found
            mf, mh = sample(many, many_h, i, j)
            of, oh = sample(one, one_h, k, j)
            lf, rf, lh, rh = (of, mf, oh, mh) if swapped else (mf, of, mh, oh)
            try:
                res = elem_binop(op, lf, rf, lh, rh)
            except Incompatible:
                ev.annotate("warning", incompatible_bucket_layout(op), node.pos)
                continue
            if res.info is not None or res.warn is not None:
                _annotate_elem(ev, res, node.pos)
                # An incompatible pair and a counter-reset collision drop the pair (Prometheus
                # returns them as the pair's error); reconciled custom buckets keep it.
                if res.warn is not None or not res.keep:
                    continue
            value, hist = res.f, res.h
            if node.return_bool:
                value, hist = (1.0 if res.keep else 0.0), None
            many_labels, one_labels = many.labels[i], one.labels[k]
            if not one_to_one and not include:
                metric = many_labels
            else:
                key = (many_labels, one_labels)
                metric = cache.get(key) or cache.setdefault(
                    key, _result_labels(many_labels, one_labels, matching, one_to_one, include)
                )
            if one_to_one:
                if s in matched_one:
                    raise KqlEvaluationError(
                        "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)"
                    )
                matched_one.add(s)
            else:
                seen = matched_many.setdefault(s, set())
                if metric in seen:
                    raise KqlEvaluationError(
                        "multiple matches for labels: grouping labels must ensure unique matches"
                    )
                seen.add(metric)
            if not res.keep and not node.return_bool:
                continue
            drop = bool(many.drop_name[i]) if keeps_name else True
            out.put(metric, j, value, hist, drop)
    return out.vector()


def histogram_binary(ev: Evaluator, node: BinaryExpr, lhs: Operand, rhs: Operand) -> Operand:
    """``binary_op`` for operands of which at least one vector holds histogram samples."""

    if isinstance(lhs, StepVector):
        if isinstance(rhs, StepVector):
            matching = node.matching or VectorMatching()
            if node.op in SET_OPS:
                return _hist_set_op(node.op, lhs, rhs, matching)
            return _hist_vector_vector(ev, node, lhs, rhs, matching)
        return _hist_vector_scalar(ev, node, lhs, rhs, swapped=False)
    if isinstance(rhs, StepVector):
        return _hist_vector_scalar(ev, node, rhs, lhs, swapped=True)
    raise TypeError("histogram_binary: neither operand is a vector")  # evaluate_binary rules it out
