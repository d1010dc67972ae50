"""A proxy between the real ki-agent and the real ki collector (not a test file): what a tier of
collectors does to a request now and then (an answer for part of a request, a store that is away,
a batch refused), played on purpose. Subclasses decide per request in ``answer``."""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from kernel_insight.collector.wire import BATCH_STATUS_HEADER, FRAMES_CONTENT_TYPE, INGEST_PATH, split_frames

#: The collector's answer headers the agent reads.
FORWARDED = ("Content-Type", BATCH_STATUS_HEADER, "Retry-After", "KI-Capture", "KI-Histogram-Snapshot")

Answer = tuple[int, dict[str, str], bytes]

#: What a tier answers while no collector can take a request.
UNAVAILABLE: Answer = (503, {"Retry-After": "1"}, b'{"status":"unavailable"}')


class TierProxy:
    """Listens on 127.0.0.1 (``url``), forwards each request to ``upstream`` unless ``answer`` says
    otherwise; ``statuses`` records what every request was answered (the per-frame list)."""

    def __init__(self) -> None:
        self.upstream = ""
        self.lock = threading.Lock()
        self.statuses: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status, headers, data = proxy.answer(self.headers.get("Content-Type", ""), body)
                with proxy.lock:
                    proxy.statuses.append(headers.get(BATCH_STATUS_HEADER, str(status)))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, ctype: str, body: bytes) -> Answer:
        """What the agent is answered; by default the collector's answer."""
        return self.forward(ctype, body)

    @staticmethod
    def frames(ctype: str, body: bytes) -> list[memoryview]:
        return split_frames(body) if ctype == FRAMES_CONTENT_TYPE else [memoryview(body)]

    @staticmethod
    def settled(statuses: list[int], retry_after: bool = False) -> Answer:
        """The answer to a request of several frames, one status each (docs/wire.md)."""
        headers = {BATCH_STATUS_HEADER: ", ".join(map(str, statuses))}
        if retry_after:
            headers["Retry-After"] = "1"
        results = [{"status": s} for s in statuses]
        return 200, headers, json.dumps({"status": "settled", "results": results}).encode()

    def forward(self, ctype: str, body: bytes) -> Answer:
        """One request to the collector; a collector that is not up reads as 503 (as a tier's would)."""
        with self.lock:
            upstream = self.upstream
        if not upstream:
            return UNAVAILABLE
        u = urlsplit(upstream)
        conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=60)
        try:
            conn.request("POST", INGEST_PATH, body=body, headers={"Content-Type": ctype})
            resp = conn.getresponse()
            data = resp.read()
            headers = {k: v for k in FORWARDED if (v := resp.getheader(k)) is not None}
            return resp.status, headers, data
        except OSError:
            return UNAVAILABLE
        finally:
            conn.close()

    def forward_frame(self, frame: memoryview) -> int:
        """One frame alone to the collector; its status."""
        return self.forward("application/octet-stream", bytes(frame))[0]

    def point_at(self, upstream: str) -> None:
        with self.lock:
            self.upstream = upstream

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=30)
