"""A FastAPI app under a real uvicorn on loopback, for the API and SDK tests."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn
from chdb_http import running_shim
from fastapi import FastAPI

from kernel_insight.api.app import listening_socket

__all__ = ["chdb_http_server", "running_server"]


@contextlib.contextmanager
def running_server(app: FastAPI | Any, **options: Any) -> Iterator[str]:
    """``app`` (an ASGI app) under a real uvicorn on 127.0.0.1 and an ephemeral port, in a thread;
    yields its base URL. ``options``: more ``uvicorn.Config`` arguments (``http=...``)."""
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **{"lifespan": "on", **options}))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive(), "uvicorn exited"
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()


@contextlib.contextmanager
def chdb_http_server(path: Path) -> Iterator[str]:
    """A ClickHouse HTTP front over chDB (``tests/chdb_http.py``) on 127.0.0.1; yields its URL.
    Several ``ServerStore`` clients or collector processes share it as they would a ClickHouse server."""
    with running_shim(path) as (_, url):
        yield url
