"""kql.histcells: one interface over the three forms a step vector's histogram cells are held in
(objects, dense blocks, a store's columns). Every operation of every form gives the bits of the
same cells held as objects (the reference path), nothing that reads cells changes them, and no
module outside the cell forms asks which form it holds."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_columnar_histograms import _series

from kernel_insight.kql import histdense
from kernel_insight.kql import histogram as nh
from kernel_insight.kql.histcells import Hists, ObjectCells, SparseCells, object_cells
from kernel_insight.kql.histdense import DenseBlock, DenseHists, dense_quantiles
from kernel_insight.kql.histogram import FloatHistogram
from kernel_insight.kql.sparsehists import SparseHists
from kernel_insight.kql.values import StepVector

KQL = Path(__file__).resolve().parents[2] / "kql"


class _Ctx:
    """What ``search`` asks of a call context: a checkpoint."""

    def check(self) -> None:
        pass


def _grid(seed: int) -> tuple[np.ndarray, np.random.Generator]:
    """Histogram cells of one layout family (so every form can hold them) on a random grid."""
    rng = np.random.default_rng(seed)
    rows, steps = int(rng.integers(1, 7)), int(rng.integers(1, 9))
    hs = [v for _, v in _series(rng, rows * steps * 2, odd_counts=False) if isinstance(v, FloatHistogram)]
    hs = [dataclasses.replace(h, schema=3, zero_threshold=1e-3) for h in hs]
    out = np.full((rows, steps), None, dtype=object)
    where = rng.random((rows, steps)) < 0.7
    cells = np.flatnonzero(where)[: len(hs)]
    flat = out.reshape(-1)
    for k, c in enumerate(cells.tolist()):
        flat[c] = hs[k]
    return out, rng


def _forms(objs: np.ndarray, rng: np.random.Generator) -> dict[str, Hists]:
    """The cells of ``objs`` held as objects, as columns, as a dense block, and half dense half objects."""
    shape = (objs.shape[0], objs.shape[1])
    rows, steps = np.nonzero(objs != None)  # noqa: E711 (elementwise)
    rows, steps = rows.astype(np.int64), steps.astype(np.int64)
    hs = objs[rows, steps].tolist()
    out: dict[str, Hists] = {"objects": object_cells(objs)}  # type: ignore[dict-item]
    if not hs:
        return out
    out["columns"] = Hists(shape, (SparseCells(SparseHists.of_objects(hs), rows, steps),))
    of_objects = DenseBlock.of(hs)
    assert of_objects is not None
    # Dense cells are computed rows (rate's, sum's): a block of arrays, a bucket of 0 an absent one.
    block = of_objects.take(np.arange(len(hs)))
    out["dense"] = Hists(shape, (DenseHists([(block, rows, steps, nh.NOT_COUNTER_RESET)]),))
    half = rng.random(len(hs)) < 0.5
    if half.any() and (~half).any():
        dense_part = DenseHists(
            [(block.take(np.flatnonzero(half)), rows[half], steps[half], nh.NOT_COUNTER_RESET)]
        )
        rest = np.full(shape, None, dtype=object)
        rest[rows[~half], steps[~half]] = objs[rows[~half], steps[~half]]
        out["dense and objects"] = Hists.of(shape, objects=rest, dense=dense_part)  # type: ignore[assignment]
    return out


def _text(objs: np.ndarray | None) -> list[str]:
    """Every cell's exact text (count, sum, buckets, hint): equal texts are equal bits here."""
    if objs is None:
        return []
    return [
        repr(h) if h is None else f"{h!s} {h.counter_reset_hint} {h.count.hex()} {h.sum.hex()}"
        for h in objs.ravel()
    ]


