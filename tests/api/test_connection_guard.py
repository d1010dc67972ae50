"""The connection guard over both of uvicorn's HTTP/1.1 parsers (h11 and httptools): head and
body deadlines, the head size cap, the connection cap and who it evicts. ``ki collector`` uses
httptools when it is installed (it is a dependency); h11 is uvicorn's fallback."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import uvicorn
from api_helpers import read_until_closed
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from load_clients import Flood
from starlette.requests import ClientDisconnect

from kernel_insight.api.app import listening_socket
from kernel_insight.api.connections import (
    IDLE_EVICTABLE_S,
    ConnectionLimits,
    QuickAnswer,
    QuickRouter,
    ResponseWriter,
    guarded_protocol,
)

LIMITS = ConnectionLimits(
    max_connections=8,
    header_timeout_s=0.5,
    body_timeout_s=0.5,
    keep_alive_s=5,
    backlog=4,
    max_head_bytes=4096,
)
PARSERS = ["h11", "httptools"]


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/ok")
    async def ok() -> JSONResponse:
        return JSONResponse({"ok": True})

    @app.get("/block")
    async def block(seconds: float) -> JSONResponse:
        time.sleep(seconds)  # holds the event loop, as a loaded machine or a GIL-bound thread can
        return JSONResponse({"blocked": seconds})

    @app.post("/echo")
    async def echo(request: Request) -> JSONResponse:
        n = 0
        try:
            async for chunk in request.stream():
                n += len(chunk)
        except ClientDisconnect:
            return JSONResponse({"gone": True}, status_code=400)
        return JSONResponse({"bytes": n})

    return app


@contextlib.contextmanager
def serving(
    parser: str, limits: ConnectionLimits = LIMITS, quick: QuickRouter | None = None
) -> Iterator[tuple[str, int]]:
    sock = listening_socket("127.0.0.1", 0, backlog=limits.backlog)
    http = guarded_protocol(limits, parser=parser, quick=quick)
    config = uvicorn.Config(
        _app(), http=http, log_level="warning", lifespan="off", ws="none", access_log=quick is None
    )  # requests are answered quickly only without access lines, as ``ki collector`` runs
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive(), "uvicorn exited"
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield sock.getsockname()[:2]
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()


def _exchange(addr: tuple[str, int], data: bytes, wait_s: float = 10) -> bytes:
    """Send ``data`` and read until the server closes the connection."""
    with socket.create_connection(addr, timeout=wait_s) as s:
        s.sendall(data)
        return read_until_closed(s, wait_s)


def _request(addr: tuple[str, int], path: str = "/ok") -> bytes:
    return _exchange(addr, f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())


@pytest.fixture(params=PARSERS)
def server(request) -> Iterator[tuple[str, int]]:
    with serving(request.param) as addr:
        yield addr


def test_a_whole_request_is_served(server):
    assert _request(server).startswith(b"HTTP/1.1 200 ")


def test_a_half_sent_head_gets_408_after_the_header_timeout(server):
    start = time.monotonic()
    answer = _exchange(server, b"GET /ok HTTP/1.1\r\nHost: t\r\n")
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert time.monotonic() - start >= LIMITS.header_timeout_s * 0.8


def test_a_head_dripped_slowly_is_cut_at_the_header_timeout_not_renewed_by_each_byte(server):
    with socket.create_connection(server, timeout=10) as s:
        start = time.monotonic()
        s.sendall(b"GET /ok HTTP/1.1\r\n")
        answer = b""
        with contextlib.suppress(OSError):
            for _ in range(100):
                s.sendall(b"X-Drip: 1\r\n" if answer == b"" else b"")
                s.settimeout(0.1)
                with contextlib.suppress(TimeoutError):
                    answer += s.recv(4096)
                if answer:
                    break
        took = time.monotonic() - start
    assert answer.startswith(b"HTTP/1.1 408 "), answer  # not renewed by each line
    assert took < LIMITS.header_timeout_s + 2


def test_an_oversized_head_gets_431(server):
    answer = _exchange(server, b"GET /ok HTTP/1.1\r\nHost: t\r\n" + b"X-Big: " + b"a" * 8000)
    assert answer.startswith(b"HTTP/1.1 431 "), answer


def test_a_stalled_body_gets_408_after_the_body_timeout(server):
    start = time.monotonic()
    answer = _exchange(server, b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert time.monotonic() - start >= LIMITS.body_timeout_s * 0.8


def test_a_body_that_arrives_in_time_is_read(server):
    answer = _exchange(
        server,
        b"POST /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 1000\r\n\r\n" + b"x" * 1000,
    )
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    assert b'"bytes":1000' in answer


def test_past_the_cap_the_connection_waiting_longest_is_closed_and_newcomers_are_served(server):
    idle = [socket.create_connection(server, timeout=10) for _ in range(LIMITS.max_connections)]
    try:
        for s in idle:
            s.sendall(b"GET /ok HTTP/1.1\r\n")  # half a head each
        served = [_request(server) for _ in range(4)]
        assert all(a.startswith(b"HTTP/1.1 200 ") for a in served), served
        idle[0].settimeout(5)
        assert idle[0].recv(100) == b""  # the oldest half-sent connection was closed (no answer)
    finally:
        for s in idle:
            s.close()


def test_when_every_connection_is_busy_a_newcomer_gets_503(server):
    busy = [socket.create_connection(server, timeout=10) for _ in range(LIMITS.max_connections)]
    try:
        for s in busy:  # heads complete, bodies still coming: busy, not evictable
            s.sendall(
                b"POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n"
            )
        for s in busy:
            assert s.recv(100).startswith(b"HTTP/1.1 100 ")  # the server has read this head
        answer = _request(server)
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert b"retry-after: 1" in answer.lower()
    finally:
        for s in busy:
            s.close()


@pytest.mark.parametrize("parser", PARSERS)
def test_a_keep_alive_connection_gets_a_new_head_deadline_after_each_response(parser):
    with serving(parser) as addr, socket.create_connection(addr, timeout=10) as s:
        for _ in range(3):
            s.sendall(b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n")
            got = b""
            while b'{"ok":true}' not in got:
                got += s.recv(4096)
            assert got.startswith(b"HTTP/1.1 200 ")
        s.sendall(b"GET /ok HTTP/1.1\r\n")  # then half a head: 408 after the header timeout
        rest = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(4096):
                rest += chunk
        assert rest.startswith(b"HTTP/1.1 408 "), rest


@pytest.mark.parametrize("parser", PARSERS)
def test_a_kept_alive_connection_idle_for_the_keep_alive_time_is_closed_but_a_started_head_has_its_deadline(
    parser,
):
    """After a response the next request's first byte is due within ``keep_alive_s`` (the guard's
    one timer; uvicorn's own per-response one is not armed over httptools), and once it began,
    the whole head within ``header_timeout_s`` of the response."""
    limits = ConnectionLimits(max_connections=8, header_timeout_s=2.5, keep_alive_s=0.5, backlog=4)

    def served(s: socket.socket) -> float:
        s.sendall(b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n")
        got = b""
        while b'{"ok":true}' not in got:
            got += s.recv(4096)
        return time.monotonic()

    with serving(parser, limits) as addr:
        with socket.create_connection(addr, timeout=10) as s:
            answered = served(s)
            served(s)  # a second request within the keep-alive time
            answered = time.monotonic()
            assert read_until_closed(s, 10) == b""  # idle: closed without a word
            assert 0.4 < time.monotonic() - answered < 2.0
        with socket.create_connection(addr, timeout=10) as s:
            answered = served(s)
            time.sleep(0.3)
            s.sendall(b"GET /ok HTTP/1.1\r\n")  # begun within the keep-alive time, never finished
            rest = read_until_closed(s, 10)
            assert rest.startswith(b"HTTP/1.1 408 "), rest
            assert time.monotonic() - answered > 2.0


@pytest.mark.parametrize("parser", PARSERS)
def test_a_head_deadline_set_again_after_each_response_is_not_cut_short_by_an_earlier_one(parser):
    # The head deadline's timer is made once and re-checked when it fires (not made per request):
    # pauses of 0.6 of the header timeout between requests, 2.4 timeouts in all, are all served.
    with serving(parser) as addr, _kept_alive(addr) as (_, ask):
        for _ in range(4):
            time.sleep(0.6 * LIMITS.header_timeout_s)  # the client idles (the thing tested), no wait
            assert ask().startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize("parser", PARSERS)
def test_a_kept_alive_client_outlasts_a_flood_of_connections_that_never_sent_a_whole_head(parser):
    """Past the cap, connections that never completed a request go first: a client that was
    served and keeps its connection open between requests is not the one evicted."""
    patient = ConnectionLimits(max_connections=8, header_timeout_s=30, keep_alive_s=30, backlog=4)
    with serving(parser, patient) as server, _kept_alive(server) as (_, ask):
        assert ask().startswith(b"HTTP/1.1 200 ")
        flood = [socket.create_connection(server, timeout=10) for _ in range(3 * patient.max_connections)]
        try:
            for s in flood:
                s.sendall(b"GET /ok HTTP/1.1\r\n")
            closed = 0
            for s in flood:  # the server evicts flood connections to stay under the cap
                s.settimeout(0.2)
                try:
                    closed += s.recv(100) == b""
                except ConnectionResetError:  # evicted before its partial head was read: a reset, not a FIN
                    closed += 1
                except TimeoutError:
                    pass
            assert closed >= 2 * patient.max_connections - 1
            assert ask().startswith(b"HTTP/1.1 200 ")
        finally:
            for s in flood:
                s.close()


@pytest.mark.parametrize("parser", PARSERS)
def test_pipelined_requests_are_all_answered(parser):
    with serving(parser) as addr:
        answer = _exchange(
            addr,
            b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n" * 2
            + b"GET /ok HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        )
    assert answer.count(b"HTTP/1.1 200 ") == 3, answer


@pytest.mark.parametrize("parser", PARSERS)
def test_a_client_polling_on_a_kept_alive_connection_is_never_cut_by_a_churning_flood(parser):
    """At the cap, with a flood that reopens every connection the server closes (session 8's
    combined-load run), a client asking again and again on one kept-alive connection keeps it:
    each newcomer evicts one flood connection, never the client between two of its requests.

    "Between two of its requests" is asking again within IDLE_EVICTABLE_S: a client idle that long
    may go. This process runs the server, the flood and the client, so on a loaded machine the
    client's thread can wait that long between two requests; the connection may then go, and the
    client reconnects. What must never happen is a cut while the client asked again in time: less
    than IDLE_EVICTABLE_S from sending one request to sending the next bounds the time the server
    saw it idle (once a request is sent it waits unread in the server's socket, which keeps it)."""
    limits = ConnectionLimits(max_connections=16, header_timeout_s=0.5, keep_alive_s=5, backlog=8)
    with serving(parser, limits) as server:
        asked = idle_cuts = 0
        with Flood(server, 4 * limits.max_connections) as flood:
            deadline = time.monotonic() + 30
            while flood.opened < 4 * limits.max_connections:
                assert time.monotonic() < deadline, "the flood did not get going"
                time.sleep(0.01)
            end = time.monotonic() + 3 * limits.header_timeout_s  # flood connections expire and reopen
            give_up = time.monotonic() + 120
            while time.monotonic() < end or asked < 50:
                assert time.monotonic() < give_up, f"{asked} requests answered, {idle_cuts} cuts after idling"
                with socket.create_connection(server, timeout=10) as client:
                    sent = 0.0
                    while time.monotonic() < end or asked < 50:
                        gap, sent = time.monotonic() - sent, time.monotonic()
                        answer = _ask_on(client)
                        if answer is None:  # closed: only a client idle that long may be cut
                            assert gap >= IDLE_EVICTABLE_S, f"cut {gap:.3f} s after its last request"
                            idle_cuts += 1
                            break
                        assert answer.startswith(b"HTTP/1.1 200 ")
                        asked += 1
                        time.sleep(0.005)
            churned = flood.opened
        assert churned > 4 * limits.max_connections  # the server closed flood connections all along


def _ask_on(client: socket.socket) -> bytes | None:
    """Asks ``/ok`` on a kept-alive connection: the answer, or None when the server closed it."""
    try:
        client.sendall(b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n")
        got = b""
        while b'{"ok":true}' not in got:
            chunk = client.recv(4096)
            if not chunk:
                return None
            got += chunk
    except (ConnectionResetError, BrokenPipeError):
        return None
    return got


@contextlib.contextmanager
def _kept_alive(addr: tuple[str, int]) -> Iterator[tuple[socket.socket, Callable[[], bytes]]]:
    """A connection and a function that asks ``/ok`` on it (kept alive) and returns the answer."""
    with socket.create_connection(addr, timeout=10) as client:

        def ask() -> bytes:
            client.sendall(b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n")
            got = b""
            while b'{"ok":true}' not in got:
                chunk = client.recv(4096)
                assert chunk, f"the kept-alive connection was closed after {got!r}"
                got += chunk
            return got

        yield client, ask


@contextlib.contextmanager
def _one_client_and_the_rest_busy(
    parser: str,
) -> Iterator[tuple[tuple[str, int], socket.socket, Callable[[], bytes]]]:
    """A server at its cap: one kept-alive client, answered once, and every other connection busy
    (its request head read, its body still coming)."""
    patient = ConnectionLimits(
        max_connections=8, header_timeout_s=30, body_timeout_s=30, keep_alive_s=30, backlog=4
    )
    with (
        serving(parser, patient) as server,
        _kept_alive(server) as (client, ask),
        _busy(server, patient.max_connections - 1),
    ):
        assert ask().startswith(b"HTTP/1.1 200 ")
        yield server, client, ask


@contextlib.contextmanager
def _busy(server: tuple[str, int], n: int) -> Iterator[list[socket.socket]]:
    """``n`` connections busy with a request: its head read (the server said 100 Continue), its
    body still coming."""
    busy = [socket.create_connection(server, timeout=10) for _ in range(n)]
    try:
        for s in busy:
            s.sendall(
                b"POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n"
            )
        for s in busy:
            assert s.recv(100).startswith(b"HTTP/1.1 100 ")
        yield busy
    finally:
        for s in busy:
            s.close()


@pytest.mark.parametrize("parser", PARSERS)
def test_a_kept_alive_client_answered_moments_ago_keeps_its_connection_and_the_newcomer_gets_503(parser):
    with _one_client_and_the_rest_busy(parser) as (server, _, ask):
        answer = _request(server)  # the client is between two requests: in use
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert ask().startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize("parser", PARSERS)
def test_a_kept_alive_connection_idle_for_a_while_makes_room_for_a_newcomer(parser):
    with _one_client_and_the_rest_busy(parser) as (server, client, _):
        time.sleep(IDLE_EVICTABLE_S + 0.2)  # the client stops asking (the thing tested)
        assert _request(server).startswith(b"HTTP/1.1 200 ")
        assert read_until_closed(client, 10) == b""  # closed without a word, as nginx reclaims idle ones


@pytest.mark.parametrize("parser", PARSERS)
def test_connections_being_closed_do_not_count_against_the_cap(parser):
    """Half-sent heads time out together while the loop is held, and a newcomer is accepted in
    the same turn of the loop, before their closes are done: the cap counts the connections
    still open, so the newcomer is served (not refused, nor made to close someone else)."""
    limits = ConnectionLimits(max_connections=8, header_timeout_s=0.5, keep_alive_s=30, backlog=4)
    with serving(parser, limits) as server:
        half = [socket.create_connection(server, timeout=10) for _ in range(limits.max_connections - 1)]
        try:
            for s in half:
                s.sendall(b"GET /ok HTTP/1.1\r\n")
            hold = b"GET /block?seconds=1.5 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
            blocker = threading.Thread(target=_exchange, args=(server, hold))
            blocker.start()
            time.sleep(0.3)  # the loop is held now, past the half-sent heads' deadline
            try:
                answer = _request(server)  # accepted once the loop runs again
            finally:
                blocker.join(30)
            assert answer.startswith(b"HTTP/1.1 200 "), answer
        finally:
            for s in half:
                s.close()


@pytest.mark.parametrize("parser", PARSERS)
def test_a_kept_alive_client_asking_again_after_the_header_timeout_but_within_the_keep_alive_is_served(
    parser,
):
    """The wait for the next request after a response is ``keep_alive_s``, however short the
    header timeout: it was the shorter of the two, which cut a client asking every 10 s at the
    default 10 s header timeout (and at 0.5 s here) as though it had gone idle."""
    limits = ConnectionLimits(max_connections=8, header_timeout_s=0.5, keep_alive_s=30, backlog=4)
    with serving(parser, limits) as addr, _kept_alive(addr) as (_, ask):
        assert ask().startswith(b"HTTP/1.1 200 ")
        time.sleep(3 * limits.header_timeout_s)  # the client's interval (the thing tested)
        assert ask().startswith(b"HTTP/1.1 200 ")


def _blocking_quick_answers(
    method: str, path: str, query: bytes, headers: object, state: object
) -> QuickAnswer | None:
    """A quick router (answered inside the read, as the collector's query fast path answers)
    that holds the loop ``seconds`` for ``/quickblock``."""
    if path != "/quickblock":
        return None
    seconds = float(query.decode().partition("=")[2])

    def answer(write: ResponseWriter) -> bool:
        time.sleep(seconds)  # a slow query answered within the read of its request
        write(200, [(b"content-type", b"application/json")], b'{"ok":true}')
        return True

    return answer


def test_a_request_sent_within_the_keep_alive_time_is_answered_even_when_read_after_the_deadline_fired():
    """A quick answer runs inside the loop's poll; uvloop (libuv) then runs the due timers before
    it polls again, so a keep-alive deadline that passed during the answer fired while the
    client's next request, sent in time, sat unread, and the close reset it. Bytes that came
    are read first."""
    limits = ConnectionLimits(max_connections=8, header_timeout_s=10, keep_alive_s=1.0, backlog=4)
    with (
        serving("httptools", limits, quick=_blocking_quick_answers) as addr,
        _kept_alive(addr) as (_, ask),
        socket.create_connection(addr, timeout=30) as other,
    ):
        assert ask().startswith(b"HTTP/1.1 200 ")
        other.sendall(b"GET /quickblock?seconds=3 HTTP/1.1\r\nHost: t\r\n\r\n")
        time.sleep(limits.keep_alive_s / 2)  # the loop is held now, the client's deadline not passed
        assert ask().startswith(b"HTTP/1.1 200 ")  # sent within the keep-alive time
        assert read_until_closed(other, 30).startswith(b"HTTP/1.1 200 ")  # then idle, closed


def test_past_the_cap_a_kept_alive_connection_with_a_request_unread_is_not_evicted():
    """A newcomer accepted in one poll of the loop has its ``connection_made`` in the next turn,
    before that turn's poll: a request the idle client sent in between (here during a quick
    answer) is still unread then. The client is in use, so the connection idle longest with
    nothing sent makes room instead (the one that held the loop), not the client reset with
    its request unread."""
    patient = ConnectionLimits(
        max_connections=8, header_timeout_s=30, body_timeout_s=30, keep_alive_s=30, backlog=4
    )
    with (
        serving("httptools", patient, quick=_blocking_quick_answers) as server,
        socket.create_connection(server, timeout=30) as other,
        _kept_alive(server) as (_, ask),
        _busy(server, patient.max_connections - 3),
    ):
        assert ask().startswith(b"HTTP/1.1 200 ")
        time.sleep(IDLE_EVICTABLE_S + 0.3)  # the client idles: evictable if nothing came
        with socket.create_connection(server, timeout=30) as blocker:  # the cap's last place
            blocker.sendall(b"GET /block?seconds=1 HTTP/1.1\r\nHost: t\r\n\r\n")  # kept alive after
            time.sleep(0.3)  # the loop is held now: what comes next is polled at once
            with socket.create_connection(server, timeout=30) as newcomer:
                newcomer.sendall(b"GET /ok HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                other.sendall(b"GET /quickblock?seconds=3 HTTP/1.1\r\nHost: t\r\n\r\n")
                time.sleep(1.5)  # into the quick answer, after the poll that accepted the newcomer
                assert ask().startswith(b"HTTP/1.1 200 ")
                answer = read_until_closed(newcomer, 30)
            assert answer.startswith(b"HTTP/1.1 200 "), answer
            held = read_until_closed(blocker, 30)  # answered, then evicted (no reset: nothing unread)
            assert held.startswith(b"HTTP/1.1 200 "), held
            assert held.endswith(b'{"blocked":1.0}'), held
