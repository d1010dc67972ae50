"""make bench-ui: first paint of the web UI's fleet page with 1,000 instances, in Debian's chromium.

Target (issue 19): the fleet grid of 1,000 instances drawn <= 1 s after navigation starts.
A real ``ki collector`` (its own process, 127.0.0.1) serves the UI and the health snapshot over
an embedded store of 1,000 instances x 8 GPUs (``bench.api.populate``). Each round opens a
new tab signed in with a read token (sessionStorage, as the sign-in page leaves it) and loads
``/#/fleet``; the page records ``performance.now()`` in the first animation frame after the grid
is in the DOM (``window.kiFleetFirstPaintMs``): navigation, the page's files, the snapshot GET
and the rendering, on the browser's own clock. One warm-up round (the snapshot's first build),
then the median of ``--rounds``.

Target: the timeline draws 100,000 spans at >= 30 frames per second while panning. The same
store holds ``--spans`` kernel spans of node-0001's GPU 0 over 10 s on 4 streams; the Timeline
page loads them all (``/v1/timeline/spans``, pages of 10,000), then ``kiTimeline.panFps`` pans
a few pixels every animation frame for 3 s over the whole window, so every frame draws every
span (the worst case: zoomed in, fewer are in view), and counts frames; every span has a host
launch (2 threads) and the GPU has NCCL, memory and sync calls, so the host lanes and call lanes
are drawn too. Then zoomed in to 15 ms, where the launch arrows are drawn (about 150 a frame),
the same pan again (``timeline_arrows_fps``). Ends with one
``BENCH ui ...`` line.
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
from bench.ui import chromium, populate_fleet, populate_spans
from kernel_insight.api.auth import TokenStore


def first_paint_ms(browser: Any, url: str, token: str) -> tuple[float, int, float]:
    """One cold tab: ms from navigation start to the first frame showing the grid, its tile count,
    and ms to the frame showing the per-GPU cells (two instant queries over 8,000 series, after)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        context.add_init_script(f"sessionStorage.setItem('ki.token', {token!r})")
        page = context.new_page()
        page.goto(f"{url}/#/fleet")
        page.wait_for_function("window.kiFleetFirstPaintMs !== undefined", timeout=60_000)
        ms = float(page.evaluate("window.kiFleetFirstPaintMs"))
        tiles = int(page.evaluate("document.querySelectorAll('#fleet-grid .tile').length"))
        page.wait_for_function("window.kiFleetGpuPaintMs !== undefined", timeout=60_000)
        return ms, tiles, float(page.evaluate("window.kiFleetGpuPaintMs"))
    finally:
        context.close()


def timeline_fps(
    browser: Any, url: str, token: str, start_s: int, spans: int
) -> tuple[float, float, float, int]:
    """Seconds to load the window's spans, frames per second while panning over all of them, frames
    per second panning zoomed in to 15 ms with launch arrows, and the arrows of that last frame."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        context.add_init_script(f"sessionStorage.setItem('ki.token', {token!r})")
        page = context.new_page()
        t0 = time.perf_counter()
        page.goto(f"{url}/#/timeline?instance=node-0001&gpu=0&from={start_s - 1}&to={start_s + 11}")
        page.wait_for_selector("#t-count", timeout=300_000)
        loaded = time.perf_counter() - t0
        shown = int(page.get_attribute("#t-count", "data-spans") or 0)
        if shown != spans:
            raise SystemExit(f"the timeline holds {shown} spans, not {spans}")
        whole = float(page.evaluate("kiTimeline.panFps(3000, 3)"))
        # zoomed in to ~15 ms (about 150 launches of the 100,000): an arrow per launch every frame
        page.evaluate("kiTimeline.zoom(0.0015)")
        arrows = float(page.evaluate("kiTimeline.panFps(3000, 3)"))
        drawn = int(page.evaluate("kiTimeline.view().arrows"))
        if drawn == 0:
            raise SystemExit("no launch arrows drawn zoomed in: the spans carry no host side?")
        return loaded, whole, arrows, drawn
    finally:
        context.close()


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.ui", description=__doc__)
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--spans", type=int, default=100_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ki-bench-ui-") as tmp:
        data, tokens_path = Path(tmp) / "data", Path(tmp) / "tokens.json"
        t0 = time.perf_counter()
        populate_fleet(data, args.instances, int(time.time() * 1000))
        start_s = int(time.time()) - 120
        populate_spans(data, "node-0001", 0, start_s * 1_000_000_000, args.spans)
        print(
            f"populated {args.instances} instances x 8 GPUs and {args.spans} spans in {time.perf_counter() - t0:.1f} s"
        )
        token = TokenStore(tokens_path).create("bench", ["read"]).token
        proc, url = start_server(data, tokens_path)
        rounds: list[float] = []
        gpu_rounds: list[float] = []
        try:
            with chromium() as browser:
                warm, tiles, _ = first_paint_ms(browser, url, token)
                print(f"warm-up round (snapshot built on demand): {warm:.0f} ms, {tiles} tiles")
                for _ in range(args.rounds):
                    ms, tiles, gpu_ms = first_paint_ms(browser, url, token)
                    if tiles != args.instances:
                        raise SystemExit(f"the grid shows {tiles} tiles, not {args.instances}")
                    rounds.append(ms)
                    gpu_rounds.append(gpu_ms)
                loaded, fps, fps_arrows, arrows = timeline_fps(browser, url, token, start_s, args.spans)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    median = statistics.median(rounds)
    print(f"fleet first paint, {args.instances} instances: " + ", ".join(f"{r:.0f}" for r in rounds) + " ms")
    print(f"per-GPU cells (8,000 GPUs) drawn at: median {statistics.median(gpu_rounds):.0f} ms")
    print(f"load average {os.getloadavg()[0]:.1f}, cpus {os.cpu_count()}: server and browser share them")
    print(
        f"timeline: {args.spans} spans loaded in {loaded:.1f} s; panning, every span in view: {fps:.1f} frames/s"
    )
    print(f"timeline zoomed in to 15 ms, {arrows} launch arrows a frame: {fps_arrows:.1f} frames/s")
    print(
        f"BENCH ui fleet_first_paint_ms={median:.0f} timeline_fps={fps:.0f} timeline_arrows_fps={fps_arrows:.0f}"
    )


if __name__ == "__main__":
    main()
