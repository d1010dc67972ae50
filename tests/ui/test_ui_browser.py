"""The web UI in a real browser (Debian's chromium through Playwright) against a real ``ki collector``.

The collector runs over an embedded store holding 40 instances x 8 GPUs (``bench.ui.populate_fleet``;
node-0003's GPU 0 at 95 degrees, so the health rule marks it unhealthy) and 20,000 kernel spans of
node-0001's GPU 0 (``bench.ui.populate_spans``), with a rule file whose alert fires on the hot GPU.
Screenshots of each page go to the test's tmp dir.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from playwright.sync_api import Page
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from support.collector import RunningCollector, running_collector

from bench.ui import (
    HISTOGRAM_INTERVAL_S,
    KERNELS,
    MEMORY_OPS,
    NCCL_OPS,
    POD,
    SYNCS,
    chromium,
    populate_fleet,
    populate_kernel_histograms,
    populate_spans,
)
from kernel_insight.api import TokenStore
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.keys import KeyStore
from kernel_insight.collector.rows import InstanceInfo, SampleBuilder

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(240)]

INSTANCES = 40
#: The instance an enrolled agent feeds (its id is the agent's, 32 hex digits), with its one GPU at
#: 95 degrees; the pages call it by the name it was enrolled under.
ENROLLED_NAME = "gpu-box-a"
#: Filled by the collector fixture: the enrolled instance's id and when its 2,000 spans start (s).
ENROLLED: dict[str, str | int] = {}
#: The fleet: the 40 remote-written instances (node-0000 ...) and the enrolled one.
FLEET = INSTANCES + 1
GiB = 1 << 30
SPANS = 20_000
#: The spans' window: 10 s of node-0001's GPU 0 starting two minutes before the test (whole seconds).
SPAN_START_S = int(time.time()) - 120
#: The instance and GPU whose native histograms start later than its spans, with a gap.
LATE = ("node-0002", 1)
#: node-0001's native histograms start this long before its spans (a 10-minute window ends in them).
HIST_BEFORE_S = 630
RULES = """
groups:
  - name: gpu
    interval: 1s
    rules:
      - alert: GpuTooHot
        expr: gpu_temperature_celsius > 90
        labels: {severity: page}
        annotations: {summary: "GPU {{ $labels.gpu }} of {{ $labels.instance }} is at {{ $value }} C"}
      - record: instance:gpu_memory_free_bytes:sum
        expr: sum by (instance) (gpu_memory_free_bytes)
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    try:
        with chromium() as b:
            yield b
    except RuntimeError as exc:
        pytest.skip(f"browser tests need chromium: {exc}")


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCollector]:
    tmp = tmp_path_factory.mktemp("ui")
    # Taken again when the data is written: at import (collection) it can be over an hour old by
    # the time a slow full run reaches this module, and the UI's "last hour" would miss the spans.
    global SPAN_START_S
    SPAN_START_S = int(time.time()) - 120
    populate_fleet(tmp / "data", INSTANCES, int(time.time() * 1000), hot=("node-0003",))
    populate_spans(tmp / "data", "node-0001", 0, SPAN_START_S * 1_000_000_000, SPANS)
    # Native histograms as the agent ships them, every HISTOGRAM_INTERVAL_S (7 s): node-0001's GPU 0
    # from ten and a half minutes before the spans to a minute after them.
    populate_kernel_histograms(
        tmp / "data", "node-0001", 0, (SPAN_START_S - HIST_BEFORE_S) * 1000, HIST_BEFORE_S + 60, KERNELS
    )
    # node-0002's GPU 1: spans over [S, S + 10 s), and its first kernel's native histograms starting
    # later (exports at S + 3, 10, 17 s) with a gap before the rest (S + 80, 87, 94 s): the two
    # heatmaps' data cover different stretches of the window, their axes must not.
    populate_spans(tmp / "data", LATE[0], LATE[1], SPAN_START_S * 1_000_000_000, 6_000)
    populate_kernel_histograms(tmp / "data", LATE[0], LATE[1], (SPAN_START_S + 3) * 1000, 21, KERNELS[:1])
    populate_kernel_histograms(tmp / "data", LATE[0], LATE[1], (SPAN_START_S + 80) * 1000, 21, KERNELS[:1])
    # An enrolled agent's instance, under the id the collector stores its data by, with spans from a
    # minute ago (the pages' default window is the last 15 minutes).
    agent = KeyStore(tmp / "keys.json").add_agent(ENROLLED_NAME).agent_id.hex()
    ENROLLED.update(id=agent, start_s=int(time.time()) - 60)
    _populate_enrolled(tmp / "data", agent, int(time.time() * 1000))
    populate_spans(tmp / "data", agent, 0, int(ENROLLED["start_s"]) * 1_000_000_000, 2_000)
    rules = tmp / "rules.yml"
    rules.write_text(RULES)
    with running_collector(tmp, "--rules", str(rules)) as c:
        yield c


def _populate_enrolled(path: Path, agent: str, now_ms: int) -> None:
    """One GPU of an enrolled agent's instance: its gauges (95 degrees: unhealthy) and instance row."""
    b = SampleBuilder()
    base = {"instance": agent, "gpu": "0"}
    for t in (now_ms - 30_000, now_ms - 15_000, now_ms - 1_000):
        b.add({**base, "__name__": "gpu_memory_free_bytes"}, t, 40.0 * GiB)
        b.add({**base, "__name__": "gpu_memory_total_bytes"}, t, 80.0 * GiB)
        b.add({**base, "__name__": "gpu_temperature_celsius"}, t, 95.0)
    row = InstanceInfo(
        agent, now_ms - 1_000, gpu_count=1, gpu_model="NVIDIA H100 80GB HBM3", memory_total_bytes=80 * GiB
    )
    with EmbeddedStore(path) as store:
        store.insert_samples(b.build())
        store.upsert_instances([row])


