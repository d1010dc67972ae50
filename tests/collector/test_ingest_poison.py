"""One bad record never wedges an agent (issue 13, item 3): real sealed batches through the ingest
router into a real embedded store; the bad record is dropped and counted by reason, the rest of its
batch is stored, and every later batch of that agent is stored too."""

from __future__ import annotations

import asyncio
import struct
import time

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from support.stored import metric_samples

from kernel_insight.agent import RECORD_DTYPE, FingerprintField, RecordFlag, RecordType
from kernel_insight.agent.metric_ids import MetricId
from kernel_insight.collector import wire
from kernel_insight.collector.clickhouse.health import instance_rows
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.derive import DROP_STATS
from kernel_insight.collector.ingest import ingest_router
from kernel_insight.collector.keys import KeyStore
from kernel_insight.collector.sink import StoreSink

NOW = time.time_ns()
YEAR_2150_NS = 5_680_281_600_000_000_000  # 2150-01-01
KERNEL, SAMPLE, FINGERPRINT = RecordType.KERNEL, RecordType.GPU_SAMPLE, RecordType.FINGERPRINT


def _rec(rtype: int, ident: int, ts: int, payload: bytes, flags: int = 0, pos: int = 0) -> np.ndarray:
    r = np.zeros(1, RECORD_DTYPE)
    r[0] = (pos, 1, 0, rtype, flags, 0, ident, ts, payload.ljust(32, b"\0"))
    return r


def kernel(ts: int, end: int | None = None, pos: int = 0) -> np.ndarray:
    return _rec(KERNEL, 5, ts, struct.pack("<QQQI4x", ts + 500 if end is None else end, 7, pos, 42), pos=pos)


def sample(metric: int, value: float, aux: int = 0, ts: int = NOW, pos: int = 0) -> np.ndarray:
    return _rec(SAMPLE, metric, ts, struct.pack("<dQ", value, aux), pos=pos)


def fingerprint(field: int, value: int, flags: int = 0) -> np.ndarray:
    return _rec(FINGERPRINT, field, NOW, struct.pack("<Q", value), flags=flags)


class Agent:
    """One agent's sealed batches, in sequence, through an ASGI client of the real router."""

    def __init__(self, app: FastAPI, creds) -> None:
        self.app, self.creds, self.seq = app, creds, 0

    def send(self, *records: np.ndarray, t_max: int | None = None, counters: dict[int, int] | None = None):
        arr = np.concatenate(records) if records else np.zeros(0, RECORD_DTYPE)
        arr["pos"] = np.arange(len(arr)) + self.seq * 1000
        frame = wire.encode_batch(
            arr,
            agent_id=self.creds.agent_id,
            key_id=self.creds.key_id,
            key=self.creds.key,
            epoch=1,
            seq=self.seq,
            strings={(1, 5): "gemm"},
            counters=counters or {int(wire.Counter.RING_DROPPED): 1},
            now_ns=NOW if t_max is None else t_max,
        )
        if t_max is not None and len(arr):  # a header claiming a later time than its records
            header = wire.parse_header(frame)
            body = wire.open_frame(frame, header, self.creds.key)
            frame = wire.seal_body(
                body,
                agent_id=self.creds.agent_id,
                key_id=self.creds.key_id,
                key=self.creds.key,
                epoch=1,
                seq=self.seq,
                t_min_ns=header.t_min_ns,
                t_max_ns=t_max,
                record_count=header.record_count,
                compress=False,
            )
        self.seq += 1

        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://collector") as c:
                return await c.post(
                    wire.INGEST_PATH, content=frame, headers={"Content-Type": wire.CONTENT_TYPE}
                )

        return asyncio.run(go())


@pytest.fixture
def env(tmp_path):
    keys = KeyStore(tmp_path / "keys.json")
    creds = keys.add_agent("gpu-host")
    with EmbeddedStore(tmp_path / "data") as store:
        app = FastAPI()
        app.include_router(ingest_router(keys, StoreSink(store, instance_of=lambda a: "host-1")))
        yield Agent(app, creds), store


def spans(store) -> int:
    return store.row_count("kernel_spans")


