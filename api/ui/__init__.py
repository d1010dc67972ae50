"""The web UI: static files served by the collector at ``/`` (docs/ui.md).

The pages are plain HTML, CSS and JavaScript (uPlot for charts, committed under
``static/vendor/`` with its licence), so the collector needs no build step and the browser
needs no internet. The files themselves hold no data and take no token: everything the
UI shows it fetches from the public APIs with the read token the user signs in with,
exactly as the SDK or Grafana would, so the UI can do nothing a token could not do anyway.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response

__all__ = ["STATIC_DIR", "ui_router"]

#: Where the UI's files live inside the package (a wheel carries them as package data).
STATIC_DIR = Path(__file__).resolve().parent / "static"

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
    ".LICENSE": "text/plain; charset=utf-8",
}

# The files may change with an upgrade: the browser revalidates (cheap 304s) instead of caching blindly.
_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


def _files(root: Path) -> dict[str, Path]:
    """Every servable file by its path under ``root``: a fixed list, so no request path reaches the disk."""
    return {p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file() and p.suffix in _TYPES}


@functools.cache
def _vocabulary_json() -> bytes:
    from kernel_insight.kql.parser import vocabulary

    return json.dumps(vocabulary()).encode()


def ui_router(root: Path = STATIC_DIR) -> APIRouter:
    """``GET /`` (the single page) and ``GET /ui/{path}`` (its scripts, styles and vendored libraries).

    Open like ``/openapi.json``: the pages carry no data; each API call they make needs a token.
    Left out of the OpenAPI schema, which describes the API, not the UI.
    """
    files = _files(root)
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    def index() -> Response:
        return FileResponse(root / "index.html", media_type=_TYPES[".html"], headers=_HEADERS)

    @router.get("/ui/kql.json")
    def kql_words() -> Response:
        """The query editor's keywords, aggregators and functions, and their result units
        (kql.parser.vocabulary): read from kql's grammar and registries, so the editor highlights
        what the parser accepts and the chart's axis has the unit kql says the result is in."""
        return Response(_vocabulary_json(), media_type="application/json", headers=_HEADERS)

    @router.get("/ui/{path:path}")
    def static(path: str) -> Response:
        found = files.get(path)
        if found is None:
            return Response(f"no UI file {path!r}\n", status_code=404, media_type="text/plain")
        return FileResponse(found, media_type=_TYPES[found.suffix], headers=_HEADERS)

    return router
