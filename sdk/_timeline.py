"""Kernel timelines: :class:`TimelineClient` (spans, summary, correlation, Perfetto export) and its types.

The logic (parameters, paging, decoding, retries) is in the sans-I/O ``_TimelineCore``; the sync
and async clients only move bytes (docs/api.md, "Kernel timelines").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from kernel_insight.sdk._client import (
    TimeLike,
    _api_error,
    _aretried,
    _AsyncClosing,
    _Closing,
    _headers,
    _KqlCore,
    _retried,
    _time_param,
)
from kernel_insight.sdk._exceptions import ServerError

__all__ = [
    "AsyncTimelineClient",
    "CaptureRequest",
    "Correlation",
    "KernelSummary",
    "Span",
    "TimelineClient",
    "TimelineEvent",
    "TimelineSummary",
]

SPANS_PATH = "/v1/timeline/spans"
SUMMARY_PATH = "/v1/timeline/summary"
CORRELATION_PATH = "/v1/timeline/correlation"
EXPORT_PATH = "/v1/timeline/export"
CAPTURES_PATH = "/v1/timeline/captures"


@dataclass(frozen=True, slots=True)
class Span:
    """One kernel execution; times are nanoseconds since the epoch."""

    stream: int
    kernel: str
    start_ns: int
    end_ns: int
    duration_ns: int
    correlation: int
    pid: int
    #: The host side, for spans of the CUDA-event probe: when the host launched it (0: unknown),
    #: how long the span's code took on the host, and the host thread.
    launch_ns: int = 0
    launch_host_ns: int = 0
    tid: int = 0
    #: Kubernetes: the pod, namespace and container that held the GPU when the span ran ("": none).
    pod: str = ""
    namespace: str = ""
    container: str = ""
    #: The NVTX range enclosing the kernel's launch (CUPTI probe; "": none).
    nvtx_range: str = ""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Span:
        return cls(
            int(d["stream"]),
            str(d["kernel"]),
            int(d["start_ns"]),
            int(d["end_ns"]),
            int(d["duration_ns"]),
            int(d["correlation"]),
            int(d["pid"]),
            int(d.get("launch_ns", 0)),
            int(d.get("launch_host_ns", 0)),
            int(d.get("tid", 0)),
            str(d.get("pod", "")),
            str(d.get("namespace", "")),
            str(d.get("container", "")),
            str(d.get("nvtx_range", "")),
        )


@dataclass(frozen=True, slots=True)
class KernelSummary:
    """One kernel over a window: how often, how long in all, its share of kernel time, quantiles (ns)."""

    kernel: str
    count: int
    total_ns: int
    share: float
    p50_ns: float
    p90_ns: float
    p99_ns: float
    max_ns: int
    slowest: tuple[Span, ...]
    slowest_links: tuple[str, ...]  # the spans URL around each slowest span, same order
    source: str = "spans"  # "histograms": count, total and quantiles from every launch, not the kept spans


@dataclass(frozen=True, slots=True)
class TimelineSummary:
    """Per-kernel figures of a window, most total time first."""

    span_count: int
    total_ns: int
    busy_ratio: float
    kernels: tuple[KernelSummary, ...]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TimelineSummary:
        kernels = tuple(
            KernelSummary(
                str(k["kernel"]),
                int(k["count"]),
                int(k["total_ns"]),
                float(k["share"]),
                float(k["p50_ns"]),
                float(k["p90_ns"]),
                float(k["p99_ns"]),
                int(k["max_ns"]),
                tuple(Span.from_json(s) for s in k["slowest"]),
                tuple(str(s.get("timeline", "")) for s in k["slowest"]),
                str(k.get("source", "spans")),
            )
            for k in d["kernels"]
        )
        return cls(int(d["span_count"]), int(d["total_ns"]), float(d["busy_ratio"]), kernels)


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    """An error or incident on the GPU (OOM, Xid, NCCL timeout...)."""

    ts_ns: int
    kind: str
    code: int
    aux: int
    pid: int
    message: str


#: The correlation view's call lists (a collector before gpu_calls answers none of them).
_CALL_LISTS = ("nccl", "memory", "syncs")


@dataclass(frozen=True, slots=True)
class GpuCall:
    """One NCCL operation, memory operation or sync of the GPU (docs/api.md, the correlation view).

    ``handle`` is the communicator (NCCL), the address (memory) or the stream/event handle (sync);
    fields a kind of call does not have are 0.
    """

    ts_ns: int
    op: str  # allreduce, ...; alloc, free, memcpy, ...; stream, context, event
    duration_ns: int = 0
    bytes: int = 0
    handle: int = 0
    pid: int = 0
    tid: int = 0
    rank: int = 0
    nranks: int = 0
    status: int = 0
    failed: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> GpuCall:
        def num(key: str) -> int:
            return int(d.get(key, 0))

        return cls(
            int(d["ts_ns"]),
            str(d["op"]),
            duration_ns=num("duration_ns"),
            bytes=num("bytes"),
            handle=num("handle"),
            pid=num("pid"),
            tid=num("tid"),
            rank=num("rank"),
            nranks=num("nranks"),
            status=num("status"),
            failed=bool(d.get("failed", False)),
        )


def _calls(d: Mapping[str, Any], key: str) -> tuple[GpuCall, ...]:
    return tuple(GpuCall.from_json(c) for c in d.get(key, ()))


@dataclass(frozen=True, slots=True)
class Correlation:
    """One window side by side: spans, events, NVML samples ``name -> ((ts_ms, value), ...)``, and
    the GPU's NCCL operations, memory operations and (kept) syncs, each the first 5,000 of the
    window (``calls_truncated`` names the lists that hold more)."""

    start_ns: int
    end_ns: int
    spans: tuple[Span, ...]
    spans_truncated: bool
    events: tuple[TimelineEvent, ...]
    counters: Mapping[str, tuple[tuple[int, float], ...]]
    nccl: tuple[GpuCall, ...] = ()
    memory: tuple[GpuCall, ...] = ()
    syncs: tuple[GpuCall, ...] = ()
    calls_truncated: frozenset[str] = frozenset()

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Correlation:
        return cls(
            int(d["start_ns"]),
            int(d["end_ns"]),
            tuple(Span.from_json(s) for s in d["spans"]),
            bool(d["spans_truncated"]),
            tuple(
                TimelineEvent(
                    int(e["ts_ns"]),
                    str(e["kind"]),
                    int(e["code"]),
                    int(e["aux"]),
                    int(e["pid"]),
                    str(e["message"]),
                )
                for e in d["events"]
            ),
            {str(k): tuple((int(t), float(v)) for t, v in pts) for k, pts in d["counters"].items()},
            nccl=_calls(d, "nccl"),
            memory=_calls(d, "memory"),
            syncs=_calls(d, "syncs"),
            calls_truncated=frozenset(k for k in _CALL_LISTS if d.get(f"{k}_truncated")),
        )


@dataclass(frozen=True, slots=True)
class CaptureRequest:
    """A capture window asked for: every span of one GPU for ``seconds`` (state ``pending`` at first)."""

    id: str
    instance: str
    gpu: int
    seconds: int
    state: str  # pending, delivered, capturing, done or expired
    requested_ms: int
    requested_by: str
    updated_ms: int = 0
    window_start_ns: int = 0  # the window as the agent ran it (its clock), once it reports
    window_end_ns: int = 0
    spans: int = 0  # kernel spans the agent shipped for the window (all of them once ``done``)

    @property
    def finished(self) -> bool:
        """The request will not change any more (``done`` or ``expired``)."""
        return self.state in ("done", "expired")

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CaptureRequest:
        return cls(
            str(d["id"]),
            str(d["instance"]),
            int(d["gpu"]),
            int(d["seconds"]),
            str(d["state"]),
            int(d["requested_ms"]),
            str(d["requested_by"]),
            int(d.get("updated_ms", 0)),
            int(d.get("window_start_ns", 0)),
            int(d.get("window_end_ns", 0)),
            int(d.get("spans", 0)),
        )


class _TimelineCore:
    """Parameters and response interpretation shared by both clients; retries as in the kql clients."""

    def __init__(self, retries: int, backoff_s: float, max_backoff_s: float) -> None:
        self.retry = _KqlCore(retries, backoff_s, max_backoff_s)

    @staticmethod
    def window(
        instance: str,
        gpu: int,
        start: TimeLike,
        end: TimeLike,
        stream: int | None = None,
        kernel: str | None = None,
        min_duration_ns: int = 0,
        pod: str | None = None,
        namespace: str | None = None,
        container: str | None = None,
    ) -> dict[str, str]:
        params = {
            "instance": instance,
            "gpu": str(int(gpu)),
            "from": _time_param(start),
            "to": _time_param(end),
        }
        if stream is not None:
            params["stream"] = str(int(stream))
        if kernel is not None:
            params["kernel"] = kernel
        if min_duration_ns:
            params["min_duration_ns"] = str(int(min_duration_ns))
        for name, value in (("pod", pod), ("namespace", namespace), ("container", container)):
            if value is not None:
                params[name] = value
        return params

    def outcome(self, response: httpx.Response, attempt: int) -> httpx.Response | float:
        """The 200/201 response, or the delay before the next attempt; raises a 4xx, or a 5xx when out of attempts."""
        if response.status_code in (200, 201):
            return response
        error = _api_error(response)
        if response.status_code >= 500 and attempt < self.retry.retries:
            return self.retry.delay(attempt, response.headers.get("retry-after"))
        raise error

    def retry_wait(self, response: httpx.Response, attempt: int) -> float:
        """The delay before retrying a request that did not answer 200; raises as :meth:`outcome` does."""
        outcome = self.outcome(response, attempt)
        if isinstance(outcome, httpx.Response):
            raise ServerError(
                response.status_code, "bad_response", f"unexpected status {response.status_code}"
            )
        return outcome

    @staticmethod
    def json(response: httpx.Response, decode: Callable[[Any], Any]) -> Any:
        try:
            return decode(response.json())
        except (ValueError, KeyError, TypeError) as exc:
            raise ServerError(200, "bad_response", f"unexpected response body: {exc}") from None


class TimelineClient(_Closing):
    """One GPU's kernel timeline: spans, per-kernel summary, correlation view, Perfetto export.

    >>> tl = TimelineClient("http://collector:8470", token="ki_...")             # doctest: +SKIP
    >>> s = tl.summary("node-1", 0, time.time() - 60, time.time())                # doctest: +SKIP
    >>> [(k.kernel, k.p99_ns) for k in s.kernels[:3]]                             # doctest: +SKIP
    >>> tl.to_perfetto("trace.json", "node-1", 0, time.time() - 10, time.time())  # doctest: +SKIP

    Times are Unix seconds or aware datetimes; 4xx answers raise at once (:class:`BadRequestError`
    with the server's message), 5xx and connection errors are retried as in :class:`KqlClient`.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 60.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._core = _TimelineCore(retries, backoff_s, max_backoff_s)
        self._http = httpx.Client(base_url=url, headers=_headers(token), timeout=timeout, transport=transport)
        self._sleep = sleep

    def _get(
        self, path: str, params: Mapping[str, str], body: Mapping[str, Any] | None = None
    ) -> httpx.Response:
        def send() -> httpx.Response:
            if body is None:
                return self._http.get(path, params=dict(params))
            return self._http.post(path, json=dict(body))

        return _retried(send, self._core.outcome, self._core.retry, self._http.base_url, self._sleep)

    def iter_spans(
        self,
        instance: str,
        gpu: int,
        start: TimeLike,
        end: TimeLike,
        *,
        stream: int | None = None,
        kernel: str | None = None,
        min_duration_ns: int = 0,
        pod: str | None = None,
        namespace: str | None = None,
        container: str | None = None,
        page_size: int = 1000,
    ) -> Iterator[Span]:
        """Every span starting in ``[start, end)``, page by page (``kernel``: RE2, anchored; ``pod``,
        ``namespace``, ``container``: only spans run while that Kubernetes pod held the GPU)."""
        params = self._core.window(
            instance, gpu, start, end, stream, kernel, min_duration_ns, pod, namespace, container
        )
        params["limit"] = str(page_size)
        while True:
            body = self._core.json(self._get(SPANS_PATH, params), dict)
            yield from (Span.from_json(s) for s in body["spans"])
            if body.get("next_cursor") is None:
                return
            params["cursor"] = str(body["next_cursor"])

    def spans(self, instance: str, gpu: int, start: TimeLike, end: TimeLike, **filters: Any) -> list[Span]:
        """:meth:`iter_spans` as a list."""
        return list(self.iter_spans(instance, gpu, start, end, **filters))

    def summary(
        self,
        instance: str,
        gpu: int,
        start: TimeLike,
        end: TimeLike,
        *,
        kernels: int = 50,
        slowest: int = 5,
        stream: int | None = None,
        kernel: str | None = None,
        min_duration_ns: int = 0,
        pod: str | None = None,
        namespace: str | None = None,
        container: str | None = None,
    ) -> TimelineSummary:
        params = self._core.window(
            instance, gpu, start, end, stream, kernel, min_duration_ns, pod, namespace, container
        )
        params |= {"kernels": str(kernels), "slowest": str(slowest)}
        result: TimelineSummary = self._core.json(self._get(SUMMARY_PATH, params), TimelineSummary.from_json)
        return result

    def correlation(self, instance: str, gpu: int, start: TimeLike, end: TimeLike) -> Correlation:
        params = self._core.window(instance, gpu, start, end)
        result: Correlation = self._core.json(self._get(CORRELATION_PATH, params), Correlation.from_json)
        return result

    def export(
        self, instance: str, gpu: int, start: TimeLike, end: TimeLike, *, format: str = "json", **filters: Any
    ) -> bytes:
        """The window's trace (bytes): Chrome trace JSON, or ``format="perfetto"`` a Perfetto protobuf."""
        params = self._core.window(instance, gpu, start, end, **filters) | {"format": format}
        return self._get(EXPORT_PATH, params).content

    def to_perfetto(
        self,
        path: str | Path,
        instance: str,
        gpu: int,
        start: TimeLike,
        end: TimeLike,
        *,
        format: str = "json",
        **filters: Any,
    ) -> Path:
        """Write the window's trace to ``path`` for ui.perfetto.dev (both formats) or chrome://tracing (JSON).

        Streamed to the file as it arrives (a 1M-span window is ~180 MB of JSON: never held in
        memory), through ``<path>.part`` renamed once complete, so ``path`` is never half written.
        """
        params = self._core.window(instance, gpu, start, end, **filters) | {"format": format}
        out, part = Path(path), Path(f"{path}.part")
        attempt = 0
        while True:
            try:
                with self._http.stream("GET", EXPORT_PATH, params=params) as response:
                    if response.status_code == 200:
                        with part.open("wb") as f:
                            for chunk in response.iter_bytes():  # as they arrive: re-chunking costs a copy
                                f.write(chunk)
                        part.replace(out)
                        return out
                    response.read()
                    wait = self._core.retry_wait(response, attempt)
            except httpx.TransportError as exc:
                wait = self._core.retry.transport_failure(exc, attempt, self._http.base_url)
            self._sleep(wait)
            attempt += 1

    def capture(self, instance: str, gpu: int, seconds: int) -> CaptureRequest:
        """Ask ``instance``'s agent for every span of GPU ``gpu`` for ``seconds`` (admin token; audited).

        The agent is told in its next ingest answer and starts the window then (docs/wire.md);
        :meth:`wait_capture` follows the request until every span of the window is stored.
        """
        body = {"instance": instance, "gpu": gpu, "seconds": seconds}
        result: CaptureRequest = self._core.json(self._get(CAPTURES_PATH, {}, body), CaptureRequest.from_json)
        return result

    def pending_captures(self, instance: str) -> list[CaptureRequest]:
        return self.captures(instance, "pending")

    def captures(self, instance: str, state: str = "pending") -> list[CaptureRequest]:
        """The instance's capture requests in ``state`` (``any``: the newest 100 in every state)."""
        body = self._core.json(self._get(CAPTURES_PATH, {"instance": instance, "state": state}), dict)
        return [CaptureRequest.from_json(c) for c in body["captures"]]

    def capture_status(self, capture_id: str) -> CaptureRequest:
        """One capture request as it stands now."""
        result: CaptureRequest = self._core.json(
            self._get(f"{CAPTURES_PATH}/{quote(capture_id, safe='')}", {}), CaptureRequest.from_json
        )
        return result

    def wait_capture(self, capture_id: str, timeout_s: float = 120.0, poll_s: float = 0.5) -> CaptureRequest:
        """Poll until the request is ``done`` or ``expired`` and return it; TimeoutError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            req = self.capture_status(capture_id)
            if req.finished:
                return req
            if time.monotonic() >= deadline:
                raise TimeoutError(f"capture {capture_id} still {req.state} after {timeout_s:g} s")
            self._sleep(poll_s)


class AsyncTimelineClient(_AsyncClosing):
    """:class:`TimelineClient` for asyncio."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 60.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self._core = _TimelineCore(retries, backoff_s, max_backoff_s)
        self._http = httpx.AsyncClient(
            base_url=url, headers=_headers(token), timeout=timeout, transport=transport
        )
        self._sleep = sleep

    async def _get(
        self, path: str, params: Mapping[str, str], body: Mapping[str, Any] | None = None
    ) -> httpx.Response:
        async def send() -> httpx.Response:
            if body is None:
                return await self._http.get(path, params=dict(params))
            return await self._http.post(path, json=dict(body))

        return await _aretried(send, self._core.outcome, self._core.retry, self._http.base_url, self._sleep)

    async def spans(
        self,
        instance: str,
        gpu: int,
        start: TimeLike,
        end: TimeLike,
        *,
        stream: int | None = None,
        kernel: str | None = None,
        min_duration_ns: int = 0,
        pod: str | None = None,
        namespace: str | None = None,
        container: str | None = None,
        page_size: int = 1000,
    ) -> list[Span]:
        params = self._core.window(
            instance, gpu, start, end, stream, kernel, min_duration_ns, pod, namespace, container
        )
        params["limit"] = str(page_size)
        out: list[Span] = []
        while True:
            body = self._core.json(await self._get(SPANS_PATH, params), dict)
            out.extend(Span.from_json(s) for s in body["spans"])
            if body.get("next_cursor") is None:
                return out
            params["cursor"] = str(body["next_cursor"])

    async def summary(
        self,
        instance: str,
        gpu: int,
        start: TimeLike,
        end: TimeLike,
        *,
        kernels: int = 50,
        slowest: int = 5,
        **filters: Any,
    ) -> TimelineSummary:
        """:meth:`TimelineClient.summary`; ``filters`` as its (stream, kernel, pod, ...)."""
        params = self._core.window(instance, gpu, start, end, **filters) | {
            "kernels": str(kernels),
            "slowest": str(slowest),
        }
        result: TimelineSummary = self._core.json(
            await self._get(SUMMARY_PATH, params), TimelineSummary.from_json
        )
        return result

    async def correlation(self, instance: str, gpu: int, start: TimeLike, end: TimeLike) -> Correlation:
        params = self._core.window(instance, gpu, start, end)
        result: Correlation = self._core.json(
            await self._get(CORRELATION_PATH, params), Correlation.from_json
        )
        return result

    async def export(
        self, instance: str, gpu: int, start: TimeLike, end: TimeLike, *, format: str = "json", **filters: Any
    ) -> bytes:
        params = self._core.window(instance, gpu, start, end, **filters) | {"format": format}
        return (await self._get(EXPORT_PATH, params)).content

    async def to_perfetto(
        self,
        path: str | Path,
        instance: str,
        gpu: int,
        start: TimeLike,
        end: TimeLike,
        *,
        format: str = "json",
        **filters: Any,
    ) -> Path:
        params = self._core.window(instance, gpu, start, end, **filters) | {"format": format}
        out, part = Path(path), Path(f"{path}.part")
        attempt = 0
        while True:
            try:
                async with self._http.stream("GET", EXPORT_PATH, params=params) as response:
                    if response.status_code == 200:
                        with part.open("wb") as f:
                            async for chunk in response.aiter_bytes():
                                f.write(chunk)
                        part.replace(out)
                        return out
                    await response.aread()
                    wait = self._core.retry_wait(response, attempt)
            except httpx.TransportError as exc:
                wait = self._core.retry.transport_failure(exc, attempt, self._http.base_url)
            await self._sleep(wait)
            attempt += 1

    async def capture(self, instance: str, gpu: int, seconds: int) -> CaptureRequest:
        body = {"instance": instance, "gpu": gpu, "seconds": seconds}
        response = await self._get(CAPTURES_PATH, {}, body)
        result: CaptureRequest = self._core.json(response, CaptureRequest.from_json)
        return result

    async def captures(self, instance: str, state: str = "pending") -> list[CaptureRequest]:
        body = self._core.json(await self._get(CAPTURES_PATH, {"instance": instance, "state": state}), dict)
        return [CaptureRequest.from_json(c) for c in body["captures"]]

    async def capture_status(self, capture_id: str) -> CaptureRequest:
        response = await self._get(f"{CAPTURES_PATH}/{quote(capture_id, safe='')}", {})
        result: CaptureRequest = self._core.json(response, CaptureRequest.from_json)
        return result

    async def wait_capture(
        self, capture_id: str, timeout_s: float = 120.0, poll_s: float = 0.5
    ) -> CaptureRequest:
        deadline = time.monotonic() + timeout_s
        while True:
            req = await self.capture_status(capture_id)
            if req.finished:
                return req
            if time.monotonic() >= deadline:
                raise TimeoutError(f"capture {capture_id} still {req.state} after {timeout_s:g} s")
            await self._sleep(poll_s)
