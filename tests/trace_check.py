"""An independent reader of exported Chrome traces: the JSON schema of the emitted subset, then nesting.

Used by every test that exports a trace (API, CLI, SDK).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import jsonschema

__all__ = ["check_perfetto", "check_trace"]

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


def check_perfetto(raw: bytes) -> dict[str, Any]:
    """Parse ``raw`` with the perfetto package's own ``Trace`` message and check it the same way.

    Every track an event names is described first; slices on a track open and close in stack
    order (each END closes the innermost open BEGIN, none stays open); counters sit on counter
    tracks. Returns counts by event type, slices per track name, and the slices themselves.
    """
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    trace = pb.Trace()
    trace.ParseFromString(raw)
    names: dict[int, str] = {}
    counters: set[int] = set()
    types: Counter[str] = Counter()
    stacks: dict[int, list[tuple[int, str]]] = defaultdict(list)
    slices: list[tuple[str, str, int, int]] = []
    per_track: Counter[str] = Counter()
    for packet in trace.packet:
        assert packet.trusted_packet_sequence_id == 1
        if packet.HasField("track_descriptor"):
            d = packet.track_descriptor
            names[d.uuid] = d.process.process_name if d.HasField("process") else d.name
            if d.HasField("counter"):
                counters.add(d.uuid)
            continue
        ev = packet.track_event
        assert ev.track_uuid in names, f"event on undescribed track {ev.track_uuid}"
        kind = pb.TrackEvent.Type.Name(ev.type)
        types[kind] += 1
        if kind == "TYPE_SLICE_BEGIN":
            stacks[ev.track_uuid].append((packet.timestamp, ev.name))
        elif kind == "TYPE_SLICE_END":
            assert stacks[ev.track_uuid], "END without BEGIN"
            start, name = stacks[ev.track_uuid].pop()
            assert packet.timestamp >= start
            slices.append((names[ev.track_uuid], name, start, packet.timestamp))
            per_track[names[ev.track_uuid]] += 1
        elif kind == "TYPE_COUNTER":
            assert ev.track_uuid in counters
    assert all(not s for s in stacks.values()), "slices left open"
    return {"types": types, "tracks": per_track, "slices": slices, "names": set(names.values())}
