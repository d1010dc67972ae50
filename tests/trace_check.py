"""An independent reader of exported Chrome traces: the JSON schema of the emitted subset, then nesting.

Used by every test that exports a trace (API, CLI, SDK).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import jsonschema

__all__ = ["check_trace"]

_SCHEMA = json.loads((Path(__file__).parent / "fixtures" / "trace_event.schema.json").read_text())
_VALIDATOR = jsonschema.Draft202012Validator(_SCHEMA)


def check_trace(raw: bytes) -> dict[str, Any]:
    """Validate ``raw`` strictly; return counts by phase, spans per (pid, tid), and the parsed document.

    Complete events on one track must nest or be disjoint (what Perfetto needs to stack slices),
    every track used must be named, and ts/dur must agree to the nanosecond with
    the exact values in args (ts counts from ``otherData.origin_ns``).
    """
    doc = json.loads(raw)
    errors = sorted(_VALIDATOR.iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]
    events = doc["traceEvents"]
    phases = Counter(e["ph"] for e in events)
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    origin = int(doc["otherData"]["origin_ns"])
    tracks: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        if e["ph"] != "X":
            continue
        assert (e["pid"], e["tid"]) in named, f"track {(e['pid'], e['tid'])} has no thread_name"
        start, dur = e["args"]["start_ns"], e["args"]["dur_ns"]
        # ts and dur in microseconds keep every nanosecond (three decimals, exact in a double)
        assert round(e["ts"] * 1000) == start - origin, e
        assert round(e["dur"] * 1000) == dur, e
        tracks[(e["pid"], e["tid"])].append((start, start + dur))
    for track, spans in tracks.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack: list[int] = []
        for start, end in spans:
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], f"span {start}..{end} on {track} overlaps its parent"
            stack.append(end)
    return {"phases": phases, "tracks": {k: len(v) for k, v in tracks.items()}, "doc": doc}
