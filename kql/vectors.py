"""Row operations on step vectors shared by the engine, binary operators and functions."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from kernel_insight.kql.errors import KqlEvaluationError
from kernel_insight.kql.histcells import object_cells
from kernel_insight.kql.storage import Labels
from kernel_insight.kql.values import StepVector, drop_name, hist_mask

__all__ = ["DUPLICATE_LABELSET", "LabelsMemo", "consolidate", "finalize_names", "group_rows"]

DUPLICATE_LABELSET = "vector cannot contain metrics with the same labelset"
_T = TypeVar("_T")


class LabelsMemo(Generic[_T]):
    """What is worked out from series' label sets alone (an aggregation's groups, a join's pairs),
    remembered per (spec, label lists): rules and dashboards ask the same expression over the same
    series at every evaluation, and the head hands out the same label-set objects each time
    (collector/head.py), so the per-series Python work of grouping and matching is done once.

    An entry is found by the lists' lengths and the identities of their ends, and used only when
    the lists are equal to the ones it was made from (a C loop over identical objects, cheap),
    so an answer never depends on what is remembered. Forgotten all at once when full.
    """

    def __init__(self, size: int = 512) -> None:
        self._size = size
        self._entries: dict[Hashable, tuple[tuple[list[Labels], ...], _T]] = {}

    @staticmethod
    def _key(spec: Hashable, lists: tuple[list[Labels], ...]) -> Hashable:
        return (spec, *((len(x), id(x[0]), id(x[-1])) if x else (0, 0, 0) for x in lists))

    def get(self, spec: Hashable, *lists: list[Labels]) -> _T | None:
        hit = self._entries.get(self._key(spec, lists))
        if hit is None or any(a != b for a, b in zip(hit[0], lists, strict=True)):
            return None
        return hit[1]

    def put(self, spec: Hashable, lists: tuple[list[Labels], ...], value: _T) -> _T:
        if len(self._entries) >= self._size:
            self._entries.clear()
        self._entries[self._key(spec, lists)] = (tuple(list(x) for x in lists), value)
        return value


def group_rows(keys: Sequence[Hashable]) -> tuple[npt.NDArray[np.intp], int]:
    """Dense group ids for a list of keys, numbered in order of first appearance."""
    ids: dict[Hashable, int] = {}
    out = np.fromiter((ids.setdefault(k, len(ids)) for k in keys), dtype=np.intp, count=len(keys))
    return out, len(ids)


def consolidate(
    vec: StepVector,
    key: Callable[[Labels], Labels] | None = None,
    message: str = DUPLICATE_LABELSET,
) -> StepVector:
    """Merge rows whose (keyed) labels are equal; raise if two of them are present at the same step.

    With ``key`` the rows take the keyed labels (``finalize_names`` passes the name-dropping key).
    """
    labels = [key(lb) for lb in vec.labels] if key is not None else vec.labels
    # Nearly always no two rows share labels: a set (hashing in C) tells so at a third of the
    # cost of numbering the rows (every instant answer of 200 series asked this).
    if len(set(labels)) == len(labels):
        if key is None:
            return vec
        return StepVector(labels, vec.values, vec.present, vec.drop_name, vec.sample_ts, vec.hists)
    gid, n = group_rows(labels)
    counts = np.zeros((n, vec.present.shape[1]), dtype=np.int64)
    objs = vec.hist_objects()
    hmask = None if objs is None else hist_mask(objs)
    np.add.at(counts, gid, vec.present if hmask is None else vec.present | hmask)
    if (counts > 1).any():
        raise KqlEvaluationError(message)
    first = np.full(n, -1, dtype=np.intp)
    for i, g in enumerate(gid):
        if first[g] < 0:
            first[g] = i
    values = np.zeros((n, vec.present.shape[1]))
    present = np.zeros((n, vec.present.shape[1]), dtype=bool)
    drop = np.zeros(n, dtype=bool)
    sample_ts = None if vec.sample_ts is None else np.zeros((n, vec.present.shape[1]), dtype=np.int64)
    hists = None if objs is None else np.full((n, vec.present.shape[1]), None, dtype=object)
    for i, g in enumerate(gid):
        p = vec.present[i]
        values[g, p] = vec.values[i, p]
        present[g] |= p
        drop[g] |= vec.drop_name[i]
        if sample_ts is not None and vec.sample_ts is not None:
            sample_ts[g, p] = vec.sample_ts[i, p]
        if hmask is not None and hists is not None and objs is not None:
            hists[g, hmask[i]] = objs[i, hmask[i]]
            if sample_ts is not None and vec.sample_ts is not None:
                sample_ts[g, hmask[i]] = vec.sample_ts[i, hmask[i]]
    return StepVector([labels[i] for i in first], values, present, drop, sample_ts, object_cells(hists))


def finalize_names(vec: StepVector) -> StepVector:
    """Apply delayed name removal: drop ``__name__`` where flagged, then merge equal label sets."""
    if not vec.drop_name.any():
        return consolidate(vec)
    labels = [drop_name(lb) if d else lb for lb, d in zip(vec.labels, vec.drop_name.tolist(), strict=True)]
    out = StepVector(
        labels, vec.values, vec.present, np.zeros(len(labels), dtype=bool), vec.sample_ts, vec.hists
    )
    return consolidate(out)
