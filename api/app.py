"""The collector app with the query and health API mounted, and ``serve`` for running it.

``create_api_app(store, tokens=...)`` is ``collector.create_app`` plus the routers of
this package; :func:`api_routers` gives the routers alone to compose differently.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import ssl
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI

from kernel_insight.api.agents import agents_router
from kernel_insight.api.auth import Authenticator, Scope, TokenStoreBase
from kernel_insight.api.connections import ConnectionLimits, guarded_protocol, raise_nofile_limit
from kernel_insight.api.errors import install_error_handlers
from kernel_insight.api.health import (
    DEFAULT_INTERVAL_S,
    HealthRule,
    HealthSource,
    SnapshotFigures,
    Snapshotter,
    StoreSource,
    health_router,
)
from kernel_insight.api.instances import instances_router
from kernel_insight.api.logs import install_repeat_filter
from kernel_insight.api.prometheus import MetricMetadata, QueryFastPath, prometheus_router, query_routes
from kernel_insight.api.timeline import timeline_router
from kernel_insight.api.topology import topology_router

if TYPE_CHECKING:
    from kernel_insight.collector.keys import KeyStoreBase
    from kernel_insight.collector.metrics import CollectorMetrics
    from kernel_insight.kql.limits import EngineLimits

__all__ = [
    "LOCAL_DEV_HOST",
    "TlsFiles",
    "api_routers",
    "create_api_app",
    "default_metadata",
    "listening_socket",
    "query_fast_path",
    "serve",
]

#: The GIL switch interval ``serve`` sets (Python's default is 5 ms).
SWITCH_INTERVAL_S = 0.001

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
    query_limits: EngineLimits | None = None,
    name_of: Callable[[str], str | None] | None = None,
) -> tuple[list[APIRouter], Snapshotter]:
    """The routers (health snapshot, instances, topology, timeline, Prometheus API) and the snapshotter they share.

    ``query_limits`` bound every query of the Prometheus API (None: ``EngineLimits()``);
    ``name_of`` gives an instance's enrolment name (the key store's), shown in the snapshot.

    The health router's lifespan starts and stops the snapshotter with the app.
    """
    snapshotter = Snapshotter(source or StoreSource(store, name_of), rule, interval_s=interval_s)
    storage_factory: Callable[[], Any] = store.storage
    routers = [
        health_router(snapshotter, auth),
        instances_router(snapshotter, auth),
        topology_router(snapshotter, auth),
        timeline_router(store, auth),
        prometheus_router(storage_factory, auth, limits=query_limits, metadata=default_metadata()),
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
    metrics: CollectorMetrics | None = None,
    query_limits: EngineLimits | None = None,
) -> FastAPI:
    """The collector app over ``store`` with this package's routers; ``app.state.snapshotter`` is the snapshotter.

    remote_write takes tokens with the ``ingest`` scope; with ``keys`` (the agent key store)
    the ``/v1/agents`` enrolment endpoints (scope ``ingest-admin``) are served too.
    ``metrics``: the collector's own metrics (``collector.create_app``), shared with the ingest router;
    the snapshot's instances by state join them.
    """
    from kernel_insight.collector.app import create_app

    auth = Authenticator(tokens, local_dev=local_dev)
    routers, snapshotter = api_routers(
        store,
        auth,
        rule=rule,
        interval_s=interval_s,
        query_limits=query_limits,
        name_of=None if keys is None else keys.name_of,
    )
    if keys is not None:
        routers.append(agents_router(keys, auth))
    app = create_app(
        store,
        routers=[*routers, *(extra_routers or [])],
        write_auth=functools.partial(auth.check, scope=Scope.INGEST),
        metrics=metrics,
    )
    # The query endpoints first of all routes: the most frequent requests, matched at once.
    app.router.routes[0:0] = [route for router in routers for route in query_routes(router)]
    install_error_handlers(app)
    app.state.metrics.register(SnapshotFigures(snapshotter))
    app.state.snapshotter = snapshotter
    app.state.authenticator = auth
    return app


def listening_socket(host: str, port: int, *, backlog: int = 2048) -> socket.socket:
    """A bound, listening TCP socket for uvicorn (port 0: an ephemeral port).

    Made with ``IPPROTO_TCP`` explicitly: asyncio sets TCP_NODELAY on accepted connections only
    when the listening socket's protocol says TCP, and without it every response after the first
    on a kept-alive connection waited for the client's delayed ACK (Nagle): bench-kql's keep-alive
    clients show it (bench/results/kql.md).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    # Listen before anyone says "listening": a client that connects before uvicorn starts
    # waits in the backlog instead of being refused (seen with two collectors starting at once).
    sock.listen(backlog)
    return sock


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for HTTPS: the server's certificate chain and key, and optionally the CAs whose
    client certificates it requires (mutual TLS; without ``client_ca`` clients are not asked for one)."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def context(self) -> ssl.SSLContext:
        """A server TLS context from these files; a ValueError names the file that is wrong."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            ctx.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"cannot load the TLS certificate {self.cert} with key {self.key}: {exc}"
            ) from None
        if self.client_ca is not None:
            try:
                ctx.load_verify_locations(cafile=self.client_ca)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"cannot load the client CA file {self.client_ca}: {exc}") from None
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


def serve(
    app: FastAPI,
    host: str,
    port: int,
    *,
    local_dev: bool,
    tls: TlsFiles | None = None,
    limits: ConnectionLimits | None = None,
) -> None:
    """Run ``app`` with uvicorn; local development mode refuses any address but 127.0.0.1 and says so.

    ``limits`` bound what clients can hold (connections, head and body deadlines;
    docs/security.md); the descriptor limit is raised to its hard limit first and the
    connection cap lowered to fit it. ``tls`` serves HTTPS.
    """
    import uvicorn
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    if local_dev:
        if host != LOCAL_DEV_HOST:
            raise ValueError(f"local development mode (no tokens) binds {LOCAL_DEV_HOST} only, not {host}")
        print(
            f"ki: LOCAL DEVELOPMENT MODE: no bearer tokens are checked; bound to {LOCAL_DEV_HOST} only",
            file=sys.stderr,
            flush=True,
        )
    if tls is not None:
        tls.context()  # a clear error about a bad file now, rather than a traceback from uvicorn
    if tls is None and not _is_loopback(host):
        print(
            f"ki: WARNING: serving plain HTTP on {host}: bearer tokens and remote_write samples cross the "
            "network in cleartext (give --tls-cert and --tls-key; docs/security.md)",
            file=sys.stderr,
            flush=True,
        )
    limits = (limits or ConnectionLimits()).fitted(raise_nofile_limit())
    sock = listening_socket(host, port, backlog=limits.backlog)
    bound = sock.getsockname()[1]
    tls_options: dict[str, Any] = {}
    if tls is not None:
        tls_options = {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)}
        if tls.client_ca is not None:
            tls_options |= {"ssl_ca_certs": str(tls.client_ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    config = uvicorn.Config(
        app,
        # uvicorn's proxy-headers layer is put under the query fast path below, not around it.
        proxy_headers=False,
        log_level="warning",
        # Access lines are below the warning level anyway; uvicorn would still build each one's
        # arguments (client address, quoted path) per request before the level drops it.
        access_log=False,
        **tls_options,
        ws="none",
        backlog=limits.backlog,
        timeout_keep_alive=max(1, round(limits.keep_alive_s)),
        h11_max_incomplete_event_size=limits.max_head_bytes,
    )
    asgi: Any = app  # uvicorn types its ASGI apps more narrowly than Starlette does
    fast = query_fast_path(app, ProxyHeadersMiddleware(asgi, trusted_hosts=config.forwarded_allow_ips))
    config.app = fast
    # Quick GET queries are answered by the HTTP protocol itself, without uvicorn's ASGI request
    # cycle (docs/api.md, "Query endpoints: the request path"); read when the server loads.
    config.http = guarded_protocol(limits, quick=fast.at_once)
    install_repeat_filter()  # after uvicorn.Config, which installs uvicorn's handlers
    # A query computing in a worker thread holds the GIL for up to the switch interval each time
    # the event loop asks for it, and a request needs it several times: 1 ms instead of Python's
    # 5 ms keeps cheap requests (health snapshot, ingest) fast while an expensive query runs.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    scheme = "https" if tls is not None else "http"
    print(f"ki: listening on {scheme}://{host}:{bound}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


def query_fast_path(app: FastAPI, inner: Any) -> QueryFastPath:
    """``app`` served with its query endpoints and remote_write ahead of its middleware stack
    (``QueryFastPath``); ``inner`` is ``app`` with what the server wraps around it, for every other
    request. The request metrics are ``app.state.metrics``' when it has them; remote_write is
    ``app.state.remote_write_endpoint`` (``collector.create_app``) when there is one."""
    metrics = getattr(app.state, "metrics", None)
    write = getattr(app.state, "remote_write_endpoint", None)
    return QueryFastPath(
        inner,
        app,
        query_routes(app.router),
        app.exception_handlers,
        metrics.observe_request if metrics is not None else None,
        posts={write.path: write} if write is not None else None,
    )


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
