"""Capture windows, collector side, through a real ``ki collector``: a request reaches its agent
in a ``KI-Capture`` answer header (only after an authenticated batch, once), the agent's CAPTURES
reports move it to ``capturing`` and ``done`` with the span count; requests nobody takes expire."""

from __future__ import annotations

import struct
import time

import httpx
import numpy as np
import pytest
from support.collector import running_collector

from kernel_insight.agent import RECORD_DTYPE, FingerprintField, RecordFlag, RecordType
from kernel_insight.collector import wire
from kernel_insight.collector.captures import (
    CAPTURE_HEADER,
    CaptureDesk,
    get_capture,
    parse_capture_header,
    request_capture,
)
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.keys import AgentCredentials
from kernel_insight.collector.rows import InstanceInfo
from kernel_insight.collector.varint import encode as encode_varint
from kernel_insight.collector.wire import CaptureReport


def _records(now_ns: int, kernels: int) -> np.ndarray:
    """GPU 0's fingerprint (so the instance exists) and ``kernels`` kernel spans of 1 us."""
    rows = [
        (0, 1, 0, RecordType.FINGERPRINT, RecordFlag.FP_STRING, 0, FingerprintField.NAME, now_ns,
         struct.pack("<Q", 5).ljust(32, b"\0")),
    ]  # fmt: skip
    for i in range(kernels):
        start = now_ns + i * 10_000
        rows.append(
            (0, 1, 0, RecordType.KERNEL, 0, 0, 6, start, struct.pack("<QQQI4x", start + 1000, 7, i + 1, 42))
        )
    recs = np.array(rows, RECORD_DTYPE)
    recs["pos"] = np.arange(len(recs))
    return recs


class Agent:
    """Seals batches as ki-agent does, one sequence number after another."""

    def __init__(self, http: httpx.Client, creds: AgentCredentials) -> None:
        self.http, self.creds, self.seq, self.epoch = http, creds, 0, int(time.time())

    def send(
        self, kernels: int = 0, captures: tuple[CaptureReport, ...] = (), key: bytes | None = None
    ) -> httpx.Response:
        now = time.time_ns()
        frame = wire.encode_batch(
            _records(now, kernels),
            agent_id=self.creds.agent_id,
            key_id=self.creds.key_id,
            key=key or self.creds.key,
            epoch=self.epoch,
            seq=self.seq,
            strings={(1, 5): "NVIDIA H100 80GB HBM3", (1, 6): "gemm"},
            now_ns=now,
            captures=captures,
        )
        self.seq += 1
        return self.http.post(wire.INGEST_PATH, content=frame, headers={"Content-Type": wire.CONTENT_TYPE})


def _offers(r: httpx.Response) -> list[tuple[str, int, int]]:
    return [parse_capture_header(v) for v in r.headers.get_list(CAPTURE_HEADER)]


def test_a_capture_reaches_its_agent_once_and_finishes_with_its_span_count(tmp_path):
    with (
        running_collector(tmp_path) as c,
        httpx.Client(base_url=c.url, timeout=30, headers={"Authorization": f"Bearer {c.admin_token}"}) as api,
        httpx.Client(base_url=c.url, timeout=30) as http,
    ):
        agent = Agent(http, c.agent)
        r = agent.send()
        assert r.status_code == 200
        assert _offers(r) == []
        instance = c.agent.agent_id.hex()
        made = api.post("/v1/timeline/captures", json={"instance": instance, "gpu": 0, "seconds": 2})
        assert made.status_code == 201, made.text
        cid = made.json()["id"]

        # A batch that fails authentication is never told anything.
        bad = agent.send(key=bytes(32))
        assert bad.status_code == 401
        assert _offers(bad) == []

        deadline = time.monotonic() + 20
        offers: list[tuple[str, int, int]] = []
        while not offers:  # the collector re-reads requests about once a second
            assert time.monotonic() < deadline, "the capture request never reached the agent"
            offers = _offers(agent.send())
        assert offers == [(cid, 0, 2)]
        assert api.get(f"/v1/timeline/captures/{cid}").json()["state"] == "delivered"
        assert api.get("/v1/timeline/captures", params={"instance": instance}).json()["captures"] == []
        assert _offers(agent.send()) == []  # told once

        t0 = time.time_ns()
        window = (t0, t0 + 2_000_000_000)
        r = agent.send(5, (CaptureReport(cid, 0, *window, spans=5, final=False),))
        assert r.status_code == 200
        row = api.get(f"/v1/timeline/captures/{cid}").json()
        assert (row["state"], row["spans"]) == ("capturing", 5)
        # Reports of another GPU, or of an id nobody asked for, change nothing.
        agent.send(1, (CaptureReport(cid, 1, *window, 9, True), CaptureReport("0" * 16, 0, *window, 9, True)))
        assert api.get(f"/v1/timeline/captures/{cid}").json()["state"] == "capturing"
        agent.send(3, (CaptureReport(cid, 0, *window, spans=8, final=True),))
        row = api.get(f"/v1/timeline/captures/{cid}").json()
        assert row["state"] == "done"
        assert (row["spans"], row["window_start_ns"], row["window_end_ns"]) == (8, *window)
        listed = api.get("/v1/timeline/captures", params={"instance": instance, "state": "any"}).json()
        assert [x["state"] for x in listed["captures"]] == ["done"]
        assert api.get("/v1/timeline/captures/zz").status_code == 400
        assert api.get(f"/v1/timeline/captures/{'f' * 16}").status_code == 404
        assert (
            api.get("/v1/timeline/captures", params={"instance": instance, "state": "x"}).status_code == 400
        )


