"""The examples the docs show, read from the docs themselves, for the tests that run them as written."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def sdk_examples() -> list[tuple[str, str]]:
    """(doc#block, code) of the SDK's health, selection, routing and kql examples in docs/api.md and
    docs/routing.md (the timeline's need stored spans of their own instance names)."""
    out = []
    for name in ("api.md", "routing.md"):
        path = DOCS / name
        if not path.exists():
            continue
        blocks = re.findall(r"^```python\n(.*?)^```", path.read_text(), re.DOTALL | re.MULTILINE)
        out += [(f"{name}#{i}", b) for i, b in enumerate(blocks) if re.search(r"HealthClient|route\(", b)]
    return out