@pytest.fixture
def refused_requests() -> None:
    """Taken by a test that has the API refuse the page on purpose (a wrong or revoked token, a query
    that does not parse): the browser logs each such 4xx answer as a console error, which the
    ``page`` fixture then lets pass."""


@pytest.fixture
def page(browser, tmp_path, request):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    p = context.new_page()
    p.set_default_timeout(20_000)
    errors: list[str] = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    # console.error and the browser's own errors (a failed request, a 404 or 500 answer) land here
    console: list[str] = []
    p.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    yield p
    context.close()
    assert errors == [], f"JavaScript errors in the page: {errors}"
    if "refused_requests" not in request.fixturenames:
        assert console == [], f"errors in the browser console: {console}"


def _sign_in(page, c: RunningCollector) -> None:
    page.goto(c.url + "/")
    page.fill("#token", c.read_token)
    page.click("#login button")
    page.wait_for_selector("#fleet-grid .tile")


def test_nothing_but_the_sign_in_page_without_a_token_and_a_wrong_token_is_refused(
    page, collector, tmp_path, refused_requests
):
    page.goto(collector.url + "/#/explore?q=up")
    page.wait_for_selector("#login")
    assert page.is_hidden("#top")
    page.fill("#token", "ki_0000.nope")
    page.click("#login button")
    page.wait_for_selector("#login-error:has-text('not known')")
    page.fill("#token", collector.ingest_token)  # valid, but no read scope
    page.click("#login button")
    page.wait_for_selector("#login-error:has-text('lacks the read scope')")
    page.screenshot(path=tmp_path / "login.png")


def test_fleet_shows_every_instance_coloured_by_health_with_reasons_and_filters(page, collector, tmp_path):
    _sign_in(page, collector)
    tiles = page.locator("#fleet-grid .tile")
    assert tiles.count() == FLEET
    hot = page.locator('.tile[data-id="node-0003"]')
    assert hot.get_attribute("data-state") == "unhealthy"
    assert "90" in hot.locator(".why").inner_text()  # the reason names the temperature limit
    assert page.locator('.tile[data-state="healthy"]').count() == FLEET - 2
    assert "free" in tiles.first.inner_text()
    page.wait_for_selector('.tile[data-id="node-0003"] .gpus i.bad')  # the per-GPU cells fill in
    assert hot.locator(".gpus i").count() == 8
    assert hot.locator(".gpus i.bad").count() == 1
    assert "GPU 0" in hot.locator(".gpus i.bad").get_attribute("title")
    assert "8 GPUs" in hot.inner_text()
    # The enrolled agent's tile: its name, whole, the 32-hex id on hover; one GPU, said so.
    agent = str(ENROLLED["id"])
    enrolled = page.locator(f'.tile[data-id="{agent}"]')
    page.wait_for_selector(f'.tile[data-id="{agent}"] .gpus i.bad')
    assert enrolled.locator("b").inner_text() == ENROLLED_NAME
    assert agent in (enrolled.locator("b").get_attribute("title") or "")
    assert page.evaluate("e => e.scrollWidth <= e.clientWidth", enrolled.locator("b").element_handle())
    assert re.search(r"\b1 GPU\b", enrolled.inner_text())
    assert "1 GPUs" not in enrolled.inner_text()
    assert agent not in page.inner_text("#fleet-grid")
    assert page.locator(".tile .gpus i.bad").count() == 2
    page.screenshot(path=tmp_path / "fleet.png", full_page=True)

    page.select_option("#f-label", "rack")
    page.select_option("#f-value", "rack-1")  # node-0032 .. node-0039
    page.wait_for_function("document.querySelectorAll('#fleet-grid .tile').length === 8")
    assert "label=rack" in page.url
    assert "value=rack-1" in page.url
    page.select_option("#f-label", "")
    page.select_option("#f-state", "unhealthy")
    page.wait_for_function("document.querySelectorAll('#fleet-grid .tile').length === 2")

    page.click('.tile[data-id="node-0003"]')
    page.wait_for_selector("#instance-gpus")
    assert page.locator("#instance-gpus tr").count() == 1 + 8  # header + one row per GPU
    assert "90" in page.locator("#instance-facts").inner_text()
    page.screenshot(path=tmp_path / "instance.png", full_page=True)


