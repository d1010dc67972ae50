"""make bench-ui: first paint of the web UI's fleet page with 1,000 instances, in Debian's chromium.

Target (issue 19): the fleet grid of 1,000 instances drawn <= 1 s after navigation starts.
A real ``ki collector`` (its own process, 127.0.0.1) serves the UI and the health snapshot over
an embedded store of 1,000 instances x 8 GPUs (``bench.api.populate``). Each round opens a
new tab signed in with a read token (sessionStorage, as the sign-in page leaves it) and loads
``/#/fleet``; the page records ``performance.now()`` in the first animation frame after the grid
is in the DOM (``window.kiFleetFirstPaintMs``): navigation, the page's files, the snapshot GET
and the rendering, on the browser's own clock. One warm-up round (the snapshot's first build),
then the median of ``--rounds``. ``timeline_fps`` is 0: the Timeline page is not built yet
(it needs the timelines API). Ends with one ``BENCH ui ...`` line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.api.__main__ import start_server
from bench.ui import chromium, populate_fleet
from kernel_insight.api.auth import TokenStore


def first_paint_ms(browser: Any, url: str, token: str) -> tuple[float, int]:
    """One cold tab: ms from navigation start to the first frame showing the grid, and its tile count."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        context.add_init_script(f"sessionStorage.setItem('ki.token', {token!r})")
        page = context.new_page()
        page.goto(f"{url}/#/fleet")
        page.wait_for_function("window.kiFleetFirstPaintMs !== undefined", timeout=60_000)
        ms = float(page.evaluate("window.kiFleetFirstPaintMs"))
        tiles = int(page.evaluate("document.querySelectorAll('#fleet-grid .tile').length"))
        return ms, tiles
    finally:
        context.close()


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.ui", description=__doc__)
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ki-bench-ui-") as tmp:
        data, tokens_path = Path(tmp) / "data", Path(tmp) / "tokens.json"
        t0 = time.perf_counter()
        populate_fleet(data, args.instances, int(time.time() * 1000))
        print(f"populated {args.instances} instances x 8 GPUs in {time.perf_counter() - t0:.1f} s")
        token = TokenStore(tokens_path).create("bench", ["read"]).token
        proc, url = start_server(data, tokens_path)
        rounds: list[float] = []
        try:
            with chromium() as browser:
                warm, tiles = first_paint_ms(browser, url, token)
                print(f"warm-up round (snapshot built on demand): {warm:.0f} ms, {tiles} tiles")
                for _ in range(args.rounds):
                    ms, tiles = first_paint_ms(browser, url, token)
                    if tiles != args.instances:
                        raise SystemExit(f"the grid shows {tiles} tiles, not {args.instances}")
                    rounds.append(ms)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    median = statistics.median(rounds)
    print(f"fleet first paint, {args.instances} instances: " + ", ".join(f"{r:.0f}" for r in rounds) + " ms")
    print(f"load average {os.getloadavg()[0]:.1f}, cpus {os.cpu_count()}: server and browser share them")
    print("timeline_fps=0: the Timeline page does not exist yet (it needs the timelines API)")
    print(f"BENCH ui fleet_first_paint_ms={median:.0f} timeline_fps=0")


if __name__ == "__main__":
    main()
