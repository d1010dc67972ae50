"""A ClickHouse HTTP interface in front of chDB, so clickhouse-connect's HTTP client can be tested here.

No ClickHouse server recent enough for clickhouse-connect installs on these machines, but
chDB is the ClickHouse engine in a library. This shim speaks the subset of the HTTP
protocol clickhouse-connect uses (query in the URL, body or a multipart form, settings as URL
parameters, server-side query parameters as ``param_<name>``, INSERT data in the body,
``X-ClickHouse-*`` headers, errors as ``Code: N. DB::Exception``)
and hands every statement to the real engine. It is a test stand-in, not part of the
product: no authentication, one process, one data directory (docs/storage.md says what it
leaves out).

Run: ``python tests/chdb_http.py --path DIR --port 0`` prints ``port=<n>``; tests use
``running_shim(path)``, which starts it as its own process.
"""

from __future__ import annotations

import argparse
import contextlib
import email.parser
import email.policy
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from kernel_insight.collector.clickhouse.sql import literal

__all__ = ["running_shim", "serve"]

# Parameters that steer the HTTP layer rather than the query; everything else is a setting.
_TRANSPORT = {
    "query",
    "database",
    "default_format",
    "query_id",
    "session_id",
    "session_timeout",
    "session_check",
    "compress",
    "decompress",
    "user",
    "password",
    "wait_end_of_query",
    "enable_http_compression",
    "send_progress_in_http_headers",
    "http_headers_progress_interval_ms",
    "client_protocol_version",
}
_INSERT_RE = re.compile(
    r"^\s*INSERT\s+INTO\s+(?P<table>[`\w.]+)\s*(?:\((?P<cols>[^)]*)\))?\s*(?:SETTINGS\s+(?P<settings>.*?)\s*)?"
    r"FORMAT\s+(?P<fmt>\w+)\s*$",
    re.IGNORECASE | re.DOTALL,
)
_FORMAT_RE = re.compile(r"\bFORMAT\s+(\w+)\s*;?\s*$", re.IGNORECASE)
_CODE_RE = re.compile(r"Code:\s*(\d+)")
_SETTING_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _literal(value: str) -> str:
    return value if re.fullmatch(r"-?\d+(\.\d+)?", value) else literal(value)


