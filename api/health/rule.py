"""When an instance is stale, lagging and healthy: :class:`HealthRule` over the :class:`InstanceFacts` a source reports."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kernel_insight.api.health.serving import ServingFacts

if TYPE_CHECKING:
    import numpy as np

__all__ = ["ERROR_WINDOW_MS", "HealthRule", "HealthSource", "InstanceFacts"]

#: The window of the error count and the NCCL latency quantiles.
ERROR_WINDOW_MS = 5 * 60 * 1000


@dataclass(frozen=True, slots=True)
class HealthRule:
    """When an instance is ``stale``, ``lagging`` and ``healthy`` (docs/api.md states it exactly).

    Two clocks: the producers' (``last_seen_ms``, the newest data's own timestamp) and the
    collector's (``last_heard_ms``, when the newest batch of its agent was stored: the
    heartbeat). ``fresh``: the newest data is at most ``stale_after_s`` old. ``lagging``: not
    fresh, but the agent was heard within ``stale_after_s`` and the newest data is at most
    ``max_data_age_s`` old: the agent is catching up on a backlog, which is no reason to stop
    routing to the instance. ``stale``: neither.
    ``healthy``: not stale, a free-memory sample within the last 5 minutes (when
    ``require_memory_data``), at most ``max_errors_5m`` errors and no error of a
    ``fatal_error_kinds`` kind in the last 5 minutes, and no GPU hotter than
    ``max_temperature_celsius``. Every failed condition is listed in ``reasons``.
    """

    stale_after_s: float = 60.0
    max_data_age_s: float = 300.0
    max_errors_5m: int = 10
    fatal_error_kinds: tuple[str, ...] = ("xid", "ecc")
    max_temperature_celsius: float = 90.0
    require_memory_data: bool = True

    def freshness(self, facts: InstanceFacts, now_ms: int) -> tuple[bool, bool, str | None]:
        """(stale, lagging, why stale)."""
        data_age_s = (now_ms - facts.last_seen_ms) / 1000.0
        if data_age_s <= self.stale_after_s:
            return False, False, None
        heard = (
            facts.last_heard_ms is not None and (now_ms - facts.last_heard_ms) / 1000.0 <= self.stale_after_s
        )
        if heard and data_age_s <= self.max_data_age_s:
            return False, True, None
        # No age in the text: it would change the snapshot, and its ETag, on every rebuild.
        if heard:
            return (
                True,
                False,
                (
                    f"stale: newest data older than {self.max_data_age_s:g} s although its agent is sending (ingest lag)"
                ),
            )
        return True, False, f"stale: nothing heard for more than {self.stale_after_s:g} s"

    def judge(self, facts: InstanceFacts, now_ms: int) -> tuple[bool, bool, list[str]]:
        """(healthy, stale, reasons)."""
        reasons: list[str] = []
        stale, _, why = self.freshness(facts, now_ms)
        if why is not None:
            reasons.append(why)
        if self.require_memory_data and facts.gpu_memory_free_bytes is None:
            reasons.append("no gpu_memory_free_bytes sample in the last 5 minutes")
        total = sum(facts.errors_by_kind.values())
        if total > self.max_errors_5m:
            reasons.append(f"{total} errors in the last 5 minutes (more than {self.max_errors_5m})")
        for kind in self.fatal_error_kinds:
            if facts.errors_by_kind.get(kind, 0):
                reasons.append(f"{facts.errors_by_kind[kind]} {kind} error(s) in the last 5 minutes")
        temp = facts.temperature_celsius
        if temp is not None and temp > self.max_temperature_celsius:
            reasons.append(f"temperature {temp:g} C above {self.max_temperature_celsius:g} C")
        return not reasons, stale, reasons

    def as_dict(self) -> dict[str, Any]:
        return {
            "stale_after_s": self.stale_after_s,
            "max_data_age_s": self.max_data_age_s,
            "max_errors_5m": self.max_errors_5m,
            "fatal_error_kinds": list(self.fatal_error_kinds),
            "max_temperature_celsius": self.max_temperature_celsius,
            "require_memory_data": self.require_memory_data,
        }


@dataclass(slots=True)
class InstanceFacts:
    """What a :class:`HealthSource` knows about one instance; None means no data."""

    id: str
    last_seen_ms: int  # producer clock: the newest data's own timestamp
    name: str | None = None  # the enrolment name of the instance's agent, for people to read
    labels: Mapping[str, str] = field(default_factory=dict)
    attributes: Mapping[str, str] = field(default_factory=dict)
    hardware_fingerprint: str = ""
    gpu_model: str = ""
    gpu_count: int = 0
    memory_total_bytes: int = 0
    gpu_memory_free_bytes: float | None = None
    gpu_memory_total_bytes: float | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    sm_utilization_ratio: float | None = None
    nccl_latencies: Sequence[float] | np.ndarray[Any, Any] = ()  # raw durations, or:
    nccl_quantiles: tuple[float, float, float, int] | None = None  # (p50, p90, p99, count) computed elsewhere
    errors_by_kind: Mapping[str, int] = field(default_factory=dict)
    last_heard_ms: int | None = None  # collector clock: when its agent's newest batch was stored
    ingest_lag_s: float | None = None  # that batch's receive time minus its t_max
    serving: ServingFacts | None = None  # the serving engine's load (serving.py), None without its metrics


class HealthSource(Protocol):
    """Where the snapshot's facts come from (the store in production, a fake in tests)."""

    def collect(self, now_ms: int) -> list[InstanceFacts]: ...

    def recent_errors(self, instance_id: str, limit: int) -> list[dict[str, Any]]: ...
