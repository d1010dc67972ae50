"""hist_base.resolve hands cumulative rows on unchanged where re-encoding them would change nothing,
and otherwise answers as the row-by-row resolve did (tests/collector/hist_base_reference.py):
the same section, column for column, the same count of unresolved increments and the same bases,
over random sections of snapshots, increments (with and without their base), first exports,
odd layouts (zero buckets, short gaps, empty spans) and bases of any weight."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_insight.collector import wire
from kernel_insight.collector.hist_base import HistogramBases, _spans
from kernel_insight.collector.wire_hist import (
    HistKind,
    HistRow,
    WireHistograms,
    decode_histograms,
    encode_histograms,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hist_base_reference as reference

Buckets = dict[int, int]
Layout = tuple[tuple[tuple[int, int], ...], tuple[int, ...]]


def make_buckets(b: Buckets) -> Layout:
    """client_golang's makeBuckets (what the agent writes): gaps of up to two buckets filled."""
    return _spans(
        (
            np.asarray(sorted(i for i, c in b.items() if c), dtype=np.int32),
            np.asarray([b[i] for i in sorted(i for i, c in b.items() if c)], dtype=np.int64),
        )
    )


def odd_layout(rng: random.Random, b: Buckets) -> Layout:
    """The same buckets in a layout of another writer: explicit zero buckets, short gaps, empty spans."""
    idx = sorted(set(b) | {rng.randrange(-8, 30) for _ in range(rng.randrange(0, 4))})
    spans: list[tuple[int, int]] = []
    deltas: list[int] = []
    prev, nxt = 0, 0
    for i in idx:
        if not spans or rng.random() < 0.3:
            if spans and rng.random() < 0.2:
                spans.append((0, 0))
            spans.append((i - nxt, 1))
        elif i == nxt:
            spans[-1] = (spans[-1][0], spans[-1][1] + 1)
        else:
            spans.append((i - nxt, 1))
        c = b.get(i, 0)
        deltas.append(c - prev)
        prev, nxt = c, i + 1
    return tuple(spans), tuple(deltas)


def _decode(rows: list[HistRow], ts_ns: int) -> WireHistograms:
    data = encode_histograms(ts_ns, rows, 4)
    r = wire._Reader(data, "HISTOGRAMS")
    header = wire.BatchHeader(bytes(16), 1, 1, 0, 0, 2**63, 0, 0, wire.COMPRESSION_NONE)
    return decode_histograms(r, header, wire.DEFAULT_LIMITS, 4)


def _sections(seed: int) -> list[WireHistograms]:
    """A few batches of one agent: six series growing, exported as snapshots (some in odd
    layouts), as increments over their previous export (or over one the collector never saw),
    and started again now and then."""
    rng = random.Random(seed)
    state: dict[int, tuple[Buckets, int, int]] = {}  # series -> (buckets, zero count, count)
    exported: dict[int, tuple[Buckets, int, int]] = {}
    out = []
    for batch in range(6):
        rows = []
        for ident in rng.sample(range(6), rng.randrange(1, 7)):
            first = ident not in state or rng.random() < 0.1
            b, z, c = ({}, 0, 0) if first else state[ident]
            b = dict(b)
            for _ in range(rng.randrange(1, 40)):
                if rng.random() < 0.1:
                    z += 1
                else:
                    i = rng.randrange(-4, 4) + (rng.randrange(0, 25) if rng.random() < 0.2 else 0)
                    b[i] = b.get(i, 0) + 1
                c += 1
            state[ident] = (b, z, c)
            common: dict[str, Any] = dict(
                producer=1, id=ident, gpu=0, pid=42, stream=ident % 3 or None, schema=3
            )
            base = exported.get(ident)
            if not first and base is not None and rng.random() < 0.5:
                bb, bz, bc = base if rng.random() < 0.85 else (base[0], base[1], base[2] - 1)
                inc = {i: n - bb.get(i, 0) for i, n in b.items() if n - bb.get(i, 0)}
                spans, deltas = make_buckets(inc)
                rows.append(HistRow(HistKind.KERNEL, **common, zero_count=z - bz, count=c, sum=c * 0.1,
                                    pos_spans=spans, pos_deltas=deltas, increment=True, count_inc=c - bc))  # fmt: skip
            else:
                spans, deltas = odd_layout(rng, b) if rng.random() < 0.3 else make_buckets(b)
                neg = odd_layout(rng, {1: 2, 5: 1}) if rng.random() < 0.1 else ((), ())
                rows.append(HistRow(HistKind.KERNEL, **common, zero_count=z, count=c, sum=c * 0.1, pos_spans=spans,
                                    pos_deltas=deltas, neg_spans=neg[0], neg_deltas=neg[1], first=first))  # fmt: skip
            exported[ident] = (b, z, c)
        out.append(_decode(rows, 10**18 + batch))
    return out


