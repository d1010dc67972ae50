"""The histogram cells of a :class:`~kernel_insight.kql.values.StepVector`: one typed interface
(:class:`Hists`) over the three forms cells are held in.

- :class:`ObjectCells`: a ``FloatHistogram`` (or None) per cell, the reference form.
- :class:`~kernel_insight.kql.histdense.DenseHists`: dense bucket blocks (rate's and sum's results).
- :class:`SparseCells`: a store's columns (an instant selector's cells).

Every form answers the same operations (:class:`CellForm`); :class:`Hists` holds one or more
forms whose cells are disjoint and answers for all of them, so the evaluator never asks which
form it holds. Nothing here changes after it is made: a conversion (:meth:`Hists.objects`,
:meth:`Hists.take`, :meth:`Hists.where`) returns a new value. The dense and column forms are
the fast paths; each operation's object form is the reference path they are tested against bit
for bit (tests/kql/test_columnar_histograms.py, test_hist_cells.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from kernel_insight.kql.histdense import (
    DenseBlock,
    DenseHists,
    chunked_cells,
    dense_sum,
    single_members,
    sparse_sum,
)
from kernel_insight.kql.histogram import GAUGE_TYPE as GAUGE
from kernel_insight.kql.histsamples import BOOL, F64, I64, OBJ, H, Totals, safe_divide
from kernel_insight.kql.sparsehists import Ragged, SparseHists, renumbering
from kernel_insight.kql.values import hist_mask, hist_weight

if TYPE_CHECKING:
    from kernel_insight.kql.values import CallContext

__all__ = ["CellForm", "DenseFn", "Hists", "ObjectCells", "OneFn", "SparseCells", "object_cells"]

#: A fast path's float per cell of a whole block (its steps' arguments, the block): the floats
#: and which rows it decided (the others go to the per-histogram path).
DenseFn = Callable[[I64, DenseBlock], tuple[F64, BOOL]]
#: The per-histogram path: (row, step, histogram) -> float.
OneFn = Callable[[int, int, H], float]
#: What an aggregation's sum/avg of histogram cells gives: the sums, and whether counter-reset
#: hints collided in some group.
Summed = tuple[DenseHists, bool]


class CellForm(Protocol):
    """What every form of histogram cells answers. Cells are addressed by (row, step)."""

    def coords(self) -> tuple[I64, I64]:
        """The (rows, steps) of every cell held."""
        ...

    def fill(self, out: OBJ) -> None:
        """Put every cell's ``FloatHistogram`` into ``out`` (a new array the caller made)."""
        ...

    def weight(self) -> int:
        """What the cells count as toward ``max_samples`` (their ``sample_weight``s)."""
        ...

    def regrouped(self, new_of_old: I64, rows: int, drop: BOOL | None = None) -> CellForm:
        """The cells moved to rows ``new_of_old[row]`` (of ``rows``); cells whose new row is -1,
        or where ``drop[new row, step]``, are left out."""
        ...

    def single(self, gid: npt.NDArray[np.intp], n: int, mixed: BOOL) -> CellForm | None:
        """sum/avg where each (group, step) not in ``mixed`` holds at most one cell: each cell
        moved to its group's row, as the sum of one histogram is (compacted); None when some
        group holds several."""
        ...

    def summed(self, gid: npt.NDArray[np.intp], n: int, steps: int, mixed: BOOL, mean: bool) -> Summed | None:
        """sum/avg per (group, step) of the cells outside ``mixed``, in Prometheus' order; None
        when this form cannot (too few cells, mixed layouts: the objects decide then)."""
        ...

    def floats(self, fn: Callable[[H], float], totals_fn: Callable[[Totals], F64] | None) -> F64:
        """A float per cell (in :meth:`coords` order): ``totals_fn`` of whole blocks' counts and
        sums where the form has them, ``fn`` of each histogram otherwise."""
        ...

    def search(self, ctx: CallContext, values: F64, present: BOOL, dense_fn: DenseFn, one: OneFn) -> None:
        """Write a float of every cell into ``values`` (and True into ``present``): ``dense_fn``
        over blocks of cells sharing a layout, ``one`` per histogram for what it leaves."""
        ...

    def scaled(self, op: str, factor: F64, swapped: bool) -> CellForm | None:
        """``h * f``, ``f * h`` or ``h / f`` of every cell (``factor`` per step) without making
        objects, as ``elem_binop`` and Compact(0) give it; None where this form cannot."""
        ...