def test_explore_draws_one_line_per_series_and_shares_the_query_in_the_url(
    page, collector, tmp_path, refused_requests
):
    _sign_in(page, collector)
    query = 'gpu_memory_free_bytes{instance=~"node-000[0-2]"}'
    page.goto(f"{collector.url}/#/explore?q={quote(query)}&range=5m")
    page.wait_for_selector("#chart canvas")
    assert page.get_attribute("#chart", "data-series") == "24"  # 3 instances x 8 GPUs
    assert page.locator(".u-legend tr.u-series").count() == 1 + 24  # uPlot's time row + the series
    assert page.locator("#result-table tr").count() == 1 + 24
    # The legend is a compact block (it scrolls) naming each series by the labels that differ, the
    # full name on hover; the values are in the metric's unit (bytes: GiB, not 4.2e10).
    legend = page.locator("#chart .u-legend").bounding_box()
    assert legend is not None
    assert legend["height"] <= 130, legend
    first = page.locator(".u-legend tr.u-series").nth(1)
    assert first.locator(".u-label").inner_text() == 'gpu="0", instance="node-0000"'
    assert first.get_attribute("title") == (
        'gpu_memory_free_bytes{gpu="0", instance="node-0000", model="NVIDIA H100 80GB HBM3"}'
    )
    assert page.get_attribute("#chart", "data-unit") == "B"
    plot = page.locator("#chart .u-over").bounding_box()
    assert plot is not None
    page.mouse.move(plot["x"] + plot["width"] * 0.9, plot["y"] + plot["height"] / 2)
    page.wait_for_function(
        "document.querySelectorAll('.u-legend tr.u-series')[1].querySelector('.u-value').textContent.endsWith('GiB')"
    )
    page.screenshot(path=tmp_path / "explore.png", full_page=True)

    page.fill("#q", "sum by (instance) (gpu_memory_free_bytes)")
    tokens = page.eval_on_selector_all("#q-hl span", "spans => spans.map(s => [s.className, s.textContent])")
    assert tokens == [
        ["tok-fn", "sum"],
        ["tok-kw", "by"],
        ["tok-label", "instance"],
        ["tok-metric", "gpu_memory_free_bytes"],
    ]
    page.click("#run")
    page.wait_for_function(f"document.querySelector('#chart').dataset.series === '{FLEET}'")
    assert "sum+by" in page.url or "sum%20by" in page.url
    # The words are kql's (GET /ui/kql.json): `fill` is a keyword before "(" and a metric name elsewhere.
    page.fill("#q", "a + on (x) fill(0) fill")
    tokens = page.eval_on_selector_all("#q-hl span", "spans => spans.map(s => [s.className, s.textContent])")
    assert tokens == [
        ["tok-metric", "a"],
        ["tok-kw", "on"],
        ["tok-label", "x"],
        ["tok-kw", "fill"],
        ["tok-num", "0"],
        ["tok-metric", "fill"],
    ]

    page.fill("#q", "sum(rate(x[5m])")
    page.click("#run")
    page.wait_for_selector("#q-caret")
    assert page.inner_text("#q-message").startswith('bad_data: invalid parameter "query": 1:16: parse error')
    caret_line = page.inner_text("#q-caret").split("\n")[1]
    assert caret_line.index("^") == 15  # column 16, under the end of the query
    page.screenshot(path=tmp_path / "explore-error.png")

    page.fill("#q", "")
    page.type("#q", "gpu_mem")
    page.wait_for_selector('#suggest button[data-name="gpu_memory_free_bytes"]')
    page.press("#q", "Tab")
    assert page.input_value("#q").startswith("gpu_memory_")


def test_explore_completes_what_was_typed_before_the_metric_names_arrived(page, collector):
    _sign_in(page, collector)
    held: list = []
    page.route("**/api/v1/label/__name__/values", lambda route: held.append(route))
    page.goto(f"{collector.url}/#/explore")
    deadline = time.monotonic() + 15
    while not held:
        assert time.monotonic() < deadline, "the page never asked for the metric names"
        page.wait_for_timeout(20)
    page.type("#q", "gpu_tem")  # before the names are there: nothing to offer yet
    assert page.locator("#suggest button").count() == 0
    held[0].continue_()
    page.wait_for_selector('#suggest button[data-name="gpu_temperature_celsius"]')


def test_alerts_show_the_firing_alert_and_each_rule_with_its_last_evaluation(page, collector, tmp_path):
    _sign_in(page, collector)
    page.goto(collector.url + "/#/alerts")
    page.wait_for_function(
        "document.querySelectorAll('tr.alert[data-state=\"firing\"]').length === 2", timeout=30_000
    )
    rows = page.locator('tr.alert[data-state="firing"]').all_inner_texts()
    assert all("GpuTooHot" in r for r in rows)
    assert any("node-0003" in r for r in rows)
    # the enrolled agent's instance by its name, the id on hover
    agent = str(ENROLLED["id"])
    assert any(f"instance={ENROLLED_NAME}" in r for r in rows), rows
    assert agent not in page.inner_text("#alerts")
    assert agent in (page.get_attribute(f'#alerts .inst[data-id="{agent}"]', "title") or "")
    rules = page.locator("table.rules").inner_text()
    assert "GpuTooHot" in rules
    assert "instance:gpu_memory_free_bytes:sum" in rules
    assert "0001-01-01" not in page.locator("table.rules tr").nth(1).inner_text()  # evaluated
    page.screenshot(path=tmp_path / "alerts.png", full_page=True)


def _window() -> str:
    return f"instance=node-0001&gpu=0&from={SPAN_START_S - 1}&to={SPAN_START_S + 11}"


