"""The shipped Grafana dashboards work against the main job: every panel query and every variable's
``label_values`` of each dashboard in deploy/grafana/dashboards (dcgm-exporter's own panels and
queries among them) returns at least one series from a real ``ki run`` (collector, ki-agent,
simulated GPU). No browser: the queries go to the Prometheus API Grafana would call."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kernel_insight.run import free_port

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json"))
#: What Grafana puts in place of the variables: "All" (their allValue) and its interval macros.
ALL = {"$instance": ".*", "$gpu_product": ".*", "$gpu": ".*", "$model": ".*"}
MACROS = {"$__rate_interval": "1m", "$__interval": "15s"}
_LABEL_VALUES = re.compile(r"^label_values\((.*),\s*(\w+)\)$")


def _grafana(expr: str) -> str:
    for var, value in {**MACROS, **ALL}.items():
        expr = expr.replace(var, value)
    return expr


def _queries(d: dict) -> list[tuple[str, str]]:
    return [(p["title"], _grafana(t["expr"])) for p in d["panels"] for t in p.get("targets", [])]


def _label_values(d: dict) -> list[tuple[str, str, str]]:
    """(variable, label, series selector) of each ``label_values(SELECTOR, LABEL)`` variable."""
    out = []
    for var in d["templating"]["list"]:
        m = _LABEL_VALUES.match(var["query"]["query"])
        assert m is not None, var
        out.append((var["name"], m.group(2), _grafana(m.group(1).strip())))
    return out


def _empty(api: httpx.Client) -> list[str]:
    """What returns nothing yet, as ``dashboard: panel`` and ``dashboard: $variable``."""
    missing = []
    for path in DASHBOARDS:
        d = json.loads(path.read_text())
        for title, expr in _queries(d):
            r = api.get("/api/v1/query", params={"query": expr})
            assert r.status_code == 200, (path.stem, title, r.text)
            if not r.json()["data"]["result"]:
                missing.append(f"{path.stem}: {title}")
        for name, label, selector in _label_values(d):
            r = api.get(f"/api/v1/label/{label}/values", params={"match[]": selector})
            assert r.status_code == 200, (path.stem, name, r.text)
            if not r.json()["data"]:
                missing.append(f"{path.stem}: ${name}")
    return missing


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_query_of_every_shipped_dashboard_returns_a_series_in_ki_run(tmp_path):
    assert [p.stem for p in DASHBOARDS] == ["dcgm-exporter", "fleet-health", "ingest", "kernel-latency"]
    data, port = tmp_path / "data", free_port()
    out = tmp_path / "run.txt"
    # --compress: the simulator's rare events (errors, NCCL timeouts) within the test's minutes
    with out.open("w") as f:
        job = subprocess.Popen(
            [sys.executable, "-m", "kernel_insight.cli", "run", "--data", str(data), "--port", str(port),
             "--seconds", "400", "--every", "60", "--ring-prefix", f"dash{os.getpid()}-", "--compress", "30",
             "--label", "model=llama-70b"],
            stdout=f, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        token_file = data / "read.token"
        while not token_file.exists():
            assert job.poll() is None, out.read_text()
            assert time.monotonic() < deadline, f"ki run did not start: {out.read_text()}"
            time.sleep(1)
        headers = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        with httpx.Client(base_url=url, headers=headers, timeout=60) as api:
            while True:
                try:
                    missing = _empty(api)
                except httpx.TransportError:
                    missing = ["the collector (not answering yet)"]
                if not missing or time.monotonic() > deadline:
                    break
                assert job.poll() is None, out.read_text()
                time.sleep(2)
            assert missing == [], f"no series yet after 300 s: {missing}"
            # dcgm-exporter's labels, so its legends and filters read as before
            r = api.get("/api/v1/query", params={"query": "DCGM_FI_DEV_GPU_TEMP"})
            (series,) = r.json()["data"]["result"]
            labels = series["metric"]
            assert labels["gpu"] == "0"
            assert labels["device"] == "nvidia0"
            assert labels["UUID"].startswith("GPU-")
            assert labels["modelName"].startswith("NVIDIA H100")
            assert labels["Hostname"] == labels["hostname"] != ""
    finally:
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)
            try:
                job.wait(60)
            except subprocess.TimeoutExpired:
                job.kill()
                job.wait()
