"""The query and health-snapshot HTTP API served by the collector (docs/api.md).

``create_api_app(store, tokens=TokenStore(path))`` is the collector app with every router of
this package; ``api_routers`` gives the routers alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_insight._lazy import lazy_exports

if TYPE_CHECKING:
    # The package's exports: each name is imported from its module on first use
    # (kernel_insight/_lazy.py reads this block); ``X as X`` marks it re-exported.
    from kernel_insight.api.agents import agents_router as agents_router
    from kernel_insight.api.app import TlsFiles as TlsFiles
    from kernel_insight.api.app import api_routers as api_routers
    from kernel_insight.api.app import create_api_app as create_api_app
    from kernel_insight.api.app import default_metadata as default_metadata
    from kernel_insight.api.app import query_fast_path as query_fast_path
    from kernel_insight.api.app import serve as serve
    from kernel_insight.api.auth import Authenticator as Authenticator
    from kernel_insight.api.auth import ClickHouseTokenStore as ClickHouseTokenStore
    from kernel_insight.api.auth import CreatedToken as CreatedToken
    from kernel_insight.api.auth import Scope as Scope
    from kernel_insight.api.auth import TokenError as TokenError
    from kernel_insight.api.auth import TokenInfo as TokenInfo
    from kernel_insight.api.auth import TokenStore as TokenStore
    from kernel_insight.api.auth import TokenStoreBase as TokenStoreBase
    from kernel_insight.api.auth import UnknownToken as UnknownToken
    from kernel_insight.api.auth import open_token_store as open_token_store
    from kernel_insight.api.connections import ConnectionLimits as ConnectionLimits
    from kernel_insight.api.connections import guarded_protocol as guarded_protocol
    from kernel_insight.api.errors import ApiError as ApiError
    from kernel_insight.api.errors import install_error_handlers as install_error_handlers
    from kernel_insight.api.health import HealthRule as HealthRule
    from kernel_insight.api.health import HealthSource as HealthSource
    from kernel_insight.api.health import InstanceFacts as InstanceFacts
    from kernel_insight.api.health import Snapshot as Snapshot
    from kernel_insight.api.health import Snapshotter as Snapshotter
    from kernel_insight.api.health import StoreSource as StoreSource
    from kernel_insight.api.health import build_snapshot as build_snapshot
    from kernel_insight.api.health import health_router as health_router
    from kernel_insight.api.instances import instances_router as instances_router
    from kernel_insight.api.logs import RepeatFilter as RepeatFilter
    from kernel_insight.api.prometheus import QueryFastPath as QueryFastPath
    from kernel_insight.api.prometheus import prometheus_router as prometheus_router
    from kernel_insight.api.prometheus import query_routes as query_routes
    from kernel_insight.api.timeline import timeline_router as timeline_router
    from kernel_insight.api.topology import topology_router as topology_router
    from kernel_insight.api.ui import ui_router as ui_router


__getattr__, __dir__ = lazy_exports(globals())
