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
    """Validate ``raw`` strictly; return counts by phase and by (phase, cat), slices per (pid, tid),
    slices and thread instants per track name, the flows, and the parsed document.

    Complete events on one track must nest or be disjoint (what Perfetto needs to stack slices),
    every track used must be named, ts must agree to the nanosecond with args.start_ns (ts
    counts from ``otherData.origin_ns``) and dur hold whole nanoseconds.
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
        start, dur = e["args"]["start_ns"], round(e["dur"] * 1000)
        # ts and dur in microseconds keep every nanosecond (three decimals, exact in a double)
        assert round(e["ts"] * 1000) == start - origin, e
        assert abs(e["dur"] * 1000 - dur) < 1e-3, e  # no digits past the nanosecond
        tracks[(e["pid"], e["tid"])].append((start, start + dur))
    # Thread-scoped instants (memory operations) sit on a named track, at their exact time.
    for e in events:
        if e["ph"] == "i" and e["s"] == "t":
            assert (e["pid"], e["tid"]) in named, f"instant on unnamed track {(e['pid'], e['tid'])}"
            assert round(e["ts"] * 1000) == e["args"]["ts_ns"] - origin, e
    # Flows: each id starts once (s) and ends once (f), and each end lies inside a slice of its
    # track (where Perfetto binds it): s inside its launch slice, f at its kernel's start.
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == phases["s"], "a flow id starts twice"
    assert len(ends) == phases["f"], "a flow id ends twice"
    assert starts.keys() == ends.keys(), "a flow without its other end"
    for e in (*starts.values(), *ends.values()):
        at = origin + round(e["ts"] * 1000)
        assert any(a <= at < b or a == at == b for a, b in tracks[(e["pid"], e["tid"])]), (
            f"flow end {e} in no slice"
        )
    flows = [(starts[i], ends[i]) for i in sorted(starts)]
    for track, spans in tracks.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack: list[int] = []
        for start, end in spans:
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], f"span {start}..{end} on {track} overlaps its parent"
            stack.append(end)
    track_names = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    by_name: Counter[str] = Counter()
    for e in events:
        if e["ph"] in ("X", "i") and (e["pid"], e["tid"]) in track_names and e.get("s", "t") == "t":
            by_name[track_names[(e["pid"], e["tid"])]] += 1
    return {
        "phases": phases,
        "cats": Counter((e["ph"], e.get("cat")) for e in events),
        "tracks": {k: len(v) for k, v in tracks.items()},
        "named": by_name,
        "doc": doc,
        "flows": flows,
    }


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
    flows_out: dict[int, tuple[str, str, int]] = {}
    flows_in: dict[int, tuple[str, str, int]] = {}
    for packet in trace.packet:
        assert packet.trusted_packet_sequence_id == 1
        if packet.HasField("track_descriptor"):
            d = packet.track_descriptor
            if d.HasField("process"):
                names[d.uuid] = d.process.process_name
            elif d.HasField("thread"):
                names[d.uuid] = d.thread.thread_name
            else:
                names[d.uuid] = d.name
            if d.HasField("counter"):
                counters.add(d.uuid)
            continue
        ev = packet.track_event
        assert ev.track_uuid in names, f"event on undescribed track {ev.track_uuid}"
        kind = pb.TrackEvent.Type.Name(ev.type)
        types[kind] += 1
        if kind == "TYPE_SLICE_BEGIN":
            stacks[ev.track_uuid].append((packet.timestamp, ev.name))
            for f in ev.flow_ids:
                assert f not in flows_out, f"flow {f} starts twice"
                flows_out[f] = (names[ev.track_uuid], ev.name, packet.timestamp)
            for f in ev.terminating_flow_ids:
                assert f in flows_out, f"flow {f} ends before it starts"
                assert f not in flows_in, f"flow {f} ends twice"
                flows_in[f] = (names[ev.track_uuid], ev.name, packet.timestamp)
        elif kind == "TYPE_SLICE_END":
            assert stacks[ev.track_uuid], "END without BEGIN"
            start, name = stacks[ev.track_uuid].pop()
            assert packet.timestamp >= start
            slices.append((names[ev.track_uuid], name, start, packet.timestamp))
            per_track[names[ev.track_uuid]] += 1
        elif kind == "TYPE_COUNTER":
            assert ev.track_uuid in counters
    assert all(not s for s in stacks.values()), "slices left open"
    assert flows_out.keys() == flows_in.keys(), "a flow without its other end"
    flows = [(flows_out[f], flows_in[f]) for f in sorted(flows_out)]
    return {
        "types": types,
        "tracks": per_track,
        "slices": slices,
        "names": set(names.values()),
        "flows": flows,
    }