def test_requests_nobody_takes_expire_and_unfinished_ones_expire_after_their_window(tmp_path):
    store = EmbeddedStore(tmp_path / "store")
    try:
        now = [time.time()]
        store.upsert_instances([InstanceInfo(id="aa", last_seen_ms=int(time.time() * 1000), gpu_count=2)])
        desk = CaptureDesk(
            store, instance_of=lambda a: a.hex(), refresh_s=0, expire_s=60, clock=lambda: now[0]
        )
        first = request_capture(store, "aa", 0, 10, token_id="t", token_name="admin")
        taken = request_capture(store, "aa", 1, 10, token_id="t", token_name="admin")
        # Both are offered in one answer, oldest first; a later answer offers nothing.
        assert [o.split(";")[0] for o in desk.offers(b"\xaa")] == [first["id"], taken["id"]]
        assert desk.offers(b"\xaa") == []
        assert desk.offers(b"\xbb") == []  # another agent's
        third = request_capture(store, "aa", 0, 5, token_id="t", token_name="admin")
        now[0] = (
            third["requested_ms"] / 1000 + 61
        )  # nobody took the third; delivered ones have their window too
        desk.offers(b"\xbb")
        assert get_capture(store, third["id"])["state"] == "expired"
        assert get_capture(store, first["id"])["state"] == "delivered"
        now[0] = first["requested_ms"] / 1000 + 71
        desk.offers(b"\xbb")
        assert get_capture(store, first["id"])["state"] == "expired"
    finally:
        store.close()


@pytest.mark.parametrize(
    "value",
    ["", "0123456789abcdef", "0123456789ABCDEF;gpu=0;seconds=1", "0123456789abcdef;gpu=0;seconds=1;x=2"],
)
def test_capture_header_values_are_parsed_strictly(value):
    with pytest.raises(ValueError, match="not a KI-Capture value"):
        parse_capture_header(value)


def _body_with_captures(payload: bytes) -> bytes:
    return bytes([wire.BODY_VERSION, wire.SECTION_CAPTURES]) + encode_varint(len(payload)) + payload


def test_captures_section_round_trips_and_bad_ones_are_malformed():
    header = wire.parse_header(
        wire.encode_batch(
            _records(10**18, 0)[:0], agent_id=bytes(16), key_id=1, key=bytes(32), epoch=1, seq=0
        ),
    )
    reports = (
        CaptureReport("00ff00ff00ff00ff", 3, 10, 20, 7, False),
        CaptureReport("f" * 16, 0, 5, 6, 0, True),
    )
    body = wire.encode_body(_records(0, 0)[:0], captures=reports)
    assert wire.decode_body(body, header).captures == reports
    entry = bytes(8) + bytes([0, 10, 20, 0])
    for bad in (
        encode_varint(0),  # no entries
        encode_varint(1) + entry + b"\x02",  # final is 0 or 1
        encode_varint(1) + bytes(8) + bytes([0, 20, 10, 0, 0]),  # the window ends before it starts
        encode_varint(1) + bytes(8) + encode_varint(70000) + bytes([10, 20, 0, 0]),  # no GPU 70000
        encode_varint(1) + entry + b"\x00\x00",  # a byte left over
    ):
        with pytest.raises(wire.MalformedBatch):
            wire.decode_body(_body_with_captures(bad), header)


def test_a_store_made_before_the_capture_columns_gets_them(tmp_path):
    store = EmbeddedStore(tmp_path / "s")
    store.command(f"ALTER TABLE {store.database}.capture_requests DROP COLUMN spans")
    store.close()
    store = EmbeddedStore(tmp_path / "s")
    try:
        store.upsert_instances([InstanceInfo(id="aa", last_seen_ms=int(time.time() * 1000), gpu_count=1)])
        row = request_capture(store, "aa", 0, 1, token_id="t", token_name="n")
        assert get_capture(store, row["id"])["spans"] == 0
    finally:
        store.close()
