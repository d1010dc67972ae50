"""The Python client: health snapshots, instance selection, failure-aware routing and kql queries (docs/api.md).

Depends on httpx only. Sync clients first; ``Async*`` twins share their logic::

    from kernel_insight.sdk import HealthClient
    health = HealthClient("http://collector:8470", token="ki_...")
    inst = health.select_instance(required_free_bytes=20 << 30, model="llama-70b")
"""

from __future__ import annotations

from kernel_insight.sdk._client import (
    DEFAULT_MAX_STALE_S,
    DEFAULT_TTL_S,
    AsyncHealthClient,
    AsyncKqlClient,
    HealthClient,
    KqlClient,
)
from kernel_insight.sdk._exceptions import (
    ApiError,
    AuthenticationError,
    BadRequestError,
    KernelInsightError,
    NoEligibleInstance,
    NotFoundError,
    PermissionDeniedError,
    ServerError,
    SnapshotUnavailable,
    TransportError,
)
from kernel_insight.sdk._memory import ModelCatalog, ModelMetadataError, ModelSpec, request_memory
from kernel_insight.sdk._models import (
    Fingerprint,
    GpuPod,
    HealthSnapshot,
    Histogram,
    HistogramBucket,
    Instance,
    NcclLatency,
    QueryResult,
    Sample,
    Series,
    ServingLoad,
)
from kernel_insight.sdk._route import (
    Attempt,
    Classifier,
    Failure,
    RouteFailed,
    RoutePolicy,
    aroute,
    classify,
    route,
)
from kernel_insight.sdk._select import LoadPolicy, SelectionIndex, load_cost, prefix_key, weight
from kernel_insight.sdk._timeline import (
    AsyncTimelineClient,
    CaptureRequest,
    Correlation,
    GpuCall,
    KernelSummary,
    Span,
    TimelineClient,
    TimelineEvent,
    TimelineSummary,
)
from kernel_insight.sdk._transport import AsyncRoutingTransport, RoutingTransport, endpoint_label

__all__ = [
    "DEFAULT_MAX_STALE_S",
    "DEFAULT_TTL_S",
    "ApiError",
    "AsyncHealthClient",
    "AsyncKqlClient",
    "AsyncRoutingTransport",
    "AsyncTimelineClient",
    "Attempt",
    "AuthenticationError",
    "BadRequestError",
    "CaptureRequest",
    "Classifier",
    "Correlation",
    "Failure",
    "Fingerprint",
    "GpuCall",
    "GpuPod",
    "HealthClient",
    "HealthSnapshot",
    "Histogram",
    "HistogramBucket",
    "Instance",
    "KernelInsightError",
    "KernelSummary",
    "KqlClient",
    "LoadPolicy",
    "ModelCatalog",
    "ModelMetadataError",
    "ModelSpec",
    "NcclLatency",
    "NoEligibleInstance",
    "NotFoundError",
    "PermissionDeniedError",
    "QueryResult",
    "RouteFailed",
    "RoutePolicy",
    "RoutingTransport",
    "Sample",
    "SelectionIndex",
    "Series",
    "ServerError",
    "ServingLoad",
    "SnapshotUnavailable",
    "Span",
    "TimelineClient",
    "TimelineEvent",
    "TimelineSummary",
    "TransportError",
    "aroute",
    "classify",
    "endpoint_label",
    "load_cost",
    "prefix_key",
    "request_memory",
    "route",
    "weight",
]
