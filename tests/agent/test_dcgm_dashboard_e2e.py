"""dcgm-exporter users' dashboard works unchanged: every query of deploy/grafana/dashboards/dcgm-exporter.json
(dcgm-exporter's own panels and queries) and its variables' label_values return at least one series
from a real ``ki collector`` fed by a real ki-agent draining the simulator's ring, as in ``ki run``.
No browser: the queries go to the Prometheus API Grafana would call."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from support.collector import start_agent, start_collector, stop_collector

from kernel_insight.agent.ring import Ring, ring_name
from kernel_insight.api import TokenStore
from kernel_insight.collector.keys import KeyStore

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "dcgm-exporter.json"
#: What Grafana puts in place of the variables with "All" selected (their allValue).
ALL = {"$instance": ".*", "$gpu": ".*"}


def _queries() -> list[tuple[str, str]]:
    d = json.loads(DASHBOARD.read_text())
    out = []
    for panel in d["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for var, value in ALL.items():
                expr = expr.replace(var, value)
            out.append((panel["title"], expr))
    return out


def _label_values(d: dict) -> list[tuple[str, str]]:
    """(label, metric) of each ``label_values(METRIC, LABEL)`` variable."""
    out = []
    for var in d["templating"]["list"]:
        inner = var["query"]["query"].removeprefix("label_values(").removesuffix(")")
        metric, label = (x.strip() for x in inner.split(","))
        out.append((label, metric))
    return out


@pytest.mark.slow
def test_every_dcgm_dashboard_query_returns_a_series(tmp_path, agent_bin):
    keys = KeyStore(tmp_path / "keys.json")
    keys.add_agent("dcgm-dashboard").write_key_file(tmp_path / "agent.key")
    token = TokenStore(tmp_path / "tokens.json").create("grafana", ["read"]).token
    label = f"dash-{os.getpid()}-{uuid.uuid4().hex[:8]}-"
    ring = ring_name(f"{label}0")
    with contextlib.suppress(OSError):
        Ring.unlink(ring)
    Ring.create(ring, capacity=1 << 16).close()
    collector, url = start_collector(tmp_path, "--interval", "1")
    agent = sim = None
    queries = _queries()
    assert len(queries) == 8
    try:
        agent = start_agent(tmp_path, agent_bin, ring, url, "--drain-interval-ms", "100")
        sim = subprocess.Popen(
            [sys.executable, "-m", "kernel_insight.cli", "probe", "simulate", "--gpus", "1",
             "--label-prefix", label, "--seconds", "120"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        missing: list[str] = [title for title, _ in queries]
        empty_vars: list[str] = []
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as api:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                missing = []
                for title, expr in queries:
                    r = api.get("/api/v1/query", params={"query": expr})
                    assert r.status_code == 200, (title, r.text)
                    if not r.json()["data"]["result"]:
                        missing.append(title)
                empty_vars = []
                for name, metric in _label_values(json.loads(DASHBOARD.read_text())):
                    r = api.get(f"/api/v1/label/{name}/values", params={"match[]": metric})
                    assert r.status_code == 200, r.text
                    if not r.json()["data"]:
                        empty_vars.append(name)
                if not missing and not empty_vars:
                    break
                time.sleep(1)
            assert missing == [], f"panels with no series: {missing}"
            assert empty_vars == [], f"variables with no values: {empty_vars}"
            # The series carry dcgm-exporter's labels, so its legends and filters read as before.
            r = api.get("/api/v1/query", params={"query": "DCGM_FI_DEV_GPU_TEMP"})
            (series,) = r.json()["data"]["result"]
            labels = series["metric"]
            assert labels["gpu"] == "0"
            assert labels["device"] == "nvidia0"
            assert labels["UUID"].startswith("GPU-")
            assert labels["modelName"].startswith("NVIDIA H100")
            assert labels["Hostname"] == labels["hostname"] != ""
    finally:
        for proc in (sim, agent):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
        stop_collector(collector)
        with contextlib.suppress(OSError):
            Ring.unlink(ring)
