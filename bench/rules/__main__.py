"""bench-rules: 1,000 alert and 200 recording rules evaluated by ``ki collector`` every 15 s.

The collector runs as its own process over bench-kql's fleet (2,050 series, 7 h at 15 s,
loaded into its embedded store), kept live by a remote_write sender that posts every
series' next sample each scrape interval, and sends alerts to Debian's
``prometheus-alertmanager`` (when installed, else straight to the webhook) which forwards
to a webhook receiver. Reported:

- ``cycle_s``: evaluation time of all groups per interval (the sum of the groups' median
  ``evaluationTime`` from ``/api/v1/rules``); it keeps up while this stays under 15 s,
  and the target is <= 2 s;
- ``notify_s``: from the remote_write that makes a ``for: 15s`` rule's condition true to
  the webhook receiving the alert (target <= interval + for + 5 s = 35 s);
- ``cpu_s``: CPU seconds the collector process spent per interval while measured (rules,
  the remote_write it takes, everything): the evaluation cost a loaded machine's wall-clock
  figures hide.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.kql.data import GPUS, INSTANCES, KERNELS, MODELS, SCRAPE_MS, Dataset, dataset, load_chdb
from bench.kql.servers import free_port
from kernel_insight.collector.remote_write import encode_write_request

INTERVAL_S = 15
GROUPS = 10
ALERTS_PER_GROUP = 100
RECORDS_PER_GROUP = 20


def rule_files(out: Path) -> int:
    """10 groups of 20 recording and 100 alert rules over the fleet's metrics; returns the rule count."""
    rng = np.random.default_rng(11)
    n = 0
    trigger = (
        "      - alert: BenchTrigger\n        expr: bench_trigger > 0\n        for: 15s\n"
        "        labels: {severity: page}\n"
        "        annotations: {summary: 'trigger at {{ $value }}'}\n"
    )
    for g in range(GROUPS):
        lines = [f"groups:\n  - name: bench-{g}\n    interval: {INTERVAL_S}s\n    rules:\n"]
        for r in range(RECORDS_PER_GROUP):
            i = g * RECORDS_PER_GROUP + r
            kernel, model = KERNELS[i % len(KERNELS)], MODELS[i % len(MODELS)]
            expr = [
                f'sum by (instance) (rate(kernel_launches_total{{kernel="{kernel}"}}[5m]))',
                f'avg by (instance) (gpu_temperature_celsius{{model="{model}"}})',
                f'max by (instance, model) (avg_over_time(gpu_power_watts{{model="{model}"}}[5m]))',
                f'quantile by (model) (0.9, gpu_sm_utilization_ratio{{model="{model}"}})',
            ][i % 4]
            lines.append(f"      - record: bench:rec_{i}\n        expr: '{expr}'\n")
            n += 1
        for r in range(ALERTS_PER_GROUP):
            i = g * ALERTS_PER_GROUP + r
            inst = f"node-{i % INSTANCES:02d}"
            kernel, model = KERNELS[i % len(KERNELS)], MODELS[i % len(MODELS)]
            rec = g * RECORDS_PER_GROUP + i % RECORDS_PER_GROUP
            t = float(rng.uniform(60, 95))
            expr = [
                f'gpu_temperature_celsius{{instance="{inst}"}} > {t:.1f}',
                f'avg_over_time(gpu_power_watts{{instance="{inst}"}}[5m]) > {t * 7:.0f}',
                f'rate(kernel_launches_total{{instance="{inst}", kernel="{kernel}"}}[5m]) > {t / 2:.1f}',
                f'gpu_memory_used_bytes{{instance="{inst}"}} > {int(t * 0.7)}GiB',
                f"bench:rec_{rec} > {t * 5:.0f}",
                f'gpu_sm_utilization_ratio{{model="{model}", gpu="{i % GPUS}"}} < {t / 1000:.3f}',
                f'max_over_time(ki_agent_drain_lag_seconds{{instance="{inst}"}}[5m]) > {t / 500:.2f}',
                f'increase(gpu_energy_joules_total{{instance="{inst}", gpu="{i % GPUS}"}}[5m]) > 250000',
            ][i % 8]
            fr = ["0s", "1m", "5m"][i % 3]
            lines.append(
                f"      - alert: BenchAlert{i}\n        expr: '{expr}'\n        for: {fr}\n"
                "        labels: {severity: warning}\n"
                "        annotations: {summary: '{{ $labels.instance }} at {{ $value | humanize }}'}\n"
            )
            n += 1
        if g == 0:
            lines.append(trigger)
            n += 1
        (out / f"bench-{g}.yml").write_text("".join(lines))
    return n


