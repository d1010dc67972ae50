"""The query and health-snapshot HTTP API served by the collector (docs/api.md).

``create_api_app(store, tokens=TokenStore(path))`` is the collector app with every router of
this package; ``api_routers`` gives the routers alone.
"""

from __future__ import annotations

from kernel_insight.api.app import api_routers, create_api_app, default_metadata, serve
from kernel_insight.api.auth import (
    Authenticator,
    CreatedToken,
    Scope,
    TokenError,
    TokenInfo,
    TokenStore,
    UnknownToken,
)
from kernel_insight.api.errors import ApiError, install_error_handlers
from kernel_insight.api.health import (
    HealthRule,
    HealthSource,
    InstanceFacts,
    Snapshot,
    Snapshotter,
    StoreSource,
    build_snapshot,
    health_router,
)
from kernel_insight.api.instances import instances_router
from kernel_insight.api.prometheus import prometheus_router
from kernel_insight.api.topology import topology_router

__all__ = [
    "ApiError",
    "Authenticator",
    "CreatedToken",
    "HealthRule",
    "HealthSource",
    "InstanceFacts",
    "Scope",
    "Snapshot",
    "Snapshotter",
    "StoreSource",
    "TokenError",
    "TokenInfo",
    "TokenStore",
    "UnknownToken",
    "api_routers",
    "build_snapshot",
    "create_api_app",
    "default_metadata",
    "health_router",
    "install_error_handlers",
    "instances_router",
    "prometheus_router",
    "serve",
    "topology_router",
]