@dataclass(frozen=True, slots=True, eq=False)
class ObjectCells:
    """Cells as ``FloatHistogram`` objects: ``hists[i, j]`` or None. The array is never written
    after the cells are made (every operation returns new arrays)."""

    hists: OBJ

    def coords(self) -> tuple[I64, I64]:
        rows, steps = np.nonzero(hist_mask(self.hists))
        return rows.astype(np.int64), steps.astype(np.int64)

    def fill(self, out: OBJ) -> None:
        mask = hist_mask(self.hists)
        out[mask] = self.hists[mask]

    def weight(self) -> int:
        return hist_weight(self.hists)

    def regrouped(self, new_of_old: I64, rows: int, drop: BOOL | None = None) -> ObjectCells:
        old_rows, steps = self.coords()
        new = new_of_old[old_rows]
        keep = new >= 0
        if drop is not None:
            keep[keep] = ~drop[new[keep], steps[keep]]
        out: OBJ = np.full((rows, self.hists.shape[1]), None, dtype=object)
        out[new[keep], steps[keep]] = self.hists[old_rows[keep], steps[keep]]
        return ObjectCells(out)

    def single(self, gid: npt.NDArray[np.intp], n: int, mixed: BOOL) -> ObjectCells | None:
        moved = single_members(self.hists, gid, n, mixed)
        return None if moved is None else ObjectCells(moved)

    def summed(self, gid: npt.NDArray[np.intp], n: int, steps: int, mixed: BOOL, mean: bool) -> Summed | None:
        return dense_sum(self.hists, gid, n, mixed, mean)

    def floats(self, fn: Callable[[H], float], totals_fn: Callable[[Totals], F64] | None) -> F64:
        rows, steps = self.coords()
        return np.array([fn(h) for h in self.hists[rows, steps].tolist()], dtype=np.float64)

    def search(self, ctx: CallContext, values: F64, present: BOOL, dense_fn: DenseFn, one: OneFn) -> None:
        rows, steps = self.coords()
        hs = self.hists[rows, steps].tolist()
        chunked_cells(
            ctx,
            rows,
            steps,
            values,
            present,
            dense_fn,
            one,
            lambda a, b: DenseBlock.of(hs[a:b]),
            lambda rest: [hs[k] for k in rest.tolist()],
        )

    def scaled(self, op: str, factor: F64, swapped: bool) -> None:
        return None


