"""What the web UI's browser test and ``make bench-ui`` share: Debian's chromium through
Playwright, and a store holding a fleet to look at.

Playwright's own browser download cannot run here (and CI should not depend on it), so
the browser is the distribution's ``/usr/bin/chromium`` (scripts/bootstrap.sh installs it).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.api.__main__ import populate
from kernel_insight.collector.rows import SampleBuilder
from kernel_insight.collector.store import EmbeddedStore

__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "chromium", "populate_fleet"]

#: Debian's chromium package.
CHROMIUM = "/usr/bin/chromium"

#: Headless in a container without a GPU, a sandbox or the network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless chromium (Playwright ``Browser``); RuntimeError saying why when it cannot start."""
    if shutil.which(CHROMIUM) is None:
        raise RuntimeError(f"{CHROMIUM} is missing: install Debian's chromium package (make bootstrap)")
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError as exc:
        raise RuntimeError(f"playwright is not installed ({exc}): pip install -e '.[dev]'") from None
    with sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        except Error as exc:
            raise RuntimeError(f"{CHROMIUM} does not launch: {exc}") from None
        try:
            yield browser
        finally:
            browser.close()


def populate_fleet(path: Path, instances: int, now_ms: int, *, hot: tuple[str, ...] = ()) -> None:
    """``bench.api.populate``'s fleet (instances x 8 GPUs), plus GPU 0 of each ``hot`` instance at
    95 degrees now, which the health rule (90 at most) marks unhealthy with a reason."""
    populate(path, instances, now_ms)
    if not hot:
        return
    b = SampleBuilder()
    for inst in hot:
        labels = {"__name__": "gpu_temperature_celsius", "instance": inst, "gpu": "0"}
        b.add({**labels, "model": "NVIDIA H100 80GB HBM3"}, now_ms - 500, 95.0)
    with EmbeddedStore(path) as store:
        store.insert_samples(b.build())
