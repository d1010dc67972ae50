"""The collector app with the query and health API mounted, and ``serve`` for running it.

``create_api_app(store, tokens=...)`` is ``collector.create_app`` plus the routers of
this package; :func:`api_routers` gives the routers alone to compose differently.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, FastAPI

from kernel_insight.api.agents import agents_router
from kernel_insight.api.auth import Authenticator, Scope, TokenStoreBase
from kernel_insight.api.errors import install_error_handlers
from kernel_insight.api.health import (
    DEFAULT_INTERVAL_S,
    HealthRule,
    HealthSource,
    Snapshotter,
    StoreSource,
    health_router,
)
from kernel_insight.api.instances import instances_router
from kernel_insight.api.prometheus import MetricMetadata, prometheus_router
from kernel_insight.api.topology import topology_router

if TYPE_CHECKING:
    from kernel_insight.collector.keys import KeyStoreBase

__all__ = ["LOCAL_DEV_HOST", "api_routers", "create_api_app", "default_metadata", "listening_socket", "serve"]

#: The only address a server without token checks may listen on.
LOCAL_DEV_HOST = "127.0.0.1"


def default_metadata() -> MetricMetadata:
    """Type, help and unit of the GPU sample metrics (docs/metrics.md) for ``/api/v1/metadata``."""
    from kernel_insight.agent.metric_ids import METRIC_SPECS

    return {s.name: [{"type": s.type, "help": s.help, "unit": s.unit}] for s in METRIC_SPECS.values()}


def api_routers(
    store: Any,
    auth: Authenticator,
    *,
    rule: HealthRule | None = None,
    interval_s: float = DEFAULT_INTERVAL_S,
    source: HealthSource | None = None,
) -> tuple[list[APIRouter], Snapshotter]:
    """The routers (health snapshot, instances, topology, Prometheus API) and the snapshotter they share.

    The health router's lifespan starts and stops the snapshotter with the app.
    """
    snapshotter = Snapshotter(source or StoreSource(store), rule, interval_s=interval_s)
    storage_factory: Callable[[], Any] = store.storage
    routers = [
        health_router(snapshotter, auth),
        instances_router(snapshotter, auth),
        topology_router(snapshotter, auth),
        prometheus_router(storage_factory, auth, metadata=default_metadata()),
    ]
    return routers, snapshotter


def create_api_app(
    store: Any,
    *,
    tokens: TokenStoreBase | None = None,
    local_dev: bool = False,
    rule: HealthRule | None = None,
    interval_s: float = DEFAULT_INTERVAL_S,
    extra_routers: list[APIRouter] | None = None,
    keys: KeyStoreBase | None = None,
) -> FastAPI:
    """The collector app over ``store`` with this package's routers; ``app.state.snapshotter`` is the snapshotter.

    remote_write takes tokens with the ``ingest`` scope; with ``keys`` (the agent key store)
    the ``/v1/agents`` enrolment endpoints (scope ``ingest-admin``) are served too.
    """
    from kernel_insight.collector.app import create_app

    auth = Authenticator(tokens, local_dev=local_dev)
    routers, snapshotter = api_routers(store, auth, rule=rule, interval_s=interval_s)
    if keys is not None:
        routers.append(agents_router(keys, auth))
    app = create_app(
        store,
        routers=[*routers, *(extra_routers or [])],
        write_dependencies=[Depends(auth.require(Scope.INGEST))],
    )
    install_error_handlers(app)
    app.state.snapshotter = snapshotter
    app.state.authenticator = auth
    return app


def listening_socket(host: str, port: int, *, backlog: int = 2048) -> socket.socket:
    """A bound, listening TCP socket for uvicorn (port 0: an ephemeral port).

    Made with ``IPPROTO_TCP`` explicitly: asyncio sets TCP_NODELAY on accepted connections only
    when the listening socket's protocol says TCP, and without it every response after the first
    on a kept-alive connection waited ~40 ms for the client's delayed ACK (Nagle).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    # Listen before anyone says "listening": a client that connects before uvicorn starts
    # waits in the backlog instead of being refused (seen with two collectors starting at once).
    sock.listen(backlog)
    return sock


def serve(app: FastAPI, host: str, port: int, *, local_dev: bool) -> None:
    """Run ``app`` with uvicorn; local development mode refuses any address but 127.0.0.1 and says so."""
    import uvicorn

    if local_dev:
        if host != LOCAL_DEV_HOST:
            raise ValueError(f"local development mode (no tokens) binds {LOCAL_DEV_HOST} only, not {host}")
        print(
            f"ki: LOCAL DEVELOPMENT MODE: no bearer tokens are checked; bound to {LOCAL_DEV_HOST} only",
            file=sys.stderr,
            flush=True,
        )
    sock = listening_socket(host, port)
    bound = sock.getsockname()[1]
    print(f"ki: listening on http://{host}:{bound}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
