"""Every shipped way to run the collector lets a stopping collector finish writing what it
accepted: SIGKILL comes later than the batcher's own shutdown bound (docs/storage.md, "Exactly
once"). A unit that kills sooner cuts a group short on every routine stop."""

from __future__ import annotations

import re

import yaml
from deployutil import DEPLOY, render

from kernel_insight.collector.defaults import BATCHER_SHUTDOWN_S

#: What uvicorn's own shutdown and the store's close need beside the batcher's bound.
MARGIN_S = 15.0


def _seconds(text: str) -> float:
    """A systemd/compose duration such as ``60s``, ``1m30s`` or ``90``."""
    units = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(min|h|m|s|)", text.strip())
    assert parts, text
    assert "".join(n + u for n, u in parts) == text.strip().replace(" ", ""), text
    return sum(float(n) * units[u] for n, u in parts)


def test_seconds_reads_the_forms_the_units_use():
    assert _seconds("60s") == 60
    assert _seconds("1m30s") == 90
    assert _seconds("90") == 90


def test_systemd_waits_longer_than_the_batcher_before_sigkill():
    unit = (DEPLOY / "systemd" / "ki-collector.service").read_text()
    (value,) = re.findall(r"^TimeoutStopSec=(.+)$", unit, re.M)
    assert _seconds(value) >= BATCHER_SHUTDOWN_S + MARGIN_S, value


def test_kubernetes_waits_longer_than_the_batcher_before_sigkill():
    (collector,) = [
        o for o in render(DEPLOY) if o["kind"] == "Deployment" and o["metadata"]["name"] == "ki-collector"
    ]
    grace = collector["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    assert grace >= BATCHER_SHUTDOWN_S + MARGIN_S, grace


def test_compose_waits_longer_than_the_batcher_before_sigkill():
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    grace = compose["services"]["collector"].get("stop_grace_period", "10s")
    assert _seconds(str(grace)) >= BATCHER_SHUTDOWN_S + MARGIN_S, grace
