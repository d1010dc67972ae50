"""Connection limits for the collector's HTTP server: a cap on open connections, request head and
body deadlines, and the file-descriptor budget they fit in (docs/security.md).

uvicorn alone keeps a connection that sent half a request head open for ever, and its
``limit_concurrency`` counts such connections against legitimate requests, so a flood of
half-sent requests starves everyone (and, past the descriptor limit, the store itself).
:func:`guarded_protocol` returns uvicorn's h11 protocol with three rules added:

- the request head must arrive within ``header_timeout_s`` of the connection opening (or of
  its first byte on a kept-alive connection, which waits ``keep_alive_s`` for it after a
  response and is then closed without a word), else 408 and close;
- the request body must arrive within ``body_timeout_s`` of its head, else 408 and close;
- at most ``max_connections`` are open: a new connection past the cap closes the oldest one
  that is still waiting for its first request head (the slow ones are the cheap ones to drop),
  else the one idle longest after a response if it has been idle for ``IDLE_EVICTABLE_S``, and
  is answered 503 itself otherwise (every open connection busy with a request or in use by a
  client between two of its requests).

A connection whose next request has reached this host but not yet been read (the loop was
held past the deadline or the eviction, or read its accept first) is in use: it is neither
evicted nor timed out, since closing a socket with unread bytes resets it and loses the request.

Connections already being closed (evicted, timed out, refused) are not counted: uvicorn keeps
one in its set until its ``connection_lost``, a later turn of the loop, and newcomers counting
it would close more connections than they bring (the waiting ones first, then kept-alive
clients). A kept-alive connection is in use while its
client sends requests one after another: closing it between two of them loses the request
that is already on its way (the client sees a reset), where a 503 to a newcomer, which has sent
nothing, loses nothing; uvicorn (``limit_concurrency``), Envoy and HAProxy likewise refuse or
queue newcomers at their limit and never close a connection in use, and nginx reclaims only
idle keep-alive connections.

Example::

    limits = ConnectionLimits(max_connections=256)
    uvicorn.Config(app, http=guarded_protocol(limits), backlog=limits.backlog)
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import resource
import sys
import termios
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from kernel_insight.api.defaults import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_KEEP_ALIVE_S,
    DEFAULT_MAX_CONNECTIONS,
)

__all__ = [
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_KEEP_ALIVE_S",
    "DEFAULT_MAX_CONNECTIONS",
    "IDLE_EVICTABLE_S",
    "ConnectionLimits",
    "QuickAnswer",
    "QuickRouter",
    "ResponseWriter",
    "guarded_protocol",
    "raise_nofile_limit",
]

#: Connections the kernel queues before the server accepts them.
DEFAULT_BACKLOG = 2048
#: Largest request head (request line and headers) accepted, in bytes.
DEFAULT_MAX_HEAD_BYTES = 64 << 10
#: Seconds a kept-alive connection must have been idle before a newcomer past the cap may take
#: its place: a client asking again within this is using it (a poller, a dashboard, an agent).
IDLE_EVICTABLE_S = 1.0
#: Descriptors kept for everything but client connections (the store, logs, key files, threads).
RESERVED_FDS = 512
#: Seconds a deadline that found its connection's next bytes unread waits for the loop to read them.
_UNREAD_GRACE_S = 0.05

log = logging.getLogger("kernel_insight.api.connections")

_TIMEOUT_408 = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)
_HEAD_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)
_FULL_503 = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
)


#: Writes one whole HTTP response: status, headers, body.
ResponseWriter = Callable[[int, Sequence[tuple[bytes, bytes]], bytes], None]
#: A request the HTTP protocol answers itself: called once the request is complete; True once it
#: wrote the answer, False when the request must go through the ASGI app after all (nothing written).
QuickAnswer = Callable[[ResponseWriter], bool]
#: Looks at a request head (method, path, query string, headers as uvicorn keeps them) and the
#: connection's own state (a dict the router may keep things in between this connection's
#: requests, dropped with it): the request's :data:`QuickAnswer`, or None for the ASGI app
#: (``QueryFastPath.at_once``).
QuickRouter = Callable[[str, str, bytes, Sequence[tuple[bytes, bytes]], dict[str, Any]], QuickAnswer | None]


def _raw(template: bytes, text: str) -> bytes:
    body = text.encode()
    return template % (len(body), body)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one collector process lets clients hold; ``ki collector`` flags set each field."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S
    backlog: int = DEFAULT_BACKLOG
    max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {self.max_connections}")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be positive, not {value}")
        if self.backlog < 1 or self.max_head_bytes < 1024:
            raise ValueError("backlog must be at least 1 and max_head_bytes at least 1024")

    def fitted(self, nofile: int) -> ConnectionLimits:
        """These limits with the connection cap and backlog lowered to fit ``nofile`` descriptors.

        Connections past the cap are accepted (a descriptor each, up to ``backlog`` in one accept
        round) before they are closed, so cap + backlog + the reserve must stay under the limit:
        a server out of descriptors can no longer open its own files.
        """
        room = max(nofile - RESERVED_FDS, 64)
        cap = max(min(self.max_connections, room - min(self.backlog, room // 4)), 1)
        # One accept round takes up to ``backlog`` connections before any of them is read; at
        # most half the cap per round leaves a legitimate newcomer time to send its request head
        # before later newcomers could evict it.
        backlog = max(min(self.backlog, room // 4, cap // 2), 1)
        if (cap, backlog) == (self.max_connections, self.backlog):
            return self
        return ConnectionLimits(
            cap, self.header_timeout_s, self.body_timeout_s, self.keep_alive_s, backlog, self.max_head_bytes
        )


def raise_nofile_limit() -> int:
    """Raise this process's soft descriptor limit to its hard limit; returns the soft limit now in force.

    Linux starts most processes at a soft limit of 1024, which a few hundred idle
    connections and the store's files exhaust; the hard limit is what the administrator allows.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


