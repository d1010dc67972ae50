"""CUDA-event spans: how long code really runs on the device, without synchronising the hot path.

``span("flash_attn")`` records a start and an end event on the current
stream (PyTorch or CuPy, whichever the process uses); a background reaper
reads the elapsed time once the end event has completed and writes a KERNEL
record into the GPU's ring.  Without a GPU the same code runs on a CPU clock
back end, so the logic is the same everywhere.

Example::

    from kernel_insight.probe import span, instrument_torch

    with span("flash_attn"):
        out = attention(q, k, v)

    @span("optimizer_step")
    def step(): ...

    handle = instrument_torch(model)   # a span around every module's forward
"""

from __future__ import annotations

import atexit
import collections
import functools
import importlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, ParamSpec, Protocol, TypeVar

from kernel_insight.agent.ring import Ring, ring_name

__all__ = [
    "Backend",
    "CpuBackend",
    "CupyBackend",
    "Probe",
    "TorchBackend",
    "TorchHooks",
    "configure",
    "default_probe",
    "instrument_torch",
    "span",
]

log = logging.getLogger("kernel_insight.probe")
P = ParamSpec("P")
R = TypeVar("R")
_S = 1_000_000_000
#: Device and host clocks drift apart; elapsed times from one old anchor lose float precision too.
REANCHOR_S = 10.0


class Backend(Protocol):
    """How to record and read timing events on one kind of device.

    ``begin`` and ``end`` are the hot path: one call each per span.
    """

    name: str

    def begin(self, stream: Any) -> tuple[Any, Any, int, int]: ...  # (start event, stream, stream id, device)
    def end(self, stream: Any) -> Any: ...  # the end event, recorded on stream
    def done(self, event: Any) -> bool: ...
    def elapsed_ns(self, start: Any, end: Any) -> int: ...
    def anchor(self) -> tuple[Any, int]: ...  # (completed event, CLOCK_REALTIME ns when it completed)
    def release(self, event: Any) -> None: ...


class CpuBackend:
    """Host monotonic clock: an "event" is the time it was recorded (an int), always complete."""

    name = "cpu"

    def __init__(self, device: int | None = None) -> None:
        self._device = int(os.environ.get("KI_PROBE_GPU", "0")) if device is None else device

    def begin(self, stream: Any) -> tuple[int, Any, int, int]:
        return time.monotonic_ns(), stream, stream if isinstance(stream, int) else 0, self._device

    def end(self, stream: Any) -> int:
        return time.monotonic_ns()

    def done(self, event: int) -> bool:
        return True

    def elapsed_ns(self, start: int, end: int) -> int:
        return end - start

    def anchor(self) -> tuple[int, int]:
        mono, real = time.monotonic_ns(), time.time_ns()
        return mono, real

    def release(self, event: int) -> None:
        pass