def _bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x, dtype=np.float64).tobytes()


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_every_form_answers_as_its_objects(seed: int) -> None:
    objs, rng = _grid(seed)
    n, steps = objs.shape
    for name, cells in _forms(objs, rng).items():
        ref = object_cells(cells.objects())
        assert ref is not None
        assert np.array_equal(cells.mask(), ref.mask()), name
        assert cells.weight() == ref.weight(), name
        idx = rng.integers(0, n, int(rng.integers(0, 2 * n + 1))).astype(np.intp)  # rows taken twice too
        assert _text(cells.take(idx).objects()) == _text(ref.take(idx).objects()), name
        keep = rng.random((n, steps)) < 0.5
        assert _text(cells.where(keep).objects()) == _text(ref.where(keep).objects()), name
        groups = int(rng.integers(1, n + 1))
        gid = rng.integers(0, groups, n).astype(np.intp)
        mixed = rng.random((groups, steps)) < 0.2
        got, want = cells.single(gid, groups, mixed), ref.single(gid, groups, mixed)
        assert (got is None) == (want is None), name
        if got is not None and want is not None:
            assert _text(got.objects()) == _text(want.objects()), name
        for totals in (None, lambda b: b.count):
            f, r = cells.floats(lambda h: float(h.count), totals), ref.floats(lambda h: float(h.count), None)
            order_f, order_r = np.lexsort((f.steps, f.rows)), np.lexsort((r.steps, r.rows))
            assert _bits(f.values[order_f]) == _bits(r.values[order_r]), name
        q = rng.random(steps)
        q[rng.random(steps) < 0.2] = float(rng.choice([0.0, 1.0, -0.5, 1.5]))

        def one(i: int, j: int, h: FloatHistogram, q: np.ndarray = q) -> float:
            return float(nh.histogram_quantile(float(q[j]), h)[0])

        def quantiles(s: np.ndarray, b: DenseBlock, q: np.ndarray = q) -> tuple[np.ndarray, np.ndarray]:
            return dense_quantiles(q[s], b)

        def none_decided(s: np.ndarray, block: DenseBlock) -> tuple[np.ndarray, np.ndarray]:
            return np.zeros(len(s)), np.zeros(len(s), dtype=bool)  # every cell to the reference

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(histdense, "DENSE_MIN_CELLS", 1)
            fast, fast_at = cells.search(_Ctx(), quantiles, one)  # type: ignore[arg-type]
        slow, slow_at = ref.search(_Ctx(), none_decided, one)  # type: ignore[arg-type]
        assert np.array_equal(fast_at, slow_at), name
        assert _bits(fast[fast_at]) == _bits(slow[slow_at]), name


def test_reading_cells_changes_nothing() -> None:
    """No getter of StepVector or Hists makes objects in place (the old ``hists`` property filled
    and replaced the dense and column forms): the vector and its cells are the same after."""
    objs, rng = _grid(11)
    cells = _forms(objs, rng)["dense and objects"]
    vec = StepVector(
        [()] * objs.shape[0],
        np.zeros(objs.shape),
        np.zeros(objs.shape, dtype=bool),
        np.zeros(objs.shape[0], dtype=bool),
        None,
        cells,
    )
    before = (vec.hists, cells.parts, [id(p) for p in cells.parts])
    first = vec.hist_objects()
    assert first is not None
    first[0, 0] = "written by the caller"  # the caller owns what it got
    vec.hist_present(), vec.hist_weight(), vec.any_present(), vec.compact(), vec.take([0, 0])
    assert (vec.hists, cells.parts, [id(p) for p in cells.parts]) == before
    assert _text(vec.hist_objects()) == _text(cells.objects())
    with pytest.raises(dataclasses.FrozenInstanceError):
        cells.parts = ()  # type: ignore[misc]
    assert not [f.name for f in dataclasses.fields(StepVector) if f.name in ("dense", "sparse", "hist_objs")]
    assert not [n for n, v in vars(StepVector).items() if isinstance(v, property) and n != "has_hists"]


#: The modules that hold the cell forms (they may name them); everything else reads cells
#: through Hists and StepVector only.
_FORM_MODULES = {"histcells.py", "histdense.py", "sparsehists.py"}
_FORMS = {"ObjectCells", "SparseCells", "DenseHists"}


def _form_checks(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and any(isinstance(n, ast.Name) and n.id in _FORMS for n in ast.walk(node.args[1]))
        ):
            out.append(f"{path.name}:{node.lineno} isinstance of a cell form")
        if isinstance(node, ast.Attribute) and node.attr == "parts":
            out.append(f"{path.name}:{node.lineno} reads .parts")
    return out


def test_no_caller_asks_which_form_it_holds() -> None:
    found = [hit for p in sorted(KQL.rglob("*.py")) if p.name not in _FORM_MODULES for hit in _form_checks(p)]
    assert not found, found


def test_object_cells_is_a_form_of_its_own_kind() -> None:
    objs, _ = _grid(3)
    cells = object_cells(objs)
    assert cells is not None
    assert isinstance(cells.parts[0], ObjectCells)
    assert object_cells(None) is None
    assert Hists.of((1, 1)) is None
    any_hist: Any = cells.objects()
    assert any_hist is not objs  # a new array: the caller may write it