class SparseCells:
    """Cells as a store's columns: row ``k`` of ``data`` (hints decided, none pending) is the
    histogram of cell ``(rows[k], steps[k])``. An instant selector over a columnar read leaves
    its cells so."""

    __slots__ = ("data", "rows", "steps")

    def __init__(self, data: SparseHists, rows: I64, steps: I64) -> None:
        self.data, self.rows, self.steps = data, rows, steps

    @classmethod
    def at(cls, data: SparseHists, idx: I64, shown: BOOL) -> SparseCells:
        """The cells where ``shown``, cell ``(i, j)`` holding row ``idx[i, j]`` of ``data``;
        staleness markers are no cell."""
        rows, steps = np.nonzero(shown)
        sel = idx[rows, steps]
        live = ~data.stale()[sel]
        if not live.all():
            rows, steps, sel = rows[live], steps[live], sel[live]
        return cls(data.select(sel), rows.astype(np.int64), steps.astype(np.int64))

    def __len__(self) -> int:
        return len(self.rows)

    def coords(self) -> tuple[I64, I64]:
        return self.rows, self.steps

    def fill(self, out: OBJ) -> None:
        out[self.rows, self.steps] = self.data.objects()

    def weight(self) -> int:
        return int(self.data.weights().sum())

    def _kept(self, keep: BOOL, rows: I64) -> SparseCells:
        if keep.all():
            return SparseCells(self.data, rows, self.steps)
        idx = np.flatnonzero(keep)
        return SparseCells(self.data.take(idx), rows[idx], self.steps[idx])

    def regrouped(self, new_of_old: I64, rows: int, drop: BOOL | None = None) -> SparseCells:
        new = new_of_old[self.rows]
        keep = new >= 0
        if drop is not None:
            keep[keep] = ~drop[new[keep], self.steps[keep]]
        return self._kept(keep, new)

    def single(self, gid: npt.NDArray[np.intp], n: int, mixed: BOOL) -> CellForm | None:
        """Each cell moved to its group's row, still columns, each member holding a bucket of 0
        compacted as the sum's Compact(0) does."""
        steps = mixed.shape[1]
        keep = ~mixed[gid[self.rows], self.steps]
        rows = np.asarray(gid, dtype=np.int64)[self.rows]
        target = rows[keep] * steps + self.steps[keep]
        if len(target) and np.bincount(target).max() > 1:
            return None
        moved = self._kept(keep, rows)
        compact = moved.data.compacted()
        if compact is not None:
            return SparseCells(compact, moved.rows, moved.steps)
        objects: OBJ = np.full((len(gid), steps), None, dtype=object)  # the rows can't compact so
        self.fill(objects)
        return ObjectCells(objects).single(gid, n, mixed)

    def summed(self, gid: npt.NDArray[np.intp], n: int, steps: int, mixed: BOOL, mean: bool) -> Summed | None:
        return sparse_sum(self.data, self.rows, self.steps, gid, n, steps, mixed, mean)

    def floats(self, fn: Callable[[H], float], totals_fn: Callable[[Totals], F64] | None) -> F64:
        if totals_fn is not None:
            return totals_fn(self.data)
        return np.array([fn(h) for h in self.data.objects().tolist()], dtype=np.float64)

    def search(self, ctx: CallContext, values: F64, present: BOOL, dense_fn: DenseFn, one: OneFn) -> None:
        order = np.lexsort((self.steps, self.rows))  # row by row, as the objects' cells come
        data = self.data.take(order)
        chunked_cells(
            ctx,
            self.rows[order],
            self.steps[order],
            values,
            present,
            dense_fn,
            one,
            lambda a, b: DenseBlock.of_sparse(data.rows(a, b)),
            lambda rest: list(data.take(rest).objects()),
        )

    def scaled(self, op: str, factor: F64, swapped: bool) -> SparseCells | None:
        """Every count and the sum scaled as ``FloatHistogram.mul``/``div`` do it (the same
        operand order, a negative factor making a gauge, ``_safe_div``'s NaN), then
        ``Compact(0)`` of every row; None for another operator or a division by 0 (which drops
        every bucket)."""
        if not (op == "*" or (op == "/" and not swapped)):
            return None
        data = self.data
        f = np.asarray(factor, dtype=np.float64)[self.steps]
        if op == "/" and (f == 0).any():
            return None

        def scaled(x: F64, per_row: F64) -> F64:
            if op == "*":
                out: F64 = x * per_row
                return out
            return safe_divide(x, per_row)

        def bucket_scaled(buckets: Ragged) -> Ragged:
            per = np.repeat(f, buckets.lengths)
            flat = per * buckets.flat if op == "*" else buckets.flat / per  # f*x as mul, x/s as div
            return Ragged(buckets.off, flat)

        hint = np.where(f < 0, GAUGE, data.hints())
        out = SparseHists(
            data.schema,
            data.zero_threshold,
            scaled(data.zero_count, f),
            scaled(data.count, f),
            scaled(data.sum, f),
            hint,
            np.zeros(len(data), dtype=bool),
            data.pos_spans,
            bucket_scaled(data.pos_buckets),
            data.neg_spans,
            bucket_scaled(data.neg_buckets),
            data.custom,
        )
        compact = out.compacted(every_row=True)
        return None if compact is None else SparseCells(compact, self.rows, self.steps)