if TYPE_CHECKING:
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Base
else:
    _Base = object


class _Deadline:
    """A deadline a connection sets again for every request without a loop timer each time.

    A keep-alive connection waits for a head after every response: a ``call_later`` per request
    and its ``cancel`` when the head came (a timer handle made and freed each time) were a visible
    share of a small query's request (`make bench-kql`). Here the timer is made once and left running when the deadline
    is stopped; when it fires it looks at the deadline now in force: none (stopped), later (set
    again since: it waits on until then) or passed (``fire``). A deadline set earlier than the
    timer (a keep-alive wait is shorter than a head's) arms it again then.
    """

    __slots__ = ("_armed", "_at", "_fire", "_handle", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, fire: Callable[[], None]) -> None:
        self._loop = loop
        self._fire = fire
        self._at: float | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._armed = 0.0  # when the timer fires

    @property
    def running(self) -> bool:
        return self._at is not None

    def start(self, seconds: float) -> None:
        self.until(self._loop.time() + seconds)

    def until(self, at: float) -> None:
        """The deadline at loop time ``at``."""
        self._at = at
        if self._handle is None or at < self._armed:
            if self._handle is not None:
                self._handle.cancel()
            self._handle, self._armed = self._loop.call_at(at, self._check), at

    def stop(self) -> None:
        self._at = None

    def close(self) -> None:
        """Stop, and drop the timer (the connection is gone: nothing keeps it alive)."""
        self._at = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        self._handle = None
        at = self._at
        if at is None:
            return
        if self._loop.time() < at:
            self._handle, self._armed = self._loop.call_at(at, self._check), at
            return
        self._at = None
        self._fire()


