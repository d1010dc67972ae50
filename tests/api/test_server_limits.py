"""What unauthenticated or slow clients can hold of a real ``ki collector``: connections, time,
memory and log lines are all bounded (issue #13 item 2, docs/security.md).

Each test talks to the real process over real loopback sockets, with small limits so that a few
hundred sockets and a few seconds are enough to reach them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from api_helpers import read_until_closed
from load_clients import HALF_SENT, Flood
from support.collector import RunningCollector, rss_bytes, running_collector

from kernel_insight.collector import wire
from kernel_insight.collector.remote_write import encode_write_request

MAX_CONNECTIONS = 64
HEADER_TIMEOUT_S = 1.5
BODY_TIMEOUT_S = 2.0
LIMIT_FLAGS = (
    "--max-connections",
    str(MAX_CONNECTIONS),
    "--header-timeout",
    str(HEADER_TIMEOUT_S),
    "--body-timeout",
    str(BODY_TIMEOUT_S),
)


@pytest.fixture(scope="module")
def collector(tmp_path_factory) -> Iterator[RunningCollector]:
    with running_collector(tmp_path_factory.mktemp("limits"), *LIMIT_FLAGS) as c:
        yield c


def _connect(c: RunningCollector, timeout: float = 5.0) -> socket.socket:
    s = socket.create_connection(c.host_port, timeout=timeout)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
    return s


def _read_response(s: socket.socket, timeout_s: float = 10) -> bytes:
    """One whole response (head and Content-Length body) on a connection the server keeps open."""
    s.settimeout(timeout_s)
    out = b""
    while b"\r\n\r\n" not in out:
        chunk = s.recv(65536)
        assert chunk, f"closed after {out!r}"
        out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    length = int(
        next(
            v
            for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
            if k.lower() == b"content-length"
        )
    )
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk
        body += chunk
    return out[: len(head) + 4] + body


def test_a_half_sent_request_is_answered_408_and_closed_after_the_header_timeout(collector):
    s = _connect(collector)
    try:
        start = time.monotonic()
        s.sendall(HALF_SENT)
        answer = read_until_closed(s, HEADER_TIMEOUT_S + 10)
        took = time.monotonic() - start
    finally:
        s.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert HEADER_TIMEOUT_S * 0.8 <= took < HEADER_TIMEOUT_S + 5


def test_a_flood_of_half_sent_requests_does_not_stop_legitimate_requests(collector):
    """Five times the connection cap of half-sent requests, held for several seconds: every
    legitimate request (a fresh connection each) is answered, and stderr stays short."""
    auth = {"Authorization": f"Bearer {collector.read_token}", "Connection": "close"}
    err_before = collector.stderr.stat().st_size
    answered = []
    with Flood(collector.host_port, MAX_CONNECTIONS * 5) as flood:
        deadline = time.monotonic() + 20
        while flood.opened < MAX_CONNECTIONS * 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert flood.opened >= MAX_CONNECTIONS * 5, "the flood did not get going"
        hold_until = time.monotonic() + 2 * HEADER_TIMEOUT_S + 1  # past a header timeout: reopened ones too
        most_sockets = 0
        while time.monotonic() < hold_until or len(answered) < 20:
            with httpx.Client(timeout=5) as client:
                r = client.get(f"{collector.url}/v1/health/snapshot", headers=auth)
            answered.append(r.status_code)
            most_sockets = max(most_sockets, _open_sockets(collector.proc.pid))
        total = flood.opened
    print(f"flood opened {total} connections; {len(answered)} legitimate requests; {most_sockets} sockets")
    assert answered == [200] * len(answered)
    assert total > MAX_CONNECTIONS * 5  # the server closed flood connections, which were reopened
    # The collector never held more than the cap (plus one accept round and its own sockets).
    assert most_sockets <= MAX_CONNECTIONS + MAX_CONNECTIONS // 2 + 16, most_sockets
    # Evictions and timeouts are not logged one by one: the log grew by a few lines at most.
    grown = collector.stderr.stat().st_size - err_before
    assert grown < 4096, collector.stderr.read_text()[-4096:]


def _open_sockets(pid: int) -> int:
    n = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            n += os.readlink(fd).startswith("socket:")
    return n


def _header(agent_id: bytes, key_id: int, payload_len: int) -> bytes:
    return wire.BatchHeader(agent_id, key_id, 1, 0, 0, 0, 0, payload_len, wire.COMPRESSION_NONE).pack()


def _stalled_upload(c: RunningCollector, path: str, headers: dict[str, str], first: bytes) -> socket.socket:
    """A POST that announces a 16 MiB body, sends ``first`` of it and stalls."""
    s = _connect(c)
    head = f"POST {path} HTTP/1.1\r\nHost: collector\r\nContent-Length: {16 << 20}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    s.sendall(head.encode() + b"\r\n" + first)
    return s


def test_unknown_agents_are_refused_after_the_frame_header_without_buffering_the_body(collector):
    stranger = bytes(range(16))
    s = _stalled_upload(
        collector,
        wire.INGEST_PATH,
        {"Content-Type": wire.CONTENT_TYPE},
        _header(stranger, 1, (16 << 20) - 64),
    )
    try:
        answer = _read_response(s)  # arrives while 16 MiB - 64 bytes of the body are still unsent
    finally:
        s.close()
    assert answer.startswith(b"HTTP/1.1 403 "), answer
    assert b"is not enrolled" in answer, answer


def test_remote_write_without_a_token_is_refused_before_its_body(collector):
    s = _stalled_upload(
        collector,
        "/api/v1/write",
        {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"},
        b"",
    )
    try:
        answer = _read_response(s)
    finally:
        s.close()
    assert answer.startswith(b"HTTP/1.1 401 "), answer
    assert b"missing bearer token" in answer, answer


def test_stalled_uploads_are_cut_off_by_the_body_timeout_and_memory_stays_bounded(collector):
    """Enrolled-agent uploads that stall after 1 MiB: each is answered 408 within the body
    timeout; strangers' stalled uploads (16 MiB announced) are refused at once; the collector's
    memory grows by far less than what the uploads announced (60 x 16 MiB)."""
    agent = collector.agent
    before = rss_bytes(collector.proc.pid)
    socks = []
    try:
        for i in range(30):
            frame_start = _header(agent.agent_id, agent.key_id, (16 << 20) - 64) + bytes(1 << 20)
            socks.append(_stalled_upload(collector, wire.INGEST_PATH, {}, frame_start))
            stranger = bytes([i]) * 16
            socks.append(_stalled_upload(collector, wire.INGEST_PATH, {}, _header(stranger, 1, 1 << 20)))
        start = time.monotonic()
        answers = [read_until_closed(s, BODY_TIMEOUT_S + 15) for s in socks]
        took = time.monotonic() - start
        peak = rss_bytes(collector.proc.pid)
    finally:
        for s in socks:
            s.close()
    statuses = [a[9:12] for a in answers]
    assert statuses.count(b"408") == 30, statuses
    assert statuses.count(b"403") == 30, statuses
    assert took < BODY_TIMEOUT_S + 10
    assert peak - before < 200 << 20, f"RSS grew by {(peak - before) >> 20} MiB"
    # The collector still serves after all of it.
    r = httpx.get(f"{collector.url}/healthz", timeout=10)
    assert r.status_code == 200


def test_an_oversized_snappy_header_is_413(collector):
    # A snappy block that announces 2^32 bytes (the varint header) and holds nothing.
    body = bytes([0x80, 0x80, 0x80, 0x80, 0x10]) + b"\x00"
    r = httpx.post(
        f"{collector.url}/api/v1/write",
        content=body,
        headers={
            "Authorization": f"Bearer {collector.ingest_token}",
            "Content-Encoding": "snappy",
            "Content-Type": "application/x-protobuf",
        },
        timeout=10,
    )
    assert r.status_code == 413, r.text
    assert "limit" in r.text
    ok = httpx.post(
        f"{collector.url}/api/v1/write",
        content=encode_write_request([({"__name__": "x"}, [(int(time.time() * 1000), 1.0)])]),
        headers={"Authorization": f"Bearer {collector.ingest_token}", "Content-Encoding": "snappy"},
        timeout=10,
    )
    assert ok.status_code == 204, ok.text


def test_the_connection_cap_refuses_with_503_only_when_every_connection_is_busy(collector):
    """Connections whose requests are in flight are never evicted; past the cap a newcomer gets 503."""
    busy = []
    try:
        # Requests whose body is still coming are busy, not idle: they are not evicted.
        agent = collector.agent
        for _ in range(MAX_CONNECTIONS):
            frame_start = _header(agent.agent_id, agent.key_id, 4096 - 64)
            busy.append(_stalled_upload(collector, wire.INGEST_PATH, {}, frame_start))
        time.sleep(0)  # the server accepts them in order; the probe below comes after all of them
        deadline = time.monotonic() + 10
        answer = b""
        while time.monotonic() < deadline:
            probe = _connect(collector)
            try:
                probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: c\r\n\r\n")
                answer = read_until_closed(probe, 5)
            finally:
                probe.close()
            if answer.startswith(b"HTTP/1.1 503"):
                break
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert b"retry-after" in answer.lower()
    finally:
        for s in busy:
            s.close()


def test_repeated_log_messages_are_rate_limited():
    """The filter ``ki collector`` installs passes one line per message per interval, then counts."""
    import logging

    from kernel_insight.api.logs import RepeatFilter

    flt = RepeatFilter(interval_s=0.2)
    records = [logging.LogRecord("t", logging.ERROR, "f", 1, "accept failed: %s", ("EMFILE",), None)]
    passed = [flt.filter(records[0]) for _ in range(1000)]
    assert passed.count(True) == 1
    time.sleep(0.25)  # the interval itself is what is tested
    later = logging.LogRecord("t", logging.ERROR, "f", 1, "accept failed: %s", ("EMFILE",), None)
    assert flt.filter(later)
    assert "[999 more like this" in later.getMessage()
    other = logging.LogRecord("t", logging.ERROR, "f", 1, "another message", (), None)
    assert flt.filter(other)
    assert np.sum(passed) == 1


def test_the_collector_raises_its_open_file_limit_to_the_hard_limit(collector):
    line = next(
        x for x in Path(f"/proc/{collector.proc.pid}/limits").read_text().splitlines() if "open files" in x
    )
    soft, hard = line.split()[3:5]
    assert soft == hard, line


def test_a_repeated_error_is_logged_once_with_a_count_not_once_per_request(collector):
    """A hundred batches from strangers: each is refused (403), the log says so once (per 10 s)."""
    before = collector.stderr.read_text()
    with httpx.Client(timeout=10) as client:
        for i in range(100):
            stranger = i.to_bytes(2, "little") * 8
            r = client.post(
                f"{collector.url}{wire.INGEST_PATH}",
                content=_header(stranger, 1, 16) + bytes(16),
                headers={"Content-Type": wire.CONTENT_TYPE},
            )
            assert r.status_code == 403
    new = collector.stderr.read_text()[len(before) :]
    assert new.count("refused batch from agent") <= 1, new[-2000:]
