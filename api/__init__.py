"""The query and health-snapshot HTTP API served by the collector (docs/api.md).

``create_api_app(store, tokens=TokenStore(path))`` is the collector app with every router of
this package; ``api_routers`` gives the routers alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_insight._lazy import lazy_exports

if TYPE_CHECKING:
    from kernel_insight.api.agents import agents_router
    from kernel_insight.api.app import (
        TlsFiles,
        api_routers,
        create_api_app,
        default_metadata,
        query_fast_path,
        serve,
    )
    from kernel_insight.api.auth import (
        Authenticator,
        ClickHouseTokenStore,
        CreatedToken,
        Scope,
        TokenError,
        TokenInfo,
        TokenStore,
        TokenStoreBase,
        UnknownToken,
        open_token_store,
    )
    from kernel_insight.api.connections import ConnectionLimits, guarded_protocol
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
    from kernel_insight.api.logs import RepeatFilter
    from kernel_insight.api.prometheus import QueryFastPath, prometheus_router, query_routes
    from kernel_insight.api.timeline import timeline_router
    from kernel_insight.api.topology import topology_router
    from kernel_insight.api.ui import ui_router

_EXPORTS: dict[str, tuple[str, ...]] = {
    "kernel_insight.api.agents": ("agents_router",),
    "kernel_insight.api.app": (
        "TlsFiles",
        "api_routers",
        "create_api_app",
        "default_metadata",
        "query_fast_path",
        "serve",
    ),
    "kernel_insight.api.auth": (
        "Authenticator",
        "ClickHouseTokenStore",
        "CreatedToken",
        "Scope",
        "TokenError",
        "TokenInfo",
        "TokenStore",
        "TokenStoreBase",
        "UnknownToken",
        "open_token_store",
    ),
    "kernel_insight.api.connections": (
        "ConnectionLimits",
        "guarded_protocol",
    ),
    "kernel_insight.api.errors": (
        "ApiError",
        "install_error_handlers",
    ),
    "kernel_insight.api.health": (
        "HealthRule",
        "HealthSource",
        "InstanceFacts",
        "Snapshot",
        "Snapshotter",
        "StoreSource",
        "build_snapshot",
        "health_router",
    ),
    "kernel_insight.api.instances": ("instances_router",),
    "kernel_insight.api.logs": ("RepeatFilter",),
    "kernel_insight.api.prometheus": (
        "QueryFastPath",
        "prometheus_router",
        "query_routes",
    ),
    "kernel_insight.api.timeline": ("timeline_router",),
    "kernel_insight.api.topology": ("topology_router",),
    "kernel_insight.api.ui": ("ui_router",),
}

__all__ = [
    "ApiError",
    "Authenticator",
    "ClickHouseTokenStore",
    "ConnectionLimits",
    "CreatedToken",
    "HealthRule",
    "HealthSource",
    "InstanceFacts",
    "QueryFastPath",
    "RepeatFilter",
    "Scope",
    "Snapshot",
    "Snapshotter",
    "StoreSource",
    "TlsFiles",
    "TokenError",
    "TokenInfo",
    "TokenStore",
    "TokenStoreBase",
    "UnknownToken",
    "agents_router",
    "api_routers",
    "build_snapshot",
    "create_api_app",
    "default_metadata",
    "guarded_protocol",
    "health_router",
    "install_error_handlers",
    "instances_router",
    "open_token_store",
    "prometheus_router",
    "query_fast_path",
    "query_routes",
    "serve",
    "timeline_router",
    "topology_router",
    "ui_router",
]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