class _EventPool:
    """Timing events are costly to create (a driver call each); spans reuse them."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._free: collections.deque[Any] = collections.deque()

    def get(self) -> Any:
        try:
            return self._free.pop()
        except IndexError:
            return self._make()

    def put(self, event: Any) -> None:
        self._free.append(event)


class TorchBackend:
    """``torch.cuda.Event(enable_timing=True)`` on the current (or given) stream."""

    name = "torch"

    def __init__(self) -> None:
        self._torch = importlib.import_module("torch")
        self._pool = _EventPool(lambda: self._torch.cuda.Event(enable_timing=True))

    def begin(self, stream: Any) -> tuple[Any, Any, int, int]:
        cuda = self._torch.cuda
        s = cuda.current_stream() if stream is None else stream
        ev = self._pool.get()
        ev.record(s)
        return ev, s, int(s.cuda_stream), int(s.device.index or 0)

    def end(self, stream: Any) -> Any:
        ev = self._pool.get()
        ev.record(stream)
        return ev

    def done(self, event: Any) -> bool:
        return bool(event.query())

    def elapsed_ns(self, start: Any, end: Any) -> int:
        return int(start.elapsed_time(end) * 1e6)

    def anchor(self) -> tuple[Any, int]:
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record(self._torch.cuda.current_stream())
        ev.synchronize()
        return ev, time.time_ns()

    def release(self, event: Any) -> None:
        self._pool.put(event)


class CupyBackend:
    """``cupy.cuda.Event()`` on the current (or given) stream."""

    name = "cupy"

    def __init__(self) -> None:
        self._cp = importlib.import_module("cupy")
        self._pool = _EventPool(lambda: self._cp.cuda.Event())

    def begin(self, stream: Any) -> tuple[Any, Any, int, int]:
        s = self._cp.cuda.get_current_stream() if stream is None else stream
        ev = self._pool.get()
        ev.record(s)
        return ev, s, int(s.ptr), int(self._cp.cuda.runtime.getDevice())

    def end(self, stream: Any) -> Any:
        ev = self._pool.get()
        ev.record(stream)
        return ev

    def done(self, event: Any) -> bool:
        return bool(event.done)

    def elapsed_ns(self, start: Any, end: Any) -> int:
        return int(self._cp.cuda.get_elapsed_time(start, end) * 1e6)

    def anchor(self) -> tuple[Any, int]:
        ev = self._cp.cuda.Event()
        ev.record(self._cp.cuda.get_current_stream())
        ev.synchronize()
        return ev, time.time_ns()

    def release(self, event: Any) -> None:
        self._pool.put(event)


def _choose_backend() -> Backend:
    """The back end of the GPU library this process already uses; KI_PROBE_BACKEND overrides."""
    want = os.environ.get("KI_PROBE_BACKEND", "auto")
    if want not in ("auto", "torch", "cupy", "cpu"):
        raise ValueError(f"KI_PROBE_BACKEND={want!r}: expected auto, torch, cupy or cpu")
    if want == "cpu":
        return CpuBackend()
    if want in ("auto", "torch") and ("torch" in sys.modules or want == "torch"):
        try:
            torch = importlib.import_module("torch")
            if torch.cuda.is_available():
                return TorchBackend()
        except ImportError:
            pass
        if want == "torch":
            raise ValueError("KI_PROBE_BACKEND=torch but PyTorch with CUDA is not available")
    if want in ("auto", "cupy") and ("cupy" in sys.modules or want == "cupy"):
        try:
            cp = importlib.import_module("cupy")
            if cp.cuda.runtime.getDeviceCount() > 0:
                return CupyBackend()
        except Exception:  # no cupy, or cupy without a device
            pass
        if want == "cupy":
            raise ValueError("KI_PROBE_BACKEND=cupy but CuPy with a CUDA device is not available")
    return CpuBackend()


#: A span in flight: (name id, device, stream id, start event, end event, sequence number,
#: host ns at begin, host ns begin..end, host thread id).
_Pending = tuple[int, int, int, Any, Any, int, int, int, int]
#: What ``begin`` hands to ``end``: the back end's (start event, stream, stream id, device) and the host time.
_Token = tuple[Any, Any, int, int, int]


class Probe:
    """Spans of one process: event pairs in flight, the reaper thread, one ring per device.

    Most code uses the module-level ``span`` and ``instrument_torch``, which
    share ``default_probe()``; tests make their own with a chosen back end.
    """

    def __init__(
        self, backend: Backend | None = None, *, label_prefix: str = "", poll_s: float = 0.01
    ) -> None:
        self._backend = backend
        self.label_prefix = label_prefix
        self.poll_s = poll_s
        self._rings: dict[int, Ring | None] = {}
        self._names: dict[tuple[int, str], int] = {}
        self._pending: collections.deque[_Pending] = collections.deque()
        self._anchors: dict[int, tuple[Any, int, float]] = {}  # device -> (event, real ns, monotonic s)
        self._seq = 0
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        self.written = 0
        self.dropped = 0

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = _choose_backend()
        return self._backend

    # ---- hot path ------------------------------------------------------------------

    def begin(self, stream: Any = None) -> _Token:
        """Record a start event and the host time (the launch); returns what ``end`` needs.  No synchronisation."""
        start, s, sid, dev = (self._backend or self.backend).begin(stream)
        return start, s, sid, dev, time.time_ns()

    def end(self, name: str, token: _Token) -> None:
        """Record the end event and queue the pair for the reaper, with the host side of the span."""
        start, s, sid, dev, launch_ns = token
        ev = (self._backend or self.backend).end(s)
        host_ns = time.time_ns() - launch_ns
        name_id = self._names.get((dev, name))
        if name_id is None:
            name_id = self._name_id(dev, name)
        self._seq += 1
        self._pending.append(
            (name_id, dev, sid, start, ev, self._seq, launch_ns, host_ns, threading.get_native_id())
        )
        if self._reaper is None:
            self._start_reaper()

    # ---- reaper --------------------------------------------------------------------

    def _ring(self, dev: int) -> Ring | None:
        if dev not in self._rings:
            try:
                self._rings[dev] = Ring.attach(ring_name(f"{self.label_prefix}{dev}"), create=True)
            except OSError as e:  # a probe must never break the workload: say so once, then drop
                log.warning("kernel_insight.probe: spans of GPU %d are dropped: %s", dev, e)
                self._rings[dev] = None
        return self._rings[dev]

    def _name_id(self, dev: int, name: str) -> int:
        key = (dev, name)
        sid = self._names.get(key)
        if sid is None:
            ring = self._ring(dev)
            sid = ring.intern(name) if ring is not None else 0
            self._names[key] = sid
        return sid

    def _start_reaper(self) -> None:
        with self._lock:
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap_loop, name="ki-probe-reaper", daemon=True)
                self._reaper.start()
                atexit.register(self.close)

    def _anchor(self, dev: int) -> tuple[Any, int]:
        a = self._anchors.get(dev)
        if a is None or time.monotonic() - a[2] > REANCHOR_S:
            ev, real = self.backend.anchor()
            a = (ev, real, time.monotonic())
            self._anchors[dev] = a
        return a[0], a[1]

    def reap(self) -> int:
        """Write every completed span in order; stops at the first still running. Returns spans written."""
        b = self.backend
        n = 0
        pending = self._pending
        while pending:
            name_id, dev, sid, start, end, seq, launch_ns, host_ns, tid = pending[0]
            if not b.done(end):
                break
            pending.popleft()
            anchor, anchor_real = self._anchor(dev)
            start_ns = anchor_real + b.elapsed_ns(anchor, start)
            end_ns = start_ns + b.elapsed_ns(start, end)
            b.release(start)
            b.release(end)
            ring = self._rings.get(dev)
            if ring is None:
                self.dropped += 1
                continue
            # The host side first (its launch, thread, enqueue time), tied to the kernel by pid and
            # correlation: the timeline's flow from launch to kernel (docs/ring.md, LAUNCH_SPAN).
            ring.launch_span(name_id, dev, launch_ns, self._pid, tid, seq, max(0, host_ns))
            if ring.kernel(name_id, dev, start_ns, end_ns, sid, seq, self._pid) == 0:
                self.written += 1
                n += 1
            else:
                self.dropped += 1
        return n

    def _reap_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.reap()
            except Exception:  # never let a reaper failure reach the workload
                log.exception("kernel_insight.probe: reaper failed; spans dropped")
                self._pending.clear()
            self._wake.wait(self.poll_s)
            self._wake.clear()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every queued span is written (for tests and exit); True when none is left."""
        deadline = time.monotonic() + timeout_s
        while self._pending and time.monotonic() < deadline:
            if self._reaper is None or not self._reaper.is_alive():
                self.reap()
            else:
                self._wake.set()
            time.sleep(0.001)
        return not self._pending

    def close(self) -> None:
        """Flush, stop the reaper and close the rings; safe twice."""
        self.flush(1.0)
        self._stop.set()
        self._wake.set()
        if self._reaper is not None and self._reaper is not threading.current_thread():
            self._reaper.join(timeout=2.0)
        for ring in self._rings.values():
            if ring is not None:
                ring.close()
        self._rings.clear()
        self._names.clear()

    # ---- public surface --------------------------------------------------------

    def span(self, name: str, stream: Any = None) -> span:
        return span(name, stream, probe=self)