def test_kernels_lists_each_kernel_of_the_window_and_draws_its_latency_heatmap(page, collector, tmp_path):
    _sign_in(page, collector)
    page.goto(f"{collector.url}/#/kernels?{_window()}")
    page.wait_for_selector("#kernels tr.kernel")
    rows = page.locator("#kernels tr.kernel")
    assert rows.count() == len(KERNELS)
    assert {rows.nth(n).locator("td").first.inner_text() for n in range(rows.count())} == set(KERNELS)
    assert f"{SPANS} spans" in page.inner_text("#k-body")

    # node-0001's GPU 0 also has native histograms: the table counts every launch from them, and
    # says so; the span heatmap bins the kernel's kept spans.
    assert "native histograms" in page.inner_text("#k-source")
    first = rows.first
    name = first.locator("td").first.inner_text()
    count = int(first.locator("td").nth(1).inner_text().replace(",", ""))
    spans = httpx.get(
        f"{collector.url}/v1/timeline/spans?{_window()}&kernel={quote(name)}&limit=10000",
        headers={"Authorization": f"Bearer {collector.read_token}"},
        timeout=30,
    ).json()["spans"]
    assert count > len(spans)  # 2,000 launches a second in the histograms, fewer spans
    first.locator("a").click()
    page.wait_for_selector("#heatmap[data-spans]")
    assert page.get_attribute("#heatmap", "data-spans") == str(len(spans))  # every kept span, binned
    assert page.get_attribute("#heatmap", "data-truncated") == "false"
    assert int(page.get_attribute("#heatmap", "data-max-count")) > 0
    assert "kernel=" in page.url
    # ... and from its native histogram: every launch of the window, in every one of its 120 columns
    # (exports every 7 s, columns of 0.1 s: each column's rate reaches back over four exports).
    page.wait_for_selector("#native-heatmap[data-columns]")
    assert page.get_attribute("#native-heatmap", "data-columns") == "120"
    assert page.get_attribute("#native-heatmap", "data-filled") == "0-119"
    assert int(page.get_attribute("#native-heatmap", "data-observations")) > 0
    assert float(page.get_attribute("#native-info", "data-interval") or 0) == HISTOGRAM_INTERVAL_S
    # Both heatmaps as wide as their boxes (the page's width), not two thirds of them.
    for canvas in ("#heatmap", "#native-heatmap"):
        width, room = page.evaluate(
            """c => { const b = c.parentElement, s = getComputedStyle(b);
            return [c.getBoundingClientRect().width,
                    b.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight)]; }""",
            page.locator(canvas).element_handle(),
        )
        assert room - 2 <= width <= room + 0.5, (canvas, width, room)
    page.screenshot(path=tmp_path / "kernels.png", full_page=True)


def test_kernels_and_timeline_pick_instances_by_name_and_gpus_from_a_list(page, collector, tmp_path):
    _sign_in(page, collector)
    agent = str(ENROLLED["id"])
    for name in ("kernels", "timeline"):
        page.goto(f"{collector.url}/#/{name}")
        page.wait_for_selector("#w-pick")
        # a list of the collector's instances by name (the id on hover), not a field to type into
        assert page.locator("input#w-instance").count() == 0
        options = page.locator("#w-instance option")
        labels = options.all_inner_texts()
        assert options.count() == 1 + FLEET  # "pick an instance" and every instance
        assert any(label.startswith(ENROLLED_NAME) for label in labels), labels
        assert "node-0003" in labels
        assert page.get_attribute(f'#w-instance option[value="{agent}"]', "title") == agent
        page.select_option("#w-instance", agent)
        page.wait_for_function(f"location.hash.includes('instance={agent}')")
        # its GPUs: one
        page.wait_for_function("document.querySelectorAll('#w-gpu option').length === 1")
        assert page.locator("#w-gpu option").all_inner_texts() == ["0"]
    # the timeline of the enrolled instance's last 15 minutes: its 2,000 spans
    page.wait_for_selector("#t-count", timeout=60_000)
    assert page.get_attribute("#t-count", "data-spans") == "2000"
    page.screenshot(path=tmp_path / "timeline-picked.png")
    page.goto(f"{collector.url}/#/kernels?instance={agent}&gpu=0")
    page.wait_for_selector("#kernels tr.kernel")
    assert page.input_value("#w-instance") == agent
    assert agent not in page.inner_text("main")


def _axis(page: Page, selector: str) -> dict[str, str | None]:
    """The time axis a heatmap canvas says it is drawn on, and where it sits on the page."""
    attrs = {k: page.get_attribute(selector, f"data-{k}") for k in ("t0", "t1", "step", "columns", "ticks")}
    box = page.locator(selector).bounding_box()
    assert box is not None
    return {**attrs, "x": str(box["x"]), "width": str(box["width"])}


def _runs(filled: str) -> list[tuple[int, int]]:
    """``data-filled`` ("3-7,12-12": the columns with data) as (first, last) pairs."""
    return [(int(a), int(b)) for a, b in (r.split("-") for r in filled.split(",") if r)]


def test_kernels_two_heatmaps_share_one_time_axis_when_the_histograms_start_later_with_a_gap(
    page, collector, tmp_path
):
    # LATE's spans cover [S, S + 10 s); its native histograms are exported at S + 3, 10, 17 and
    # S + 80, 87, 94: a window of [S - 1, S + 119) must put both on the same 120 columns of 1 s.
    _sign_in(page, collector)
    start, end = SPAN_START_S - 1, SPAN_START_S + 119
    page.goto(
        f"{collector.url}/#/kernels?instance={LATE[0]}&gpu={LATE[1]}&from={start}&to={end}"
        f"&kernel={quote(KERNELS[0])}"
    )
    page.wait_for_selector("#heatmap[data-spans]")
    page.wait_for_selector("#native-heatmap[data-columns]")
    spans, native = _axis(page, "#heatmap"), _axis(page, "#native-heatmap")
    assert spans == native
    step = float(spans["step"] or 0)
    assert step == 1
    assert spans["columns"] == "120"
    assert float(spans["t0"] or 0) == start
    assert end <= float(spans["t1"] or 0) < end + step
    assert len((spans["ticks"] or "").split()) == 5
    # ... and each chart's data sits in the columns of its own time. Column c ends at S + c; the
    # spans fill columns 1-10. A rate over 28 s (four exports of 7 s) needs two exports in its
    # range: from S + 10 (the second export) while two are within 28 s (until S + 38), the same
    # from S + 87 to S + 115.
    span_runs = _runs(page.get_attribute("#heatmap", "data-filled") or "")
    native_runs = _runs(page.get_attribute("#native-heatmap", "data-filled") or "")
    assert span_runs == [(1, 10)]
    assert page.get_attribute("#native-info", "data-range-ms") == str(4 * HISTOGRAM_INTERVAL_S * 1000)
    assert len(native_runs) == 2, native_runs
    assert 10 <= native_runs[0][0] <= 11, native_runs
    assert 36 <= native_runs[0][1] <= 38, native_runs
    assert native_runs[1][0] == 87, native_runs
    assert 114 <= native_runs[1][1] <= 115, native_runs
    page.screenshot(path=tmp_path / "kernels-late.png", full_page=True)


