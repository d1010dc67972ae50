"""One GPU's window as a native Perfetto trace (protobuf ``Trace``), built with the ``perfetto`` package's messages.

Same layout as the JSON export (collector/trace.py): a process track per GPU, a child track
per stream, a child track per NCCL communicator (slices) and one for memory operations
(instants), counter tracks for memory and SM utilisation, instants for errors, and for spans
with a host side (ring flag LAUNCH_SPAN) a launch slice on the host thread's track with a flow
(``flow_ids`` / ``terminating_flow_ids``) to the kernel; but timestamps are absolute nanoseconds (protobuf integers lose nothing). Building one message per event in
Python costs microseconds each, so this format takes at most :data:`MAX_PROTO_SPANS` spans.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb  # type: ignore[import-untyped]

from kernel_insight.collector.clickhouse.timeline import perfetto_span_columns
from kernel_insight.collector.spans import SpanWindow, read_counters, read_events
from kernel_insight.collector.trace import (
    MAX_EXPORT_EVENTS,
    CallTracks,
    TraceTooLarge,
    call_tracks,
    stream_tids,
)

if TYPE_CHECKING:
    from kernel_insight.collector.clickhouse.store import Store

__all__ = ["MAX_PROTO_SPANS", "perfetto_trace"]

#: The most spans one protobuf export writes (a few seconds of Python); larger windows: JSON.
MAX_PROTO_SPANS = 200_000
_SEQ = 1  # the one trusted packet sequence this writer emits


def _packet(trace: pb.Trace) -> pb.TracePacket:
    packet = trace.packet.add()
    packet.trusted_packet_sequence_id = _SEQ
    return packet


def perfetto_trace(store: Store, window: SpanWindow, *, max_spans: int = MAX_PROTO_SPANS) -> bytes:
    """The serialized ``perfetto.protos.Trace`` of ``window``; raises TraceTooLarge past ``max_spans``."""
    rows = perfetto_span_columns(store, window, int(max_spans) + 1)
    if len(rows["s"]) > max_spans:
        raise TraceTooLarge(
            f"the window holds more than {max_spans} spans, the most a protobuf export takes: "
            "narrow the window or filter, or export JSON"
        )
    trace = pb.Trace()
    gpu_uuid = 1 + window.gpu
    first = _packet(trace)
    first.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    first.track_descriptor.uuid = gpu_uuid
    first.track_descriptor.process.pid = window.gpu + 1
    first.track_descriptor.process.process_name = f"{window.instance} GPU {window.gpu}"
    tracks: dict[int, int] = {}
    for stream, tid in stream_tids(sorted(set(rows["stream"]))).items():
        uuid = (gpu_uuid << 32) + tid
        tracks[stream] = uuid
        desc = _packet(trace).track_descriptor
        desc.uuid, desc.parent_uuid, desc.name = uuid, gpu_uuid, f"stream {stream}"
    _call_slices(trace, gpu_uuid, len(tracks), call_tracks(store, window))
    threads = _host_tracks(trace, window, rows)
    flow = 0
    for stream, kernel, start, dur, corr, pid, launch, host_ns, tid, pod, namespace, container, nvtx in zip(
        rows["stream"],
        rows["kernel"],
        rows["s"],
        rows["d"],
        rows["correlation"],
        rows["pid"],
        rows["launch_ns"],
        rows["launch_host_ns"],
        rows["tid"],
        rows["pod"],
        rows["namespace"],
        rows["container"],
        rows["nvtx_range"],
        strict=True,
    ):
        if launch:
            flow += 1
            _launch_slice(trace, threads[(pid, tid)], kernel, launch, max(host_ns, 1), flow)
        begin = _packet(trace)
        begin.timestamp = start
        ev = begin.track_event
        ev.type, ev.track_uuid, ev.name = pb.TrackEvent.TYPE_SLICE_BEGIN, tracks[stream], kernel
        ev.categories.append("kernel")
        if launch:
            ev.terminating_flow_ids.append(flow)
        for name, value in (("correlation", corr), ("pid", pid), ("stream", stream)):
            a = ev.debug_annotations.add()
            a.name, a.uint_value = name, value
        if pod:  # the Kubernetes pod that held the GPU
            for name, text in (("pod", pod), ("namespace", namespace), ("container", container)):
                a = ev.debug_annotations.add()
                a.name, a.string_value = name, text
        if nvtx:  # the NVTX range enclosing the launch (CUPTI probe)
            a = ev.debug_annotations.add()
            a.name, a.string_value = "nvtx_range", nvtx
        end = _packet(trace)
        end.timestamp = start + dur
        end.track_event.type, end.track_event.track_uuid = pb.TrackEvent.TYPE_SLICE_END, tracks[stream]
    for e in read_events(store, window, MAX_EXPORT_EVENTS):
        p = _packet(trace)
        p.timestamp = e["ts_ns"]
        ev = p.track_event
        ev.type, ev.track_uuid, ev.name = pb.TrackEvent.TYPE_INSTANT, gpu_uuid, f"{e['kind']} {e['code']}"
        ev.categories.append("error")
        a = ev.debug_annotations.add()
        a.name, a.string_value = "message", e["message"]
    for i, (name, points) in enumerate(read_counters(store, window).items()):
        uuid = (gpu_uuid << 32) + (1 << 31) + i
        desc = _packet(trace).track_descriptor
        desc.uuid, desc.parent_uuid, desc.name = uuid, gpu_uuid, name
        desc.counter.SetInParent()
        for ts_ms, value in points:
            p = _packet(trace)
            p.timestamp = ts_ms * 1_000_000
            p.track_event.type, p.track_event.track_uuid = pb.TrackEvent.TYPE_COUNTER, uuid
            p.track_event.double_counter_value = value
    data: bytes = trace.SerializeToString()
    return data


def _call_slices(trace: pb.Trace, gpu_uuid: int, streams: int, calls: CallTracks) -> None:
    """NCCL operations as slices on a child track of the GPU per communicator (as the JSON export
    lays them), memory operations as instants on a ``memory`` child track, syncs as slices on a
    ``syncs`` child track (a second one where waits overlap)."""
    uuid = (gpu_uuid << 32) + streams
    for category, tracks, keys in (
        (
            "nccl",
            calls.nccl,
            (("bytes", "bytes"), ("comm", "handle"), ("rank", "rank"), ("nranks", "nranks")),
        ),
        ("sync", calls.syncs, (("handle", "handle"), ("pid", "pid"), ("tid", "tid"))),
    ):
        if category == "sync" and calls.memory:  # the memory track comes between, as in the JSON
            uuid += 1
            _memory_track(trace, gpu_uuid, uuid, calls.memory)
        for name, rows in tracks:
            uuid += 1
            desc = _packet(trace).track_descriptor
            desc.uuid, desc.parent_uuid, desc.name = uuid, gpu_uuid, name
            for c in rows:
                begin = _packet(trace)
                begin.timestamp = c["ts_ns"]
                ev = begin.track_event
                ev.type, ev.track_uuid, ev.name = pb.TrackEvent.TYPE_SLICE_BEGIN, uuid, c["op"]
                ev.categories.append(category)
                for label, key in keys:
                    a = ev.debug_annotations.add()
                    a.name, a.uint_value = label, c[key]
                if "failed" in c:
                    a = ev.debug_annotations.add()
                    a.name, a.bool_value = "failed", c["failed"]
                end = _packet(trace)
                end.timestamp = c["ts_ns"] + c["duration_ns"]
                end.track_event.type, end.track_event.track_uuid = pb.TrackEvent.TYPE_SLICE_END, uuid


def _memory_track(trace: pb.Trace, gpu_uuid: int, uuid: int, memory: list[dict[str, Any]]) -> None:
    """The ``memory`` child track: one instant per memory operation."""
    desc = _packet(trace).track_descriptor
    desc.uuid, desc.parent_uuid, desc.name = uuid, gpu_uuid, "memory"
    for c in memory:
        p = _packet(trace)
        p.timestamp = c["ts_ns"]
        ev = p.track_event
        ev.type, ev.track_uuid, ev.name = pb.TrackEvent.TYPE_INSTANT, uuid, f"{c['op']} {c['bytes']} B"
        ev.categories.append("memory")
        for label, key in (("bytes", "bytes"), ("address", "handle"), ("pid", "pid"), ("tid", "tid")):
            a = ev.debug_annotations.add()
            a.name, a.uint_value = label, c[key]
        a = ev.debug_annotations.add()
        a.name, a.int_value = "status", c["status"]


def _host_tracks(
    trace: pb.Trace, window: SpanWindow, rows: dict[str, list[int]]
) -> dict[tuple[int, int], int]:
    """A process track per host process and a thread track per thread that launched spans: (pid, tid) -> uuid."""
    threads: dict[tuple[int, int], int] = {}
    seen: set[int] = set()
    for pid, tid, launch in zip(rows["pid"], rows["tid"], rows["launch_ns"], strict=True):
        if not launch or (pid, tid) in threads:
            continue
        if pid not in seen:
            seen.add(pid)
            desc = _packet(trace).track_descriptor
            desc.uuid = (1 << 62) | pid
            desc.process.pid = pid
            desc.process.process_name = f"{window.instance} process {pid} (host)"
        desc = _packet(trace).track_descriptor
        desc.uuid = (1 << 61) | (pid << 24) | (tid & 0xFFFFFF)
        desc.parent_uuid = (1 << 62) | pid
        desc.thread.pid, desc.thread.tid, desc.thread.thread_name = pid, tid, f"thread {tid}"
        threads[(pid, tid)] = desc.uuid
    return threads


def _launch_slice(trace: pb.Trace, track: int, name: str, start: int, dur: int, flow: int) -> None:
    """The host side of one span: a slice on its thread's track that starts the flow to its kernel."""
    begin = _packet(trace)
    begin.timestamp = start
    ev = begin.track_event
    ev.type, ev.track_uuid, ev.name = pb.TrackEvent.TYPE_SLICE_BEGIN, track, name
    ev.categories.append("launch")
    ev.flow_ids.append(flow)
    end = _packet(trace)
    end.timestamp = start + dur
    end.track_event.type, end.track_event.track_uuid = pb.TrackEvent.TYPE_SLICE_END, track