@dataclass(frozen=True, slots=True, eq=False)
class Hists:
    """The histogram cells of a step vector of ``shape`` (rows, steps): one or more forms, their
    cells disjoint. Floats are never cells here (``StepVector.present`` covers them)."""

    shape: tuple[int, int]
    parts: tuple[CellForm, ...]

    @classmethod
    def of(
        cls,
        shape: tuple[int, int],
        objects: OBJ | None = None,
        dense: DenseHists | None = None,
        sparse: SparseCells | None = None,
    ) -> Hists | None:
        """The cells held in these forms (each None when absent); None when all are."""
        parts: list[CellForm] = [p for p in (dense, sparse) if p is not None]
        if objects is not None:
            parts.append(ObjectCells(objects))
        return cls(shape, tuple(parts)) if parts else None

    def mask(self) -> BOOL:
        """Where a cell is (a new array)."""
        out = np.zeros(self.shape, dtype=bool)
        for part in self.parts:
            rows, steps = part.coords()
            out[rows, steps] = True
        return out

    def weight(self) -> int:
        """What the cells count as toward ``max_samples``."""
        return sum(part.weight() for part in self.parts)

    def objects(self) -> OBJ:
        """Every cell as a ``FloatHistogram`` (None elsewhere): a new array the caller owns."""
        out: OBJ = np.full(self.shape, None, dtype=object)
        for part in self.parts:
            part.fill(out)
        return out

    def as_objects(self) -> Hists:
        """The same cells held as objects (for a vector read cell by cell many times)."""
        return Hists(self.shape, (ObjectCells(self.objects()),))

    def _regrouped(self, new_of_old: I64, rows: int, drop: BOOL | None = None) -> Hists:
        parts = tuple(part.regrouped(new_of_old, rows, drop) for part in self.parts)
        return Hists((rows, self.shape[1]), parts)

    def take(self, idx: npt.NDArray[np.intp]) -> Hists:
        """The cells of rows ``idx``, in that order (``StepVector.take``)."""
        new_of_old = renumbering(idx, self.shape[0])
        if new_of_old is None:  # a row taken twice: a cell in two rows, which only objects can be
            return Hists((len(idx), self.shape[1]), (ObjectCells(self.objects()[idx]),))
        return self._regrouped(new_of_old, len(idx))

    def where(self, keep: BOOL) -> Hists:
        """The cells where ``keep``."""
        return self._regrouped(np.arange(self.shape[0], dtype=np.int64), self.shape[0], ~keep)

    def single(self, gid: npt.NDArray[np.intp], n: int, mixed: BOOL) -> Hists | None:
        """:meth:`CellForm.single` of all the cells: None when some (group, step) outside
        ``mixed`` holds several cells of any forms."""
        steps = self.shape[1]
        if len(self.parts) > 1:
            coords = [part.coords() for part in self.parts]
            rows = np.concatenate([r for r, _ in coords])
            cols = np.concatenate([c for _, c in coords])
            keep = ~mixed[gid[rows], cols]
            target = gid[rows[keep]] * steps + cols[keep]
            if len(target) and np.bincount(target, minlength=n * steps).max() > 1:
                return None
        parts = []
        for part in self.parts:
            moved = part.single(gid, n, mixed)
            if moved is None:
                return None
            parts.append(moved)
        return Hists((n, steps), tuple(parts))

    def summed(self, gid: npt.NDArray[np.intp], n: int, mixed: BOOL, mean: bool) -> tuple[Hists, bool] | None:
        """sum/avg per (group, step) by a fast path (the sums and whether counter-reset hints
        collided); None when none applies (then the caller adds objects one by one)."""
        steps = self.shape[1]
        got = self.parts[0].summed(gid, n, steps, mixed, mean) if len(self.parts) == 1 else None
        if got is None and not (len(self.parts) == 1 and isinstance(self.parts[0], ObjectCells)):
            got = dense_sum(self.objects(), gid, n, mixed, mean)
        if got is None:
            return None
        dense, collision = got
        return Hists((n, steps), (dense,)), collision

    def floats(self, fn: Callable[[H], float], totals_fn: Callable[[Totals], F64] | None = None) -> Floats:
        """A float of every cell (:meth:`CellForm.floats`): rows, steps and values."""
        rows, steps, values = [], [], []
        for part in self.parts:
            r, s = part.coords()
            rows.append(r)
            steps.append(s)
            values.append(part.floats(fn, totals_fn))
        if not rows:
            return Floats(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0))
        return Floats(np.concatenate(rows), np.concatenate(steps), np.concatenate(values))

    def search(self, ctx: CallContext, dense_fn: DenseFn, one: OneFn) -> tuple[F64, BOOL]:
        """:meth:`CellForm.search` of every form: the floats and where they are."""
        values = np.zeros(self.shape)
        present = np.zeros(self.shape, dtype=bool)
        for part in self.parts:
            part.search(ctx, values, present, dense_fn, one)
        return values, present

    def scaled(self, op: str, factor: F64, swapped: bool) -> Hists | None:
        """:meth:`CellForm.scaled` of cells held in one form; None where it cannot."""
        if len(self.parts) != 1:
            return None
        moved = self.parts[0].scaled(op, factor, swapped)
        return None if moved is None else Hists(self.shape, (moved,))


@dataclass(frozen=True, slots=True)
class Floats:
    """A float of each cell: ``values[k]`` belongs to cell ``(rows[k], steps[k])``."""

    rows: I64
    steps: I64
    values: F64


def object_cells(hists: OBJ | None) -> Hists | None:
    """Cells held as the object array ``hists`` (None: no histogram cells)."""
    return None if hists is None else Hists((hists.shape[0], hists.shape[1]), (ObjectCells(hists),))