def _columns(h: WireHistograms | None) -> Any:
    if h is None:
        return None
    return {
        k: getattr(h, k).tolist() if k != "ts_ns" else h.ts_ns for k in WireHistograms.__dataclass_fields__
    }


def _bases(runs: dict[int, Any]) -> Any:
    return {
        epoch: {
            key: [
                (
                    k,
                    c.schema,
                    c.zero_threshold,
                    c.zero_count,
                    c.count,
                    c.sum,
                    c.pos[0].tolist(),
                    c.pos[1].tolist(),
                    c.neg[0].tolist(),
                    c.neg[1].tolist(),
                )
                for k, c in series.history.items()
            ]
            for key, series in run.series.items()
        }
        for epoch, run in runs.items()
    }


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1), min_count=st.sampled_from([0, 1, 20, 60, 10**9]), keep=st.integers(1, 3)
)
def test_resolve_answers_as_the_row_by_row_resolve(seed: int, min_count: int, keep: int) -> None:
    new, old = (
        HistogramBases(keep=keep, min_count=min_count),
        reference.RowByRow(keep=keep, min_count=min_count),
    )
    for k, section in enumerate(_sections(seed)):
        epoch = 5 if k < 4 else 6
        got, want = new.resolve(section, epoch), old.resolve(section, epoch)
        assert _columns(got[0]) == _columns(want[0])
        assert got[1] == want[1]
        assert _bases(new._runs) == _bases(old._runs)


def test_a_section_of_snapshots_as_the_agent_writes_them_goes_on_as_it_came() -> None:
    """Light kernels' snapshots (below the base weight) in client_golang's layout: nothing to do."""
    rng = random.Random(3)
    rows = []
    for ident in range(200):
        b = {rng.randrange(-10, 40): rng.randrange(1, 9) for _ in range(rng.randrange(0, 12))}
        spans, deltas = make_buckets(b)
        rows.append(HistRow(HistKind.KERNEL, producer=1, id=ident, pid=7, zero_count=ident % 3,
                            count=sum(b.values()) + ident % 3, sum=1.0, pos_spans=spans, pos_deltas=deltas))  # fmt: skip
    section = _decode(rows, 10**18)
    bases = HistogramBases()
    got, unresolved = bases.resolve(section, 1)
    assert got is section
    assert unresolved == 0
    assert len(bases) == 0
    assert _columns(got) == _columns(reference.RowByRow().resolve(section, 1)[0])


@pytest.mark.parametrize(
    ("layout", "deltas"),
    [
        (((0, 2), (0, 1)), (1, 1, 1)),  # spans that merely touch
        (((0, 3),), (1, 1, -2)),  # a zero bucket at a span's end
        (((0, 1), (2, 1)), (1, 1)),  # a gap of two
        (((0, 0), (3, 1)), (1,)),  # an empty span
        (((0, 5),), (1, -1, 0, 0, 1)),  # three zero buckets in a row
        (((-2, 2), (5, 1)), (0, 1, 1)),  # a zero bucket first
    ],
)
def test_a_layout_the_agent_would_not_write_is_written_as_it_would(
    layout: tuple[tuple[int, int], ...], deltas: tuple[int, ...]
) -> None:
    """Re-encoded: the stored layout is the one a snapshot of the same buckets would have."""
    section = _decode([HistRow(HistKind.KERNEL, count=5, pos_spans=layout, pos_deltas=deltas)], 10**18)
    got, _ = HistogramBases().resolve(section, 1)
    assert got is not section
    assert _columns(got) == _columns(reference.RowByRow().resolve(section, 1)[0])


def test_gaps_filled_with_up_to_two_zero_buckets_are_the_agents_layout() -> None:
    section = _decode(
        [HistRow(HistKind.KERNEL, count=5, pos_spans=((-3, 6), (3, 1)), pos_deltas=(2, -2, 0, 1, -1, 1, 0))],
        10**18,
    )
    got, _ = HistogramBases().resolve(section, 1)
    assert got is section


def test_a_negative_bucket_is_refused() -> None:
    section = _decode([HistRow(HistKind.KERNEL, count=1, pos_spans=((0, 2),), pos_deltas=(1, -2))], 10**18)
    with pytest.raises(ValueError, match="negative bucket"):
        HistogramBases().resolve(section, 1)
