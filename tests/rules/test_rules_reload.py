"""``kill -HUP`` makes a running ``ki collector`` read its rule files again; a broken file keeps the old rules."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx


def _names(url: str) -> list[str]:
    groups = httpx.get(f"{url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    return [r["name"] for g in groups for r in g["rules"]]


def _wait(check, bound_s: float) -> None:
    deadline = time.monotonic() + bound_s
    while not check():
        assert time.monotonic() < deadline, f"not within {bound_s} s"
        time.sleep(0.1)


def test_sighup_reloads_the_rule_files(tmp_path):
    rules = tmp_path / "r.yml"
    rules.write_text("groups: [{name: g, interval: 1s, rules: [{alert: First, expr: vector(1)}]}]\n")
    with (tmp_path / "collector.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernel_insight.cli", "collector", "--store", str(tmp_path / "data"),
             "--local-dev", "--port", "0", "--keys", str(tmp_path / "keys.json"), "--interval", "3600",
             "--rules", str(tmp_path / "*.yml")],
            stdout=subprocess.PIPE, stderr=log, text=True,
        )  # fmt: skip
    try:
        line = ""
        while "listening on" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, (tmp_path / "collector.log").read_text()
        url = line.strip().rsplit(" ", 1)[1]
        assert _names(url) == ["First"]
        rules.write_text(
            "groups: [{name: g, interval: 1s, rules: [{alert: First, expr: vector(1)}, {record: two, expr: vector(2)}]}]\n"
        )
        proc.send_signal(signal.SIGHUP)
        _wait(lambda: _names(url) == ["First", "two"], 20)
        # A file that no longer loads: the collector says so and keeps evaluating the old rules.
        rules.write_text("groups: [{name: g, rules: [{alert: Broken, expr: 'sum('}]}]\n")
        proc.send_signal(signal.SIGHUP)
        _wait(lambda: "reload failed" in (tmp_path / "collector.log").read_text(), 20)
        assert _names(url) == ["First", "two"]
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()