_default: Probe | None = None
_default_lock = threading.Lock()


def default_probe() -> Probe:
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Probe(label_prefix=os.environ.get("KI_PROBE_LABEL_PREFIX", ""))
    return _default


def configure(backend: Backend | None = None, *, label_prefix: str = "") -> Probe:
    """Replace the process's default probe (closing the old one)."""
    global _default
    with _default_lock:
        if _default is not None:
            _default.close()
        _default = Probe(backend, label_prefix=label_prefix)
        return _default


class span:
    """A timed region: a context manager, or a decorator when called on a function.

    Example::

        with span("flash_attn", stream=s):
            ...

        @span("loss")
        def compute_loss(...): ...
    """

    __slots__ = ("_probe", "_tokens", "name", "stream")

    def __init__(self, name: str, stream: Any = None, *, probe: Probe | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("span(): name must be a non-empty string")
        self.name = name
        self.stream = stream
        self._probe = probe
        self._tokens: list[_Token] = []  # a stack: the same span object may nest

    def __enter__(self) -> span:
        probe = self._probe or default_probe()
        self._tokens.append(probe.begin(self.stream))
        return self

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        probe = self._probe or default_probe()
        probe.end(self.name, self._tokens.pop())

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with span(self.name, self.stream, probe=self._probe):
                return fn(*args, **kwargs)

        return wrapper


class TorchHooks:
    """The hooks ``instrument_torch`` added; ``remove()`` takes them all off."""

    def __init__(self, handles: list[Any], modules: list[str]) -> None:
        self._handles = handles
        self.modules = modules

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> TorchHooks:
        return self

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()


def _named_modules(model: Any, max_depth: int | None) -> Iterator[tuple[str, Any]]:
    for qualname, module in model.named_modules():
        depth = 0 if not qualname else qualname.count(".") + 1
        if max_depth is None or depth <= max_depth:
            yield qualname, module


def instrument_torch(
    model: Any,
    *,
    prefix: str | None = None,
    max_depth: int | None = None,
    include: Callable[[str, Any], bool] | None = None,
    probe: Probe | None = None,
) -> TorchHooks:
    """Add a span around the forward pass of ``model`` and its submodules (forward pre- and post-hooks).

    Spans are named ``<prefix>.<qualified module name>`` (prefix: the model's
    class name); ``max_depth`` limits how deep (0: the model only), ``include``
    chooses modules by name and object.
    """
    if not hasattr(model, "named_modules") or not hasattr(model, "register_forward_pre_hook"):
        raise TypeError(f"instrument_torch(): expected a torch.nn.Module, got {type(model).__name__}")
    root = prefix if prefix is not None else type(model).__name__
    handles: list[Any] = []
    names: list[str] = []
    for qualname, module in _named_modules(model, max_depth):
        if include is not None and not include(qualname, module):
            continue
        name = f"{root}.{qualname}" if qualname else root
        s = span(name, probe=probe)
        handles.append(module.register_forward_pre_hook(_pre_hook(s)))
        handles.append(module.register_forward_hook(_post_hook(s), always_call=True))
        names.append(name)
    return TorchHooks(handles, names)


def _pre_hook(s: span) -> Callable[..., None]:
    def hook(module: Any, args: Any) -> None:
        s.__enter__()

    return hook


def _post_hook(s: span) -> Callable[..., None]:
    def hook(module: Any, args: Any, output: Any) -> None:
        s.__exit__(None, None, None)

    return hook
