"""Binary operators: arithmetic, comparisons, set operators and vector matching, over all steps at once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kernel_insight.kql.ast import BinaryExpr, VectorMatching
from kernel_insight.kql.errors import KqlEvaluationError
from kernel_insight.kql.operators import ARITHMETIC as ARITH
from kernel_insight.kql.operators import COMPARISON, OPERATORS
from kernel_insight.kql.parser import COMPARISON_OPS, SET_OPS
from kernel_insight.kql.storage import Labels
from kernel_insight.kql.values import StepVector, labels_to_str
from kernel_insight.kql.vectors import LabelsMemo, consolidate

__all__ = ["ARITHMETIC", "COMPARE", "binary_op"]

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


def _apply(op: str, lhs: Any, rhs: Any) -> Any:
    if op in ARITHMETIC:
        return ARITHMETIC[op](lhs, rhs)
    return COMPARE[op](lhs, rhs)


def binary_op(node: BinaryExpr, lhs: Any, rhs: Any) -> Any:
    """Evaluate ``lhs op rhs`` where each side is a scalar array (steps,) or a StepVector."""
    op = node.op
    l_vec, r_vec = isinstance(lhs, StepVector), isinstance(rhs, StepVector)
    if not l_vec and not r_vec:
        result = _apply(op, lhs, rhs)
        return result.astype(np.float64) if op in COMPARE else result
    if l_vec and r_vec:
        matching = node.matching or _DEFAULT_MATCHING
        if op in SET_OPS:
            return _set_op(op, lhs, rhs, matching)
        return _vector_vector(node, lhs, rhs, matching)
    if l_vec:
        return _vector_scalar(node, lhs, rhs, swapped=False)
    return _vector_scalar(node, rhs, lhs, swapped=True)


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