def series_values(store, name: str) -> list[float]:
    return [v for _, v in metric_samples(store, name)]


def _dropped(reason: str) -> int:
    return DROP_STATS.snapshot().get(reason, 0)


CASES = [
    # (name, poisoned records, drop reason, how many dropped)
    (
        "memory_total_2^64-1",
        [fingerprint(FingerprintField.MEMORY_TOTAL, 2**64 - 1)],
        "fingerprint_out_of_range",
        1,
    ),
    ("kernel_in_2150", [kernel(YEAR_2150_NS)], "timestamp_out_of_range", 1),
    ("sample_at_2^63_ns", [sample(MetricId.TEMPERATURE, 60.0, ts=2**63)], "timestamp_out_of_range", 1),
    ("sample_at_2^64-1_ns", [sample(MetricId.TEMPERATURE, 60.0, ts=2**64 - 1)], "timestamp_out_of_range", 1),
    ("kernel_ending_after_2150", [kernel(NOW, end=2**64 - 1)], "end_out_of_range", 1),
    (
        "bucket_1024",
        [sample(MetricId.LAUNCH_HOST_LATENCY_BUCKET, 3.0, aux=5 | 1024 << 32)],
        "bucket_out_of_range",
        1,
    ),
    ("throttle_nan", [sample(MetricId.THROTTLE_REASONS, float("nan"))], "value_out_of_range", 1),
    ("throttle_inf", [sample(MetricId.THROTTLE_REASONS, float("inf"))], "value_out_of_range", 1),
    ("memory_total_sample_inf", [sample(MetricId.MEMORY_TOTAL, float("inf"))], "value_out_of_range", 1),
]


@pytest.mark.parametrize(("poison", "reason", "n"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_poisoned_batch_is_stored_without_the_bad_record_and_later_batches_flow(env, poison, reason, n):
    agent, store = env
    before = _dropped(reason)
    r = agent.send(kernel(NOW), *poison, sample(MetricId.TEMPERATURE, 61.0))
    assert r.status_code == 200, r.text
    assert _dropped(reason) - before == n
    assert spans(store) == 1
    assert series_values(store, "gpu_temperature_celsius") == [61.0]
    for i in range(1, 3):  # the agent's state is not poisoned: later batches store
        r = agent.send(kernel(NOW + i * 1000), sample(MetricId.MEMORY_FREE, 1e9, ts=NOW + i))
        assert r.status_code == 200, r.text
    assert spans(store) == 3
    (inst,) = [i["memory_total_bytes"] for i in instance_rows(store)]
    assert inst < 2**64


def test_a_string_valued_memory_total_does_not_break_the_instance_row(env):
    agent, store = env
    r = agent.send(fingerprint(FingerprintField.MEMORY_TOTAL, 5, flags=RecordFlag.FP_STRING), kernel(NOW))
    assert r.status_code == 200, r.text
    assert agent.send(kernel(NOW + 1000)).status_code == 200
    assert spans(store) == 2


def test_a_header_time_past_2150_stamps_counters_with_the_collector_clock(env):
    agent, store = env
    before = _dropped("batch_time_out_of_range")
    r = agent.send(kernel(NOW), t_max=2**64 - 1)
    assert r.status_code == 200, r.text
    assert _dropped("batch_time_out_of_range") - before == 1
    ((ts, _),) = metric_samples(store, "ki_agent_ring_dropped_total")
    assert abs(ts - time.time_ns() // 1_000_000) < 600_000
    assert agent.send(kernel(NOW + 1000)).status_code == 200
    assert spans(store) == 2


def test_a_batch_no_table_can_hold_is_422_not_500(tmp_path):
    """A value derive does not foresee still gets a permanent answer, so the agent moves on."""
    keys = KeyStore(tmp_path / "keys.json")
    creds = keys.add_agent("gpu-host")

    def sink(batch: wire.DecodedBatch) -> bool:
        raise OverflowError("int too big to convert")

    app = FastAPI()
    app.include_router(ingest_router(keys, sink))
    r = Agent(app, creds).send(kernel(NOW))
    assert r.status_code == 422
    assert "cannot be stored" in r.json()["detail"]
