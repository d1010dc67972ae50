"""Helpers for the rule tests: a webhook receiver on loopback (what Alertmanager or a test posts to)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """Every JSON body POSTed to it, in order, with the path."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, Any, float]] = []
        self.lock = threading.Lock()
        self.url = ""

    def bodies(self, path: str | None = None) -> list[Any]:
        with self.lock:
            return [b for p, b, _ in self.posts if path is None or p == path]

    def wait_for(self, check: Callable[[], Any], bound_s: float) -> Any:
        deadline = time.monotonic() + bound_s
        while True:
            got = check()
            if got:
                return got
            assert time.monotonic() < deadline, f"not received within {bound_s} s: {self.posts[-3:]}"
            time.sleep(0.05)


@contextmanager
def receiver() -> Iterator[Receiver]:
    rec = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            with rec.lock:
                rec.posts.append((self.path, json.loads(body or b"null"), time.monotonic()))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    rec.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