def test_kernels_native_heatmap_fills_a_ten_minute_window_and_says_why_when_there_is_none(
    page, collector, tmp_path
):
    # Ten minutes of 7 s exports over 120 columns of 5 s: a rate over the column alone (5 s) holds
    # two exports in few columns; over four exports (28 s) in every one.
    _sign_in(page, collector)
    start, end = SPAN_START_S + 10 - 600, SPAN_START_S + 10
    page.goto(
        f"{collector.url}/#/kernels?instance=node-0001&gpu=0&from={start}&to={end}&kernel={quote(KERNELS[1])}"
    )
    page.wait_for_selector("#native-heatmap[data-columns], #native-none")
    assert page.locator("#native-none").count() == 0
    assert page.get_attribute("#native-heatmap", "data-step") == "5"
    assert page.get_attribute("#native-heatmap", "data-filled") == "0-119"
    page.screenshot(path=tmp_path / "kernels-10m.png", full_page=True)
    # LATE's second kernel has kept spans but no histogram: the page says so, and not that the
    # agent is too old.
    page.goto(
        f"{collector.url}/#/kernels?instance={LATE[0]}&gpu={LATE[1]}&from={SPAN_START_S - 1}"
        f"&to={SPAN_START_S + 11}&kernel={quote(KERNELS[1])}"
    )
    page.wait_for_selector("#native-none")
    note = page.inner_text("#native-none")
    assert "histogram_interval_s" in note
    assert "wire version" not in note


def test_kernels_explore_link_carries_the_chosen_window(page, collector, tmp_path):
    _sign_in(page, collector)
    page.goto(f"{collector.url}/#/kernels?instance=node-0001&gpu=0")  # the last 15 minutes
    page.wait_for_selector("#kernels")
    # The user chooses the spans' window instead (UTC, as the form shows it), then a kernel.
    start, end = SPAN_START_S - 1, SPAN_START_S + 11
    page.fill("#w-from", time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(start)))
    page.fill("#w-to", time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(end)))
    page.click("#w-form button")
    page.wait_for_function(f"location.hash.includes('from={start}')")
    page.locator("#kernels tr.kernel a").first.click()
    page.wait_for_selector("#native-heatmap[data-columns]")
    page.click("text=open the query in Explore")
    page.wait_for_selector("#heatmaps canvas[data-columns]")
    assert f"from={start}" in page.url
    assert f"to={end}" in page.url
    assert "range=" not in page.url
    assert page.input_value("#range") == "window"
    shown = page.locator("#q-range")
    assert (shown.get_attribute("data-start"), shown.get_attribute("data-end")) == (str(start), str(end))
    assert int(page.get_attribute("#heatmaps canvas", "data-observations") or 0) > 0  # the window has data
    assert time.strftime("%H:%M:%S", time.gmtime(end)) in page.inner_text("#q-table")  # instant at its end
    page.screenshot(path=tmp_path / "explore-window.png", full_page=True)
    # Run keeps the window; picking a relative range leaves it.
    page.click("#run")
    page.wait_for_selector("#heatmaps canvas[data-columns]")
    assert f"from={start}" in page.url
    page.select_option("#range", "15m")
    page.wait_for_function("location.hash.includes('range=15m')")
    assert "from=" not in page.url
    assert float(shown.get_attribute("data-end") or 0) > end


def test_kernels_counted_from_kept_spans_are_marked_and_every_share_is_a_part_of_the_whole(page, collector):
    # LATE's GPU: its first kernel has native histograms, the others only kept spans. Each row counts
    # from its own source and the shares are parts of one total (the summary once took the
    # histograms' total for all and showed the span-counted kernels at ~700%).
    _sign_in(page, collector)
    start, end = SPAN_START_S - 1, SPAN_START_S + 21
    page.goto(f"{collector.url}/#/kernels?instance={LATE[0]}&gpu={LATE[1]}&from={start}&to={end}")
    page.wait_for_selector("#kernels tr.kernel")
    rows = page.locator("#kernels tr.kernel")
    sources = {
        rows.nth(n).get_attribute("data-kernel"): rows.nth(n).get_attribute("data-source")
        for n in range(rows.count())
    }
    assert sources == {KERNELS[0]: "histograms", **{k: "spans" for k in KERNELS[1:]}}
    marked = {
        rows.nth(n).get_attribute("data-kernel")
        for n in range(rows.count())
        if rows.nth(n).locator(".source").count()
    }
    assert marked == set(KERNELS[1:])
    assert f"but for the {len(KERNELS) - 1} marked kept spans" in page.inner_text("#k-source")
    shares = [int(rows.nth(n).locator("td").nth(3).inner_text().rstrip("%")) for n in range(rows.count())]
    assert all(0 <= x <= 100 for x in shares), shares
    assert sum(shares) <= 100 + len(shares) // 2  # each rounded to a whole percent