class Hook:
    """The webhook receiver: when each alert name first arrived (monotonic)."""

    def __init__(self) -> None:
        self.first: dict[str, float] = {}
        self.lock = threading.Lock()

    def note(self, body: Any) -> None:
        alerts = body if isinstance(body, list) else body.get("alerts", [])
        now = time.monotonic()
        with self.lock:
            for a in alerts:
                if a.get("status", "firing") == "firing":
                    self.first.setdefault(a["labels"]["alertname"], now)


@contextlib.contextmanager
def webhook() -> Iterator[tuple[str, Hook]]:
    hook = Hook()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            hook.note(json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}"))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hook
    finally:
        server.shutdown()
        server.server_close()


class Sender:
    """remote_write of every series' next sample each scrape interval (the fleet stays live)."""

    def __init__(self, url: str, data: Dataset) -> None:
        self.client = httpx.Client(base_url=url, timeout=30)
        self.series = [(dict(labels), float(vs[-1])) for labels, _, vs in data]
        self.trigger = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def post(self, extra: list[tuple[dict[str, str], list[tuple[int, float]]]] | None = None) -> None:
        now = int(time.time() * 1000)
        body = encode_write_request(
            [(labels, [(now, v)]) for labels, v in self.series]
            + [({"__name__": "bench_trigger"}, [(now, self.trigger)])]
            + (extra or [])
        )
        headers = {"content-type": "application/x-protobuf", "content-encoding": "snappy"}
        self.client.post("/api/v1/write", content=body, headers=headers).raise_for_status()

    def run(self) -> None:
        while not self.stop.wait(SCRAPE_MS / 1000):
            self.post()

    def fire(self) -> float:
        """Make the trigger's condition true now; returns when (monotonic, after the write was stored)."""
        self.trigger = 1.0
        self.post()
        return time.monotonic()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rules", description=__doc__)
    p.add_argument("--cycles", type=int, default=4, help="evaluation cycles measured (default 4)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="ki-bench-rules-"))
    try:
        return run(root, args.cycles)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def run(root: Path, cycles: int) -> int:
    now = int(time.time() * 1000)
    t0 = now - now % SCRAPE_MS - 7 * 3600_000
    data = dataset(t0)
    print(f"bench-rules: loading {len(data)} series (7 h at 15 s) into {root / 'store'}", file=sys.stderr)
    load_chdb(root / "store", data)
    rules = root / "rules"
    rules.mkdir()
    n_rules = rule_files(rules)
    with webhook() as (hook_url, hook), contextlib.ExitStack() as stack:
        target = hook_url
        am = shutil.which("prometheus-alertmanager")
        if am:
            port = free_port()
            (root / "am.yml").write_text(
                "route: {receiver: hook, group_by: [alertname], group_wait: 0s, group_interval: 1s, repeat_interval: 1h}\n"
                f"receivers: [{{name: hook, webhook_configs: [{{url: '{hook_url}/hook'}}]}}]\n"
            )
            log = stack.enter_context((root / "am.log").open("w"))
            am_proc = subprocess.Popen(
                [am, f"--config.file={root / 'am.yml'}", f"--storage.path={root / 'am'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                stdout=log, stderr=log,
            )  # fmt: skip
            stack.callback(_stop, am_proc)
            target = f"http://127.0.0.1:{port}"
            _wait_ok(f"{target}/-/ready", 30)
        ki_port = free_port()
        url = f"http://127.0.0.1:{ki_port}"
        log = stack.enter_context((root / "collector.log").open("w"))
        collector = subprocess.Popen(
            [sys.executable, "-m", "kernel_insight.cli", "collector", "--store", str(root / "store"),
             "--port", str(ki_port), "--local-dev", "--keys", str(root / "keys.json"), "--interval", "3600",
             "--rules", str(rules / "*.yml"), "--alertmanager", target],
            stdout=log, stderr=log,
        )  # fmt: skip
        stack.callback(_stop, collector)
        _wait_ok(f"{url}/healthz", 180)
        sender = Sender(url, data)
        sender.post()
        sender.thread.start()
        stack.callback(sender.stop.set)
        with httpx.Client(base_url=url, timeout=30) as client:
            times: dict[str, dict[str, float]] = {}
            missed = 0
            # One cycle to warm up, then measure; the trigger fires in the middle.
            end = time.monotonic() + (cycles + 1) * INTERVAL_S
            fired_at = None
            cpu_start: tuple[float, float] | None = None
            while time.monotonic() < end:
                if cpu_start is None and time.monotonic() > end - cycles * INTERVAL_S:
                    cpu_start = (time.monotonic(), _cpu_seconds(collector.pid))
                # The recording rules are enough to see every group's evaluations; asking for all
                # 1,201 rules with their alerts twice a second would load the collector we measure.
                groups = client.get("/api/v1/rules", params={"type": "record"}).json()["data"]["groups"]
                for g in groups:
                    seen = times.setdefault(g["name"], {})
                    if g["lastEvaluation"].startswith("0001") or g["lastEvaluation"] in seen:
                        continue
                    if seen and max(_epoch(t) for t in seen) < _epoch(g["lastEvaluation"]) - INTERVAL_S - 1:
                        missed += 1
                    seen[g["lastEvaluation"]] = g["evaluationTime"]
                if fired_at is None and time.monotonic() > end - (cycles - 1) * INTERVAL_S:
                    fired_at = sender.fire()
                time.sleep(1.0)
            everything = client.get("/api/v1/rules", params={"exclude_alerts": "true"}).json()["data"][
                "groups"
            ]
            errors = [
                (g["name"], r["name"], r.get("lastError"))
                for g in everything
                for r in g["rules"]
                if r["health"] == "err"
            ]
            if errors:
                print(f"bench-rules: rules failed: {errors[:3]}", file=sys.stderr)
                return 1
            assert cpu_start is not None
            cpu_per_interval = (
                (_cpu_seconds(collector.pid) - cpu_start[1]) / (time.monotonic() - cpu_start[0]) * INTERVAL_S
            )
            deadline = time.monotonic() + 60
            while "BenchTrigger" not in hook.first and time.monotonic() < deadline:
                time.sleep(0.1)
    if fired_at is None or "BenchTrigger" not in hook.first:
        print("bench-rules: the trigger alert never reached the webhook", file=sys.stderr)
        return 1
    notify_s = hook.first["BenchTrigger"] - fired_at
    # Each group's first evaluation warms caches up (parsing, labels, the sample cache): left out.
    per_group = {g: [v[k] for k in sorted(v)][1:] or list(v.values()) for g, v in times.items()}
    cycle_s = sum(statistics.median(v) for v in per_group.values())
    worst = max(max(v) for v in per_group.values())
    print(
        f"bench-rules: {len(per_group)} groups, {n_rules} rules every {INTERVAL_S} s; per group "
        f"median {statistics.median([statistics.median(v) for v in per_group.values()]):.3f} s, worst {worst:.3f} s; "
        f"missed slots {missed}; via {'alertmanager' if target != hook_url else 'webhook'}",
        file=sys.stderr,
    )
    print(
        f"BENCH rules cycle_s={cycle_s:.3f} notify_s={notify_s:.2f} rules={n_rules} "
        f"cpu_s={cpu_per_interval:.3f}"
    )
    return 0


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux ``/proc/<pid>/stat``)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _epoch(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _wait_ok(url: str, bound_s: float) -> None:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready within {bound_s} s")


if __name__ == "__main__":
    sys.exit(main())
