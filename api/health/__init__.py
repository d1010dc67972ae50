"""The health snapshot: every instance's capacity and health, recomputed in the background, served as bytes.

A request never touches the store: :class:`Snapshotter` (``snapshotter.py``) rebuilds an
immutable :class:`Snapshot` (``snapshot.py``: pre-encoded JSON per instance, an ETag over the
content) every few seconds from a :class:`HealthSource` (``source.py``: the store), and the
handler (``router.py``) only filters and joins bytes. That is what keeps a snapshot request's
p99 within its target at 1,000 instances (``make bench-api``, docs/benchmarks.md) and makes ``If-None-Match`` -> 304 free. The healthy/stale/lagging rule is
:class:`HealthRule` (``rule.py``; docs/api.md states it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_insight._lazy import lazy_exports

if TYPE_CHECKING:
    # The package's exports: each name is imported from its module on first use
    # (kernel_insight/_lazy.py reads this block); ``X as X`` marks it re-exported.
    from kernel_insight.api.health.metrics import SnapshotFigures as SnapshotFigures
    from kernel_insight.api.health.router import CACHE_CONTROL as CACHE_CONTROL
    from kernel_insight.api.health.router import ERROR_RESPONSES as ERROR_RESPONSES
    from kernel_insight.api.health.router import cached_json as cached_json
    from kernel_insight.api.health.router import current_snapshot as current_snapshot
    from kernel_insight.api.health.router import etag_matches as etag_matches
    from kernel_insight.api.health.router import health_router as health_router
    from kernel_insight.api.health.rule import ERROR_WINDOW_MS as ERROR_WINDOW_MS
    from kernel_insight.api.health.rule import HealthRule as HealthRule
    from kernel_insight.api.health.rule import HealthSource as HealthSource
    from kernel_insight.api.health.rule import InstanceFacts as InstanceFacts
    from kernel_insight.api.health.snapshot import Snapshot as Snapshot
    from kernel_insight.api.health.snapshot import build_snapshot as build_snapshot
    from kernel_insight.api.health.snapshot import encode_json as encode_json
    from kernel_insight.api.health.snapshot import instance_record as instance_record
    from kernel_insight.api.health.snapshot import served_models as served_models
    from kernel_insight.api.health.snapshotter import DEFAULT_INTERVAL_S as DEFAULT_INTERVAL_S
    from kernel_insight.api.health.snapshotter import Snapshotter as Snapshotter
    from kernel_insight.api.health.source import StoreSource as StoreSource


__getattr__, __dir__ = lazy_exports(globals())