def _form_fields(body: bytes, content_type: str) -> dict[str, str]:
    """The fields of a ``multipart/form-data`` body (clickhouse-connect sends long parameters so)."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body
    )
    fields = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            payload = part.get_payload(decode=True)
            fields[name] = payload.decode("utf-8") if isinstance(payload, bytes) else ""
    return fields


def _decode_body(body: bytes, encoding: str) -> bytes:
    """Undo HTTP compression of a request body the way clickhouse-server does."""
    encoding = encoding.strip().lower()
    if not encoding or encoding == "identity":
        return body
    if encoding == "zstd":
        import zstandard

        return bytes(zstandard.ZstdDecompressor().decompressobj().decompress(body))
    if encoding == "lz4":
        import lz4.frame  # type: ignore[import-untyped]

        return bytes(lz4.frame.decompress(body))
    if encoding in ("gzip", "deflate"):
        import zlib

        return zlib.decompress(body, 47)
    raise ValueError(f"unsupported Content-Encoding {encoding!r}")


def _encode_body(body: bytes, accept: str) -> tuple[bytes, str]:
    offered = [e.split(";")[0].strip().lower() for e in accept.split(",")]
    if "zstd" in offered:
        import zstandard

        return zstandard.ZstdCompressor().compress(body), "zstd"
    if "lz4" in offered:
        import lz4.frame

        return bytes(lz4.frame.compress(body)), "lz4"
    if "gzip" in offered:
        import gzip

        return gzip.compress(body), "gzip"
    return body, ""


class _Engine:
    def __init__(self, path: str) -> None:
        from chdb import session as chdb_session

        session_cls: Any = chdb_session.Session
        self.session = session_cls(path)
        self.lock = threading.Lock()
        self.spool = tempfile.mkdtemp(prefix="ki-chdb-http-")

    def run(self, sql: str, fmt: str, query_params: dict[str, str] | None = None) -> bytes:
        # The values are the HTTP ``param_<name>`` texts, which chDB reads as the server does.
        with self.lock:
            result = self.session.query(sql, fmt, params=query_params or None)
        return bytes(result.bytes()) if result is not None else b""


def _handler(engine: _Engine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet by default
            if os.environ.get("KI_CHDB_HTTP_LOG"):
                super().log_message(format, *args)

        def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if urlsplit(self.path).path in ("/ping", "/"):
                self._reply(200, b"Ok.\n")
                return
            self._handle(b"")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                body = self._read_chunked()
            else:
                body = self.rfile.read(length) if length else b""
            self._handle(body)

        def _read_chunked(self) -> bytes:
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()

        def _handle(self, body: bytes) -> None:
            params = dict(parse_qsl(urlsplit(self.path).query, keep_blank_values=True))
            if params.get("decompress") == "1":
                self._reply(
                    400, b"Code: 1. DB::Exception: ClickHouse-native block compression is not supported"
                )
                return
            try:
                body = _decode_body(body, self.headers.get("Content-Encoding", ""))
            except ValueError as exc:
                self._reply(400, f"Code: 1. DB::Exception: {exc}".encode())
                return
            content_type = self.headers.get("Content-Type", "")
            if content_type.startswith("multipart/form-data"):
                params.update(_form_fields(body, content_type))
                body = b""
            query = params.get("query")
            data = b""
            if query is None:
                query, body = body.decode("utf-8"), b""
            else:
                data = body
            settings = {
                k: v
                for k, v in params.items()
                if k not in _TRANSPORT and _SETTING_NAME_RE.match(k) and not k.startswith("param_")
            }
            try:
                out, fmt, written = self._execute(query, data, settings, params)
            except Exception as exc:
                message = str(exc).strip() or type(exc).__name__
                m = _CODE_RE.search(message)
                code = m.group(1) if m else "1001"
                if not message.startswith("Code:"):
                    message = f"Code: {code}. DB::Exception: {message}"
                self._reply(500, message.encode() + b"\n", {"X-ClickHouse-Exception-Code": code})
                return
            summary = {
                "read_rows": "0",
                "read_bytes": "0",
                "written_rows": str(written),
                "written_bytes": "0",
            }
            encoding = ""
            if params.get("enable_http_compression") == "1":
                out, encoding = _encode_body(out, self.headers.get("Accept-Encoding", ""))
            self._reply(
                200,
                out,
                {
                    **({"Content-Encoding": encoding} if encoding else {}),
                    "X-ClickHouse-Format": fmt,
                    "X-ClickHouse-Timezone": "UTC",
                    "X-ClickHouse-Server-Display-Name": "chdb-http-shim",
                    "X-ClickHouse-Query-Id": params.get("query_id", ""),
                    "X-ClickHouse-Summary": json.dumps(summary),
                    "Content-Type": "application/octet-stream",
                },
            )

        def _execute(
            self, query: str, data: bytes, settings: dict[str, str], params: dict[str, str]
        ) -> tuple[bytes, str, int]:
            setting_sql = ", ".join(f"{k} = {_literal(v)}" for k, v in settings.items())
            query_params = {k.removeprefix("param_"): v for k, v in params.items() if k.startswith("param_")}
            m = _INSERT_RE.match(query)
            if m is not None:
                fmt = m.group("fmt")
                cols = m.group("cols")
                inline = m.group("settings")
                all_settings = ", ".join(s for s in (inline, setting_sql) if s)
                fd, path = tempfile.mkstemp(dir=engine.spool)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                try:
                    select = cols if cols else "*"
                    sql = f"INSERT INTO {m.group('table')}" + (f" ({cols})" if cols else "")
                    sql += f" SETTINGS {all_settings}" if all_settings else ""
                    sql += f" SELECT {select} FROM file({_literal(path)}, {_literal(fmt)})"
                    engine.run(sql, "CSV")
                finally:
                    os.unlink(path)
                return b"", fmt, 0
            fmt_match = _FORMAT_RE.search(query)
            fmt = fmt_match.group(1) if fmt_match else params.get("default_format", "TabSeparated")
            if fmt_match:
                query = query[: fmt_match.start()]
            query = query.rstrip().rstrip(";")
            if setting_sql and re.match(
                r"^\s*(SELECT|WITH|SHOW|DESCRIBE|DESC|EXISTS)\b", query, re.IGNORECASE
            ):
                query += f" SETTINGS {setting_sql}"
            return engine.run(query, fmt, query_params), fmt, 0

    return Handler


def serve(path: str, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """Start the shim on a background thread; returns the server (``server_address`` has the port)."""
    server = ThreadingHTTPServer((host, port), _handler(_Engine(path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@contextlib.contextmanager
def running_shim(path: str | Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Run the shim in its own process over chDB directory ``path``: yields (process, base URL).

    Its own process, as a ClickHouse server would be: the clients under test share nothing
    with the engine but the socket. Killed on exit (a test may kill it before).
    """
    proc = subprocess.Popen(
        [sys.executable, __file__, "--path", str(path), "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("port="), line
        yield proc, f"http://127.0.0.1:{line.removeprefix('port=')}"
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--path", required=True, help="chDB data directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    server = serve(args.path, args.host, args.port)
    print(f"port={server.server_address[1]}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