class _Guard(_Base):
    """Head/body deadlines, a head size cap and the connection cap over one of uvicorn's HTTP/1.1
    protocols (see the module docstring); the concrete classes say where a request stands."""

    limits: ClassVar[ConnectionLimits]
    #: Connections waiting for their first request head, oldest first (dicts keep insertion order).
    waiting: ClassVar[dict[_Guard, None]]
    #: Connections waiting for a later request head (kept alive after a response), oldest first.
    idle: ClassVar[dict[_Guard, None]]
    #: Connections this guard closed whose ``connection_lost`` has not come yet (still in uvicorn's
    #: ``connections``, no longer open for the cap).
    closing: ClassVar[set[_Guard]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline = _Deadline(self.loop, self._head_expired)
        self._body_deadline = _Deadline(self.loop, self._body_expired)
        self._head_bytes = 0  # bytes received since the connection started waiting for a head
        self._head_since = 0.0  # loop time it started waiting for a head
        self._served = False  # answered a request already: evicted only after those that never were

    def _phase(self) -> str:
        """``head`` (waiting for a request head), ``body`` (its body) or ``busy`` (being answered)."""
        raise NotImplementedError

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) - len(self.closing) > self.limits.max_connections and not self._evict_one():
            log.warning(
                "connection limit (%d) reached and every connection is busy or in use: refusing new connections",
                self.limits.max_connections,
            )
            self._close(_FULL_503, "too many connections; retry later\n")
            return
        self._track()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timers()
        self._unlist()
        self.closing.discard(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._listed():
            if not self._head_bytes and self._served:
                # The keep-alive wait is over: the head now has its own deadline from its first byte.
                self._head_deadline.start(self.limits.header_timeout_s)
            self._head_bytes += len(data)
        super().data_received(data)
        self._track()
        if self._listed() and self._head_bytes > self.limits.max_head_bytes:
            self._close(_HEAD_431, f"request head larger than {self.limits.max_head_bytes} bytes\n")

    def on_response_complete(self) -> None:
        self._served = True
        self._response_done()
        # A new wait for a head starts now (its deadline and byte count), also for a request
        # answered within the data_received that brought it (the protocol's quick answers),
        # which never left the waiting lists.
        self._unlist()
        self._track()

    def _response_done(self) -> None:
        """The protocol's own end of a response (uvicorn's ``on_response_complete``)."""
        super().on_response_complete()

    def _listed(self) -> bool:
        return self in self.waiting or self in self.idle

    def _unlist(self) -> None:
        self.waiting.pop(self, None)
        self.idle.pop(self, None)

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest for its first request head, else the one
        idle longest after a response (a client that proved itself) if it is no longer in use
        (idle ``IDLE_EVICTABLE_S`` and no request waiting unread); False when none may go."""
        for victim in self.waiting:
            if victim is not self and not victim._unread():
                victim._close(None, "")
                return True
        since = self.loop.time() - IDLE_EVICTABLE_S
        for victim in self.idle:  # idle longest first: the first one idle too briefly ends the search
            if victim._head_since > since:
                break
            if victim is not self and not victim._unread():
                victim._close(None, "")
                return True
        return False

    def _unread(self) -> int:
        """Bytes that reached this connection's socket and are not read yet (0 when unknown).

        The loop reads them in the same turn, but uvloop runs due timers before it polls the
        sockets, and an accept may come before a read: a request sent in time can still be
        unread when a deadline fires or a newcomer looks for a victim.
        """
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is None:
            return 0
        try:
            fd = sock.fileno()
            if fd < 0:
                return 0
            return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, bytes(4)), sys.byteorder, signed=True)
        except (OSError, ValueError):
            return 0

    def _track(self) -> None:
        """Start or stop the deadlines and the eviction entry after the parser's state moved."""
        if self.transport is None or self.transport.is_closing():
            self._stop_timers()
            self._unlist()
            return
        phase = self._phase()
        if phase == "head":
            if not self._listed():
                (self.idle if self._served else self.waiting)[self] = None
                self._head_bytes = 0
                self._body_deadline.stop()
                self._head_since = self.loop.time()
                # After a response the first byte of the next request is due within the
                # keep-alive time (uvicorn's own timer, a call_later per response, is not
                # armed over httptools, and would cost a timer a request), the whole head within its deadline.
                wait = self.limits.keep_alive_s if self._served else self.limits.header_timeout_s
                self._head_deadline.until(self._head_since + wait)
            return
        self._unlist()
        self._head_deadline.stop()
        if phase == "body":
            if not self._body_deadline.running:
                self._body_deadline.start(self.limits.body_timeout_s)
        else:
            self._body_deadline.stop()

    def _head_expired(self) -> None:
        if self._unread():  # sent in time, not read yet: read first, then look again
            self._head_deadline.start(_UNREAD_GRACE_S)
            return
        # An idle keep-alive connection is just closed; a half-sent head is told why.
        if self._head_bytes:
            self._close(_TIMEOUT_408, "request head not received in time\n")
        else:
            self._close(None, "")

    def _body_expired(self) -> None:
        if self.cycle is not None and not self.cycle.response_started:
            self._close(_TIMEOUT_408, "request body not received in time\n")
        else:
            self._close(None, "")

    def _close(self, template: bytes | None, why: str) -> None:
        self._stop_timers()
        self._unlist()
        if self.transport is None or self.transport.is_closing():
            return
        if template is not None:
            self.transport.write(_raw(template, why))
        self.closing.add(self)
        self.transport.close()

    def _stop_timers(self) -> None:
        self._head_deadline.close()
        self._body_deadline.close()


class _GuardedH11(_Guard, H11Protocol):
    """Over h11 (pure Python): the request's stage is h11's own state."""

    def _phase(self) -> str:
        theirs = self.conn.their_state
        if theirs is h11.IDLE and (self.cycle is None or self.cycle.response_complete):
            return "head"
        return "body" if theirs is h11.SEND_BODY else "busy"

    def handle_events(self) -> None:
        super().handle_events()
        self._track()

    def timeout_keep_alive_handler(self) -> None:
        """uvicorn's keep-alive timer closes whatever is unread; the guard's head deadline, armed
        for ``keep_alive_s`` after each response, closes an idle connection instead."""


class _HeadWithBody:
    """The transport a response is written to, holding the response head until the first body
    write so that both leave in one ``send`` (uvicorn writes them apart).

    On loopback each ``send`` runs the whole delivery to the client, and the client wakes for
    the head alone and again for the body: one write instead of two makes a small query's answer
    cheaper (`make bench-kql`). Everything but ``write`` and ``close`` is the real transport's.
    """

    __slots__ = ("_cycle", "_head", "_held", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self._transport = transport
        self._cycle = cycle
        self._head: bytes | None = None
        self._held = False  # the head was held once (later writes go straight out)

    def write(self, data: bytes) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            self._transport.writelines((head, data))
        elif not self._held and self._cycle.response_started:  # the head (a 100 Continue goes out at once)
            self._head, self._held = data, True
        else:
            self._transport.write(data)

    def close(self) -> None:
        if self._head is not None:  # a response cut off after its head: the head still goes first
            self._transport.write(self._head)
            self._head = None
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _httptools_class() -> type[asyncio.Protocol] | None:
    """The guard over httptools (a C parser, what uvicorn prefers when installed), or None without it."""
    try:
        import httptools
        from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
    except ImportError:
        return None

    class _GuardedHttpTools(_Guard, HttpToolsProtocol):  # type: ignore[misc]
        """Over httptools: its parser callbacks say where the request stands.

        A request that ``quick`` answers (a :data:`QuickRouter`; none by default) is answered
        here when its message is complete, with no ASGI request cycle (a task, a cycle object,
        its event and the ASGI messages: a large share of a small query, `make bench-kql`); every other
        request goes through uvicorn's cycle unchanged. Only a plain ``GET`` on a kept-alive
        connection: no body, no ``Expect``, no upgrade, not pipelined behind an answer still
        being written.
        """

        @staticmethod
        def quick(
            method: str,
            path: str,
            query: bytes,
            headers: Sequence[tuple[bytes, bytes]],
            state: dict[str, Any],
        ) -> QuickAnswer | None:
            """The :data:`QuickRouter` (``guarded_protocol``'s ``quick``); by default none is answered here."""
            return None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._stage = "head"
            self._quick: QuickAnswer | None = None  # the request being read is answered here
            self._quick_state: dict[str, Any] = {}  # the QuickRouter's, for this connection
            super().__init__(*args, **kwargs)

        def _phase(self) -> str:
            return self._stage

        def on_headers_complete(self) -> None:
            self._stage = "body"
            self._quick = self._quick_answer()
            if self._quick is None:
                self._start_cycle()

        def _start_cycle(self) -> None:
            """The request to the ASGI app, as uvicorn starts it."""
            super().on_headers_complete()
            self.cycle.transport = _HeadWithBody(self.transport, self.cycle)  # type: ignore[assignment]

        def _quick_answer(self) -> QuickAnswer | None:
            if self.parser.get_method() != b"GET":
                return None
            if (
                self.pipeline
                or self.transport.is_closing()
                or (self.cycle is not None and not self.cycle.response_complete)
                or self.flow.write_paused
                or self.expect_100_continue
                or self.access_log
                or self.root_path
                or self.limit_concurrency is not None
                or self.parser.should_upgrade()
            ):
                return None  # what uvicorn's cycle does for these is left to it
            for name, _ in self.headers:
                if name == b"content-length" or name == b"transfer-encoding":
                    return None  # a body to read: uvicorn's cycle reads it (and its deadline)
            url = httptools.parse_url(self.url)
            try:
                path = url.path.decode("ascii")
            except UnicodeDecodeError:
                return None
            if self.parser.get_http_version() == "1.0" or not self.parser.should_keep_alive():
                # The answer ends the connection: uvicorn's cycle closes it and starts no request
                # pipelined behind it (answered here, one could start before the close lands).
                return None
            try:
                return self.quick("GET", path, url.query or b"", self.headers, self._quick_state)
            except Exception:  # the app's to answer (and log), as any request
                log.warning("could not look at a request for a quick answer", exc_info=True)
                return None

        def on_message_complete(self) -> None:
            quick, self._quick = self._quick, None
            if quick is not None:
                self._stage = "busy"
                if quick(self._write_whole):
                    self.on_response_complete()
                    return
                self._start_cycle()  # the work raised: the app answers it as it always does
            # Answered before its body was read (a refusal): the next thing to come is a head.
            self._stage = "head" if self.cycle.response_complete else "busy"
            super().on_message_complete()

        def _write_whole(self, status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes) -> None:
            """A whole response in one write, in the bytes uvicorn's cycle writes (its default
            headers first: date, server; ``connection: close`` when the connection ends)."""
            keep_alive, said_close = True, False  # only kept-alive connections are answered here
            content = [STATUS_LINE[status]]
            for name, value in self.server_state.default_headers:
                content += (name, b": ", value, b"\r\n")
            for name, value in headers:
                name = name.lower()
                if name == b"connection" and b"close" in [t.lower().strip() for t in value.split(b",")]:
                    keep_alive, said_close = False, True
                content += (name, b": ", value, b"\r\n")
            if not keep_alive and not said_close:
                content.append(b"connection: close\r\n")
            content += (b"\r\n", body)
            self.transport.write(b"".join(content))
            if not keep_alive:
                self.transport.close()

        def on_response_complete(self) -> None:
            if self._stage == "busy" and not self.pipeline:  # a pipelined request is answered next
                self._stage = "head"
            super().on_response_complete()

        def _response_done(self) -> None:
            """uvicorn's end of a response without its keep-alive timer: the guard's head
            deadline closes a connection idle for ``keep_alive_s`` (one timer per connection,
            not a ``call_later`` and ``cancel`` per request). A pipelined request is started
            by uvicorn's own (which arms no timer then)."""
            if self.pipeline:
                super()._response_done()
                return
            self.server_state.total_requests += 1
            if not self.transport.is_closing():
                self.flow.resume_reading()

    return _GuardedHttpTools


def guarded_protocol(
    limits: ConnectionLimits, *, parser: str = "auto", quick: QuickRouter | None = None
) -> type[asyncio.Protocol]:
    """An HTTP protocol class for ``uvicorn.Config(http=...)`` enforcing ``limits``.

    ``parser``: ``httptools`` (C, fast), ``h11`` (pure Python), or ``auto`` (httptools when
    installed, as uvicorn chooses). Each call makes a class of its own, so two servers in one
    process keep separate counts. ``quick``: the requests answered by the protocol itself,
    without an ASGI request cycle (over httptools only; ``QueryFastPath.at_once``).
    """
    base: type[asyncio.Protocol] = _GuardedH11
    if parser in ("auto", "httptools"):
        fast = _httptools_class()
        if fast is None and parser == "httptools":
            raise ValueError("the httptools parser is not installed")
        base = fast or _GuardedH11
    elif parser != "h11":
        raise ValueError(f"unknown HTTP parser {parser!r} (auto, httptools or h11)")
    namespace: dict[str, Any] = {"limits": limits, "waiting": {}, "idle": {}, "closing": set()}
    if quick is not None:
        namespace["quick"] = staticmethod(quick)
    return type("GuardedHttpProtocol", (base,), namespace)
