"""The snapshot's figures for the collector's ``/metrics``: instances by state, and whether rebuilds keep up."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kernel_insight.api.health.snapshotter import Snapshotter

__all__ = ["SnapshotFigures"]


class SnapshotFigures(Collector):
    """Read from the current snapshot at scrape time (a few microseconds per instance); nothing is
    exported before the first snapshot, so an absent series means "no snapshot yet"."""

    def __init__(self, snapshotter: Snapshotter) -> None:
        self.snapshotter = snapshotter

    def collect(self) -> Iterable[Metric]:
        snap = self.snapshotter.snapshot
        if snap is None:
            return
        healthy = int(snap.healthy.sum())
        by_state = GaugeMetricFamily(
            "ki_health_instances", "Instances in the health snapshot, by healthy or not", labels=["state"]
        )
        by_state.add_metric(["healthy"], healthy)
        by_state.add_metric(["unhealthy"], len(snap.records) - healthy)
        stale = GaugeMetricFamily("ki_health_instances_stale", "Instances judged stale (docs/api.md)")
        stale.add_metric([], sum(1 for r in snap.records if r["stale"]))
        lagging = GaugeMetricFamily(
            "ki_health_instances_lagging",
            "Instances whose data is late while their agent is heard (catching up): still selectable",
        )
        lagging.add_metric([], sum(1 for r in snap.records if r["lagging"]))
        computed = GaugeMetricFamily(
            "ki_health_snapshot_computed_timestamp_seconds",
            "When the snapshot was last rebuilt (unix seconds)",
        )
        computed.add_metric([], snap.computed_at_ms / 1000)
        failing = GaugeMetricFamily(
            "ki_health_snapshot_rebuild_failing",
            "1 while the last rebuild failed (the store could not be read)",
        )
        failing.add_metric([], 0 if self.snapshotter.last_error is None else 1)
        yield from (by_state, stale, lagging, computed, failing)
