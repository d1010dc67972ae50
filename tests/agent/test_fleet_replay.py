"""bench/fleet/gpus.py's replay: a recorded batch moved in time is the same batch, every timestamp
(header, records, histograms) shifted and nothing else, and it seals and opens under a new key."""

from __future__ import annotations

from typing import Any

from golden_wire import FIXTURES, KEY, batch_json

from bench.fleet.gpus import shift_pieces, shifted_body
from kernel_insight.collector import wire

SHIFT_NS = 86_400 * 10**9 + 123_456_789  # a day and a bit: every varint of a timestamp changes


def _differences(a: Any, b: Any, path: str = "") -> list[tuple[str, int]]:
    """(path, b - a) of every number that differs between two JSON trees of the same shape."""
    if isinstance(a, dict):
        assert set(a) == set(b), path
        return [d for k in a for d in _differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list):
        assert len(a) == len(b), path
        return [
            d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{path}[{i}]")
        ]
    if a != b:
        assert isinstance(a, int), f"{path}: {a!r} -> {b!r}"
        assert isinstance(b, int), f"{path}: {a!r} -> {b!r}"
        return [(path, b - a)]
    return []


def test_a_golden_frame_replayed_a_day_later_differs_only_in_its_timestamps():
    frame = (FIXTURES / "frame_v4.kib").read_bytes()  # every record type, names, histograms
    h = wire.parse_header(frame)
    pieces = shift_pieces(wire.open_frame(frame, h, KEY))
    assert shifted_body(pieces, 0) == wire.open_frame(frame, h, KEY)
    other_key = bytes(range(1, 33))
    moved = wire.seal_body(
        shifted_body(pieces, SHIFT_NS), agent_id=h.agent_id, key_id=h.key_id, key=other_key, epoch=h.epoch,
        seq=h.seq, t_min_ns=h.t_min_ns + SHIFT_NS, t_max_ns=h.t_max_ns + SHIFT_NS,
        record_count=h.record_count, level=1,
    )  # fmt: skip
    before, after = batch_json(wire.decode_batch(frame, KEY)), batch_json(wire.decode_batch(moved, other_key))
    diffs = _differences(before, after)
    assert {d for _, d in diffs} == {SHIFT_NS}, diffs
    shifted = {p.rsplit(".", 1)[-1] for p, _ in diffs}
    assert {"ts_ns", "t_min_ns", "t_max_ns"} <= shifted, shifted
    assert any(p.startswith(".histograms.") for p, _ in diffs), diffs
    records = before.get("records", [])
    assert len([p for p, _ in diffs if p.endswith(".ts_ns")]) >= len(records) > 0
