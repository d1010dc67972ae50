"""The collector's tunables whose defaults ``ki collector --help`` prints, defined once here.

This module imports nothing but the standard library: the help text needs these numbers, and
the modules that use them (derive, hist_base, metrics, rows) import numpy, pyarrow and the engine,
which took ``ki collector --help`` past half a second. Those modules import the values from here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BASE_MAX_BYTES",
    "BATCHER_SHUTDOWN_S",
    "DEFAULT_STORE_STATS_INTERVAL_S",
    "EMBEDDED_INGEST_WAL",
    "SYNC_KEEP_NS",
    "SYNC_SAMPLE_EVERY",
    "SeriesLimits",
]

#: Syncs stored per call (``gpu_calls``): every one that waited at least this long (50 us) ...
SYNC_KEEP_NS = 50_000
#: ... and 1 in this many of the shorter ones (a training loop syncs thousands of times a second,
#: mostly for microseconds; the counters and cuda_sync_time_seconds_total still count every one).
SYNC_SAMPLE_EVERY = 100
#: The bases of all agents of one collector together (``BaseBudget``; ``ki collector
#: --histogram-base-mb``): at ~0.5 MB per GPU of 100 busy kernels, ~500 GPUs' worth, more than one
#: collector core ingests (docs/scaling.md); without a bound a collector's memory grew with its fleet.
BASE_MAX_BYTES = 256 << 20
#: How long a stopping collector keeps writing what it has accepted (retrying an unavailable
#: store) before it gives up and leaves the groups to its write-ahead files. Every shipped way
#: to run it (systemd's TimeoutStopSec, Kubernetes' terminationGracePeriodSeconds, compose's
#: stop_grace_period) waits longer than this before SIGKILL: tests/deploy checks each.
BATCHER_SHUTDOWN_S = 30.0
#: The ingest write-ahead files' directory inside an embedded store's data directory (the default
#: of ``ki collector --ingest-wal``; where ``ki restore`` puts the groups a backup cut).
EMBEDDED_INGEST_WAL = "ingest-wal"
#: How often the parts, rows and bytes per table are read from ``system.parts``.
DEFAULT_STORE_STATS_INTERVAL_S = 30.0


@dataclass(frozen=True, slots=True)
class SeriesLimits:
    """What a series may look like when it arrives from outside (remote_write, ``ki import``).

    Names follow Prometheus' classic rules (``[a-zA-Z_:][a-zA-Z0-9_:]*`` for metric names,
    ``[a-zA-Z_][a-zA-Z0-9_]*`` for label names) unless ``utf8_names`` allows any non-empty
    UTF-8, as Prometheus 3's ``metric_name_validation_scheme: utf8`` does. The size limits
    default to Grafana Mimir's (30 labels, 1,024-byte names, 2,048-byte values); 0 turns one off.
    """

    max_labels: int = 30
    max_name_bytes: int = 1024
    max_value_bytes: int = 2048
    utf8_names: bool = False
