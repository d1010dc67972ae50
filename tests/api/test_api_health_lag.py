"""Health sees backlog, not silence: late data from an agent that is heard stays selectable (docs/api.md)."""

from __future__ import annotations

import dataclasses
import json
import struct
import time

import numpy as np
import pytest
from api_helpers import facts

from kernel_insight.agent.metric_ids import MetricId
from kernel_insight.agent.records import RECORD_DTYPE, RecordType
from kernel_insight.api import HealthRule, StoreSource, build_snapshot
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.derive import Derived, Deriver
from kernel_insight.sdk._models import HealthSnapshot
from kernel_insight.sdk._select import SelectionIndex

NOW_MS = 1_790_000_000_000
RULE = HealthRule(stale_after_s=60, max_data_age_s=300)


def heard(data_age_s: float, heard_age_s: float | None, lag_s: float | None = None):
    f = facts("x", now_ms=NOW_MS, age_s=data_age_s)
    f.last_heard_ms = None if heard_age_s is None else NOW_MS - int(heard_age_s * 1000)
    f.ingest_lag_s = lag_s
    return f


@pytest.mark.parametrize(
    ("data_age_s", "heard_age_s", "stale", "lagging", "reason"),
    [
        (10, 1, False, False, None),  # fresh
        (60, None, False, False, None),  # exactly stale_after_s: still fresh
        (61, None, True, False, "nothing heard for more than 60 s"),  # no agent heartbeat (remote_write data)
        (120, 2, False, True, None),  # an agent catching up: its data is late, it is heard
        (300, 60, False, True, None),  # both limits reached exactly: still lagging
        (301, 1, True, False, "newest data older than 300 s although its agent is sending"),
        (120, 61, True, False, "nothing heard for more than 60 s"),  # the agent went quiet too
    ],
)
def test_freshness_by_producer_time_and_heartbeat(data_age_s, heard_age_s, stale, lagging, reason):
    f = heard(data_age_s, heard_age_s)
    assert RULE.freshness(f, NOW_MS)[:2] == (stale, lagging)
    healthy, judged_stale, reasons = RULE.judge(f, NOW_MS)
    assert judged_stale == stale
    assert healthy == (not stale)  # every other condition holds for these facts
    if reason is None:
        assert reasons == []
    else:
        assert len(reasons) == 1
        assert reason in reasons[0]


def test_a_lagging_instance_is_reported_with_its_lag_and_stays_selectable():
    late = heard(120, 1, lag_s=119.4)
    gone = dataclasses.replace(heard(120, 90, lag_s=119.4), id="gone")
    snap = build_snapshot([late, gone], RULE, NOW_MS)
    by_id = {r["id"]: r for r in snap.records}
    assert by_id["x"]["lagging"] is True
    assert by_id["x"]["ingest_lag_s"] == 119.4
    assert by_id["x"]["last_heard_ms"] == NOW_MS - 1000
    assert by_id["x"]["healthy"]
    assert not by_id["x"]["stale"]
    assert by_id["gone"]["stale"]
    assert not by_id["gone"]["lagging"]
    # The SDK parses the new fields and keeps the lagging instance eligible.
    sdk_snap = HealthSnapshot.from_json(json.loads(snap.body), etag=snap.etag)
    inst = sdk_snap.get("x")
    assert inst is not None
    assert inst.lagging
    assert inst.ingest_lag_s == 119.4
    index = SelectionIndex(sdk_snap.instances)
    assert index.pick(1, None, lambda: 0.5, {}, 0.0).id == "x"  # type: ignore[union-attr]
    assert [i.id for i in index.candidates(0, None)] == ["x"]


def test_the_lag_does_not_depend_on_the_rebuild_time():
    """The snapshot's bytes (and ETag) change only when the data does, not on every rebuild."""
    late = heard(120, 1, lag_s=30.0)
    first = build_snapshot([late], RULE, NOW_MS)
    again = build_snapshot([late], RULE, NOW_MS + 2_000, first)
    assert again.etag == first.etag