def test_explore_draws_native_histograms_as_heatmaps(page, collector, tmp_path):
    _sign_in(page, collector)
    # The histograms are 11.5 minutes of 7 s exports around when the module was imported (minutes
    # ago in a full run): an hour's range at 15 s steps, each step's increase over a minute, reaches them.
    query = 'sum by (kernel) (increase(kernel_duration_seconds{instance="node-0001"}[1m]))'
    page.goto(f"{collector.url}/#/explore?q={quote(query)}&range=1h")
    page.wait_for_selector("#heatmaps canvas[data-columns]")
    assert page.get_attribute("#heatmaps", "data-heatmaps") == str(len(KERNELS))
    canvases = page.locator("#heatmaps canvas")
    assert canvases.count() == len(KERNELS)
    assert all(
        int(canvases.nth(n).get_attribute("data-observations") or 0) > 0 for n in range(canvases.count())
    )
    assert page.get_attribute("#chart", "data-series") == "0"  # no float series to chart
    canvases.first.hover()
    hover = page.inner_text("#hm-hover-0")
    assert ".." in hover  # the pointer names the cell's bucket range, in the buckets' unit
    assert re.search(r"\d (µs|ms) \.\. [\d.]+ (µs|ms)", hover), hover
    assert page.get_attribute("#heatmaps", "data-unit") == "s"
    page.screenshot(path=tmp_path / "explore-heatmap.png", full_page=True)
    # A quantile of the rated histograms is in seconds too (the rate is of the counts); the legend
    # names each kernel by its name alone (the one label that differs).
    query = (
        'histogram_quantile(0.99, sum by (kernel) (rate(kernel_duration_seconds{instance="node-0001"}[1m])))'
    )
    page.fill("#q", query)
    page.click("#run")
    page.wait_for_function(f"document.querySelector('#chart').dataset.series === '{len(KERNELS)}'")
    assert page.get_attribute("#chart", "data-unit") == "s"
    labels = page.locator(".u-legend tr.u-series .u-label").all_inner_texts()[1:]
    assert sorted(labels) == sorted(KERNELS)


def test_timeline_draws_every_span_on_one_lane_per_stream_zooms_pans_and_exports(page, collector, tmp_path):
    _sign_in(page, collector)
    page.goto(f"{collector.url}/#/timeline?{_window()}")
    page.wait_for_selector("#t-count", timeout=60_000)
    assert page.get_attribute("#t-count", "data-spans") == str(SPANS)
    assert page.get_attribute("#t-count", "data-lanes") == "4"
    assert page.get_attribute("#t-count", "data-tracks") == "memory_used_bytes:100,sm_utilization:100"
    assert page.get_attribute("#t-count", "data-events") == "1"
    assert "oom 2: CUDA out of memory (simulated)" in page.inner_text("#t-events")
    # host threads above the streams, the GPU's NCCL / memory / sync calls under them
    assert page.get_attribute("#t-count", "data-threads") == "2"
    assert page.get_attribute("#t-count", "data-launches") == str(SPANS)
    assert (
        page.get_attribute("#t-count", "data-calls") == f"NCCL:{NCCL_OPS},memory:{MEMORY_OPS},syncs:{SYNCS}"
    )
    layout = page.evaluate("kiTimeline.layout()")
    assert layout["hostTop"] < layout["streamsTop"] < layout["callsTop"] < layout["tracksTop"]
    assert page.evaluate("kiTimeline.view()")["arrows"] == 0  # 20,000 launches in view: no arrows
    assert "zoom in for launch arrows" in page.inner_text("#t-arrows")
    whole = page.evaluate("kiTimeline.view()")
    right, room = page.evaluate(
        """() => { const c = document.getElementById("t-canvas"), p = c.parentElement, s = getComputedStyle(p);
        return [c.getBoundingClientRect().right,
                p.getBoundingClientRect().right - parseFloat(s.paddingRight) - parseFloat(s.borderRightWidth)]; }"""
    )
    assert right <= room + 0.5, (right, room)  # the canvas within its box: the page does not scroll sideways
    box = page.locator("#t-canvas").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    for _ in range(10):
        page.mouse.wheel(0, -100)  # zoom in around the pointer
    page.wait_for_function(f"kiTimeline.view().t1 - kiTimeline.view().t0 < {(whole['t1'] - whole['t0']) / 5}")
    zoomed = page.evaluate("kiTimeline.view()")
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] / 2 - 200, box["y"] + box["height"] / 2)
    page.mouse.up()
    panned = page.evaluate("kiTimeline.view()")
    assert panned["t0"] > zoomed["t0"]  # dragging left shows later spans
    assert abs((panned["t1"] - panned["t0"]) - (zoomed["t1"] - zoomed["t0"])) < 1e-3 * (
        zoomed["t1"] - zoomed["t0"]
    )
    page.mouse.move(
        box["x"] + box["width"] / 2, box["y"] + layout["streamsTop"] + 11
    )  # the first stream's middle
    page.wait_for_function("document.getElementById('t-hover').textContent !== ''")
    hover = page.inner_text("#t-hover")
    assert any(hover.startswith(k + " · stream 0x7f0000001000") for k in KERNELS), hover
    assert hover.endswith(" · pod ml/train-0 (main)"), hover  # the first stream's spans ran in POD
    # the NCCL lane names the operation under the pointer: all-reduce i starts at 1 + i/20 s (window
    # origin SPAN_START_S - 1) and lasts 1/60 s; point 5 ms into the first one in view
    view = page.evaluate("kiTimeline.view()")
    at = (1 + math.ceil((view["t0"] / 1e9 - 1) * 20) / 20 + 0.005) * 1e9
    x = layout["left"] + (at - view["t0"]) / (view["t1"] - view["t0"]) * (box["width"] - layout["left"])
    page.mouse.move(
        box["x"] + x, box["y"] + layout["callsTop"] + layout["calls"].index("NCCL") * layout["laneH"] + 11
    )
    from playwright.sync_api import expect

    expect(page.locator("#t-hover")).to_contain_text("NCCL allreduce · 1.07GB")
    # zoomed in to a few launches: an arrow from each launch to its kernel, bounded
    page.evaluate("kiTimeline.zoom(0.01)")
    view = page.evaluate("kiTimeline.view()")
    assert 0 < view["launchesInView"] <= 300
    assert view["arrows"] > 0
    assert view["arrows"] <= view["launchesInView"]
    page.screenshot(path=tmp_path / "timeline.png")
    fps = page.evaluate("kiTimeline.panFps(500, 4)")
    assert fps > 0  # the figure itself is make bench-ui's

    with page.expect_download() as dl:
        page.click("#t-export")
    trace = json.loads(Path(dl.value.path()).read_text())
    cats = Counter((e["ph"], e.get("cat")) for e in trace["traceEvents"])
    assert cats[("X", "kernel")] == cats[("X", "launch")] == cats[("s", "launch")] == SPANS
    assert (cats[("X", "nccl")], cats[("i", "memory")], cats[("X", "sync")]) == (NCCL_OPS, MEMORY_OPS, SYNCS)


