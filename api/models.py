"""Response models of the health and instance endpoints: they document the JSON in the OpenAPI schema.

The snapshot's hot path writes pre-encoded JSON bytes rather than these models (see
``health.py``); ``tests/api/test_api_health.py`` validates those bytes against the models.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

__all__ = [
    "ErrorBody",
    "Fingerprint",
    "HealthRuleModel",
    "HealthSnapshot",
    "InstanceDetail",
    "InstanceHealth",
    "InstanceList",
    "NcclLatency",
    "RecentError",
    "ServingLoad",
    "Topology",
    "TopologyGroup",
]


class ErrorBody(BaseModel):
    status: str = Field(examples=["error"])
    errorType: str = Field(examples=["bad_data"])
    error: str


class Fingerprint(BaseModel):
    """What the hardware is; ``hardware_fingerprint`` ignores driver and CUDA versions."""

    hardware_fingerprint: str
    gpu_model: str
    gpu_count: int
    driver_version: str | None = None
    cuda_version: str | None = None
    memory_total_bytes: int
    nvlink_bandwidth: float | None = Field(
        None, description="summed over the GPUs, in the unit the FINGERPRINT record carries"
    )


class NcclLatency(BaseModel):
    """Quantiles of every NCCL operation's duration over the last 5 minutes, all ops and GPUs pooled."""

    p50: float
    p90: float
    p99: float
    count: int


class GpuPod(BaseModel):
    gpu: int
    pod: str
    namespace: str
    container: str


class ServingLoad(BaseModel):
    engines: list[str] = Field(
        description="the engines whose metrics were read (vllm, sglang, tgi, trtllm-serve)"
    )
    requests_waiting: int | None = Field(description="queued requests, summed over the instance's engines")
    requests_running: int | None = Field(description="requests in the running batches, summed")
    kv_cache_usage_ratio: float | None = Field(
        description="KV cache held by running requests, 0-1, the fullest engine"
    )
    prefix_cache_hit_ratio: float | None = Field(
        description="prompt tokens found in the prefix cache / looked up, 0-1 (since the engine started)"
    )
    sample_ms: int = Field(
        description="the newest of these samples' own timestamps: their age is now - sample_ms"
    )


class InstanceHealth(BaseModel):
    id: str
    name: str | None = Field(
        None,
        description="the enrolment name of the instance's agent (`ki keys list`); null for data no enrolled agent sent",
    )
    models: list[str] = Field(
        description="models served, from the instance's `models` label (comma-separated)"
    )
    labels: dict[str, str]
    fingerprint: Fingerprint
    gpu_memory_free_bytes: int | None
    gpu_memory_total_bytes: int | None
    gpu_memory_free_ratio: float | None
    nccl_latency_seconds: NcclLatency | None
    errors_5m: int = Field(description="ERROR events in the last 5 minutes")
    error_rate_per_s: float = Field(description="errors_5m / 300")
    temperature_celsius: float | None = Field(description="hottest GPU")
    power_watts: float | None = Field(description="summed over the GPUs")
    sm_utilization_ratio: float | None = Field(description="mean over the GPUs")
    serving: ServingLoad | None = Field(
        None,
        description="the serving engine's own load metrics (docs/api.md, 'Serving load'); null without them",
    )
    last_seen_ms: int = Field(description="the newest data's own (producer) timestamp")
    last_heard_ms: int | None = Field(
        None, description="when the collector stored the newest batch of the instance's agent (its heartbeat)"
    )
    ingest_lag_s: float | None = Field(
        None,
        description="that batch's receive time minus its newest record's time: how late its data arrives",
    )
    healthy: bool
    stale: bool
    lagging: bool = Field(
        False,
        description="data older than stale_after_s, but the agent is heard and catching up: still selectable",
    )
    reasons: list[str] = Field(description="why the instance is not healthy; empty when healthy")
    pods: list[GpuPod] = Field(
        default_factory=list,
        description="the Kubernetes pod holding each of its GPUs, as the kubelet's PodResources API says "
        "(`ki probe nvml --kubelet-socket`); empty off Kubernetes",
    )


class HealthRuleModel(BaseModel):
    stale_after_s: float
    max_data_age_s: float
    max_errors_5m: int
    fatal_error_kinds: list[str]
    max_temperature_celsius: float
    require_memory_data: bool


class HealthSnapshot(BaseModel):
    as_of_ms: int = Field(
        description="when the instances' data last changed (a recomputation that changed it)"
    )
    rule: HealthRuleModel
    instances: list[InstanceHealth]


class InstanceList(BaseModel):
    as_of_ms: int
    instances: list[InstanceHealth]


class RecentError(BaseModel):
    ts_ms: int
    gpu: int
    kind: str
    code: int
    message: str


class InstanceDetail(BaseModel):
    instance: InstanceHealth
    attributes: dict[str, str] = Field(description="raw FINGERPRINT fields, gpu<N>.<field>")
    recent_errors: list[RecentError]


class TopologyMember(BaseModel):
    """One instance at its place: its health and what its hardware is."""

    id: str
    healthy: bool
    fingerprint: Fingerprint


class TopologyGroup(BaseModel):
    host: str
    rack: str
    switch: str
    instances: list[str]
    healthy: int
    members: list[TopologyMember]


class Topology(BaseModel):
    as_of_ms: int
    groups: list[TopologyGroup]