def _store(store: EmbeddedStore, derived: Derived) -> None:
    store.insert_batch(
        "agent-1:1:0",
        agent_id="agent-1",
        samples=derived.samples,
        spans=derived.spans,
        events=derived.events,
        instances=derived.instances,
    )


def test_store_source_reads_the_heartbeat_the_sink_stores(tmp_path):
    """A batch whose newest record is 90 s old, received now: heard now, 90 s of lag."""
    store = EmbeddedStore(tmp_path / "data")
    try:
        now_ns = time.time_ns()
        t_max = now_ns - 90 * 1_000_000_000
        d = Deriver("agent-1")
        derived = d.derive(
            np.zeros(0, dtype=RECORD_DTYPE), counters={"spool_batches": 40}, now_ns=t_max, received_ns=now_ns
        )
        _store(store, derived)
        (f,) = StoreSource(store).collect(now_ns // 1_000_000)
        assert f.id == "agent-1"
        assert f.last_seen_ms == t_max // 1_000_000
        assert f.last_heard_ms == now_ns // 1_000_000
        assert f.ingest_lag_s == pytest.approx(90.0)
        stale, lagging, _ = HealthRule().freshness(f, now_ns // 1_000_000)
        assert (stale, lagging) == (False, True)
    finally:
        store.close()


def test_a_batch_stored_during_a_rebuild_shows_its_heartbeat_with_its_gauges(tmp_path):
    """The rebuild reads its clock, then the batch arrives (heartbeat stamped at its receive time,
    after that clock) and is stored before the rebuild's read: both its gauge and its heartbeat
    are seen, never the gauge alone (an instance healthy with no ingest lag)."""
    store = EmbeddedStore(tmp_path / "data")
    try:
        received_ns = time.time_ns()
        sampled_ns = received_ns - 400_000_000  # the agent's NVML reading, before the batch left
        records = np.zeros(1, dtype=RECORD_DTYPE)
        records["type"] = RecordType.GPU_SAMPLE
        records["id"] = int(MetricId.MEMORY_FREE)
        records["ts_ns"] = sampled_ns
        records["payload"] = np.frombuffer(struct.pack("<dQ16x", 1e9, 0), dtype="V32")
        derived = Deriver("agent-1").derive(records, now_ns=sampled_ns, received_ns=received_ns)
        _store(store, derived)
        (f,) = StoreSource(store).collect(received_ns // 1_000_000 - 50)  # the clock read 50 ms before
        assert f.gpu_memory_free_bytes == 1e9
        assert f.last_heard_ms == received_ns // 1_000_000
        assert f.ingest_lag_s == pytest.approx(0.4)
    finally:
        store.close()


def test_metrics_count_instances_by_state_from_the_current_snapshot():
    from api_helpers import FakeSource

    from kernel_insight.api import Snapshotter
    from kernel_insight.api.health import SnapshotFigures
    from kernel_insight.collector import CollectorMetrics

    metrics = CollectorMetrics(process=False)
    now_s = NOW_MS / 1000
    snapshotter = Snapshotter(
        FakeSource(
            [
                heard(10, 1),
                dataclasses.replace(heard(120, 1), id="late"),
                dataclasses.replace(heard(400, 300), id="gone"),
            ]
        ),
        RULE,
        clock=lambda: now_s,
    )
    metrics.register(SnapshotFigures(snapshotter))
    assert "ki_health_instances" not in metrics.exposition()[0].decode()  # no snapshot yet: nothing claimed
    snapshotter.refresh()
    text = metrics.exposition()[0].decode()
    assert 'ki_health_instances{state="healthy"} 2.0' in text
    assert 'ki_health_instances{state="unhealthy"} 1.0' in text
    assert "ki_health_instances_stale 1.0" in text
    assert "ki_health_instances_lagging 1.0" in text
    (line,) = [x for x in text.splitlines() if x.startswith("ki_health_snapshot_computed_timestamp_seconds ")]
    assert float(line.split()[1]) == now_s
    assert "ki_health_snapshot_rebuild_failing 0.0" in text