def test_timeline_and_kernels_show_only_the_spans_of_the_pod_asked_for(page, collector):
    _sign_in(page, collector)
    page.goto(f"{collector.url}/#/timeline?{_window()}&pod={POD[0]}")
    page.wait_for_selector("#t-count", timeout=60_000)
    assert page.get_attribute("#t-count", "data-spans") == str(SPANS // 2)  # the even streams'
    assert page.get_attribute("#t-count", "data-lanes") == "2"
    assert page.input_value("#w-pod") == POD[0]
    page.goto(f"{collector.url}/#/timeline?{_window()}&pod=nobody")
    page.wait_for_selector("#t-empty-any-pod", timeout=60_000)
    assert page.get_attribute("#t-count", "data-spans") == "0"  # the GPU's samples and calls are still drawn
    page.click("#t-empty-any-pod")  # the same window without the filter
    page.wait_for_function(f"document.getElementById('t-count')?.dataset.spans === '{SPANS}'", timeout=60_000)
    assert "pod=" not in page.url


def test_timeline_without_spans_says_what_is_empty_and_what_to_try(page, collector, tmp_path):
    _sign_in(page, collector)
    # An instance the collector does not know: no chart, no spinner, the name called out.
    page.goto(
        f"{collector.url}/#/timeline?instance=node-9999&gpu=0&from={SPAN_START_S}&to={SPAN_START_S + 10}"
    )
    page.wait_for_selector("#t-empty, #t-count")
    assert page.locator("#t-empty").count() == 1
    note = page.inner_text("#t-empty")
    assert "No kernel spans of node-9999 GPU 0" in note
    assert "knows no instance node-9999" in note
    assert "wider window" in note
    assert "slow tail and a sample" in note
    assert page.get_attribute("#t-empty", "data-known") == "false"
    assert page.locator("#t-canvas").count() == 0
    assert page.locator("#t-status").count() == 0  # "Loading spans..." is gone
    page.screenshot(path=tmp_path / "timeline-unknown.png", full_page=True)

    # A known GPU, a window before its spans: the same note without the unknown name; its "last
    # hour" link reaches the spans (written two minutes before the module's start).
    page.goto(
        f"{collector.url}/#/timeline?instance=node-0001&gpu=0&from={SPAN_START_S - 3600}&to={SPAN_START_S - 3000}"
    )
    page.wait_for_selector("#t-empty")
    assert page.get_attribute("#t-empty", "data-known") == "true"
    assert "knows no instance" not in page.inner_text("#t-empty")
    assert page.locator("#t-canvas").count() == 0
    page.click("#t-empty-hour")
    page.wait_for_selector("#t-count", timeout=60_000)
    assert page.get_attribute("#t-count", "data-spans") == str(SPANS)

    # A GPU with NVML samples (the fleet's, from 30 s before the collector started) but no spans:
    # the note, and the samples still drawn under it. The window ends now: in a full run the module
    # can start many minutes after SPAN_START_S was taken.
    now = int(time.time())
    page.goto(f"{collector.url}/#/timeline?instance=node-0001&gpu=3&from={now - 900}&to={now}")
    page.wait_for_selector("#t-empty")
    page.wait_for_selector("#t-canvas")
    assert page.get_attribute("#t-count", "data-spans") == "0"
    assert "sm_utilization:3" in (page.get_attribute("#t-count", "data-tracks") or "")
    page.screenshot(path=tmp_path / "timeline-no-spans.png", full_page=True)

    # A window that is not one is refused in the page, before the API is asked.
    page.goto(
        f"{collector.url}/#/timeline?instance=node-0001&gpu=0&from={SPAN_START_S}&to={SPAN_START_S - 5}"
    )
    page.wait_for_selector("#w-error")
    assert "end must be after its start" in page.inner_text("#w-error")
    page.goto(f"{collector.url}/#/kernels?instance=node-0001&gpu=x&from={SPAN_START_S}&to={SPAN_START_S + 5}")
    page.wait_for_selector("#w-error")
    assert 'GPU must be a number from 0 to 65535, not "x"' in page.inner_text("#w-error")


def test_a_token_revoked_while_signed_in_sends_the_page_back_to_sign_in(page, collector, refused_requests):
    tokens = TokenStore(collector.stderr.parent / "tokens.json")  # the collector's token file
    created = tokens.create("ui-revoke", ["read"])
    # The server re-reads the token file within a second: sign in only once it knows the token.
    deadline = time.monotonic() + 15
    headers = {"Authorization": f"Bearer {created.token}"}
    while (
        httpx.get(collector.url + "/api/v1/status/buildinfo", headers=headers, timeout=10).status_code != 200
    ):
        assert time.monotonic() < deadline, "the collector never accepted the new token"
        time.sleep(0.1)
    page.goto(collector.url + "/")
    page.fill("#token", created.token)
    page.click("#login button")
    page.wait_for_selector("#fleet-grid .tile")
    tokens.revoke(created.info.id)
    deadline = time.monotonic() + 15  # the server re-reads the file within a second
    pages = [("alerts", "#alerts"), ("fleet", "#fleet-grid .tile")]
    n = 0
    while not page.is_visible("#login"):
        assert time.monotonic() < deadline, "the page still works with a revoked token"
        name, shown = pages[n % 2]
        n += 1
        try:
            page.click(f'header nav a[data-page="{name}"]', timeout=2_000)
        except PlaywrightTimeoutError:
            # The refusal of the previous page's call can bring the sign-in page (which hides the
            # header) between the check above and this click: the loop's check then sees it.
            continue
        page.wait_for_selector(f"#login, {shown}")  # each page load is one more request with the token
    assert "refused" in page.inner_text("#login-error")
    assert page.evaluate("sessionStorage.getItem('ki.token')") is None


def test_an_answer_arriving_after_a_401_does_not_draw_over_the_sign_in_page(
    page, collector, refused_requests
):
    # The race the revocation test above hits by chance, forced: the alerts page's call is held in
    # the browser while the fleet page's call is refused; the alerts answer (a 200, sent while the
    # token still worked) then arrives with the tab signed out and must leave the sign-in page alone.
    _sign_in(page, collector)
    held: list = []
    page.route("**/api/v1/alerts", lambda route: held.append(route))
    page.click('header nav a[data-page="alerts"]')
    deadline = time.monotonic() + 15
    while not held:
        assert time.monotonic() < deadline, "the alerts page never called /api/v1/alerts"
        page.wait_for_timeout(20)
    refused = json.dumps({"status": "error", "errorType": "unauthorized", "error": "token refused"})
    page.route(
        "**/v1/health/snapshot",
        lambda route: route.fulfill(status=401, content_type="application/json", body=refused),
    )
    page.click('header nav a[data-page="fleet"]')
    page.wait_for_selector("#login")
    with page.expect_response("**/api/v1/alerts") as answer:
        held[0].continue_()
    assert answer.value.status == 200
    page.wait_for_timeout(500)  # the page's handling of the late answer (JSON parse, render) runs now
    assert page.is_visible("#login")
    assert not page.is_visible("#alerts")
    assert "refused" in page.inner_text("#login-error")


def test_sign_out_forgets_the_token(page, collector):
    _sign_in(page, collector)
    page.click("#signout")
    page.wait_for_selector("#login")
    assert page.evaluate("sessionStorage.getItem('ki.token')") is None
    page.goto(collector.url + "/#/fleet")
    page.wait_for_selector("#login")


# What each query's values are measured in (queryUnit, which labels the chart's axis and legend):
# the function's result unit from kql's registry, else the metric's.
QUERY_UNITS = {
    "gpu_memory_free_bytes": "B",
    "sum by (gpu) (gpu_memory_free_bytes)": "B",
    "rate(pcie_rx_bytes_total[5m])": "B/s",
    "irate(pcie_rx_bytes_total[5m])": "B/s",
    "deriv(gpu_temperature_celsius[5m])": "°C/s",
    "rate(gpu_busy_seconds_total[5m])": "",  # seconds per second: a plain number
    "count(gpu_memory_free_bytes)": "",
    'count_values("v", gpu_memory_free_bytes)': "",
    "group(gpu_memory_free_bytes)": "",
    "count_over_time(gpu_memory_free_bytes[5m])": "",
    "changes(gpu_memory_free_bytes[5m])": "",
    "resets(pcie_rx_bytes_total[5m])": "",
    "absent(gpu_memory_free_bytes)": "",
    "absent_over_time(gpu_memory_free_bytes[5m])": "",
    "present_over_time(gpu_memory_free_bytes[5m])": "",
    "timestamp(gpu_memory_free_bytes)": "",
    "histogram_count(rate(kernel_duration_seconds[1m]))": "",
    "histogram_quantile(0.9, sum(rate(kernel_duration_seconds[1m])))": "s",
    "histogram_avg(rate(kernel_duration_seconds[1m]))": "s",
    "histogram_stddev(kernel_duration_seconds)": "s",
    "histogram_stdvar(kernel_duration_seconds)": "s",
    "histogram_sum(kernel_duration_seconds)": "s",
    "histogram_sum(rate(kernel_duration_seconds[1m]))": "",  # seconds per second
    "histogram_fraction(0, 0.1, kernel_duration_seconds)": "ratio",
    "histogram_quantile(0.9, rate(pcie_rx_bytes_bucket[5m]))": "B",
    "gpu_memory_free_bytes / gpu_memory_total_bytes": "",
    "gpu_memory_free_bytes + gpu_temperature_celsius": "",
}


def test_explore_units_follow_kql_result_units(page, collector):
    """queryUnit reads each function's result unit from kql (GET /ui/kql.json), none from app.js."""
    page.goto(collector.url)
    got = page.evaluate("async (qs) => { await vocabulary; return qs.map(queryUnit); }", list(QUERY_UNITS))
    assert dict(zip(QUERY_UNITS, got, strict=True)) == QUERY_UNITS
