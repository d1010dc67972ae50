"""Capture windows end to end (issue #15): ``ki timeline capture --wait`` against a real ``ki collector``
and the real ki-agent draining a ring a producer fills: the agent takes the request from an ingest
answer, runs the window on its clock, and the request ends ``done`` with exactly the spans the
producer wrote for that GPU in the window, every one of them stored."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx
from agent_harness import wait_for
from support.collector import running_collector

from kernel_insight.agent import FingerprintField
from kernel_insight.agent.ring import Ring
from kernel_insight.sdk import TimelineClient

RATE = 500  # kernels per second and GPU


def test_ki_timeline_capture_gets_every_span_of_the_window_stored(tmp_path, agent_asan_bin, ring_name):
    ring = Ring.create(ring_name, capacity=1 << 14)
    written: list[tuple[int, int]] = []  # (gpu, start_ns) of every kernel span written
    stop = threading.Event()

    def produce() -> None:
        name = ring.intern("capture_kernel")
        corr = 0
        while not stop.is_set():
            now = time.time_ns()
            for gpu in (0, 1):
                corr += 1
                if ring.kernel(name, gpu, now, now + 2_000, 7, corr) == 0:
                    written.append((gpu, now))
            time.sleep(1 / RATE)

    try:
        with running_collector(tmp_path) as c:
            c.agent.write_key_file(tmp_path / "agent.key")
            (tmp_path / "admin.token").write_text(c.admin_token)
            (tmp_path / "admin.token").chmod(0o600)
            for gpu in (0, 1):  # the instance's two GPUs
                assert ring.fingerprint(FingerprintField.MEMORY_TOTAL, gpu, time.time_ns(), 80 << 30) == 0
            log = tmp_path / "agent.log"
            with log.open("w") as out:
                agent = subprocess.Popen(
                    [str(agent_asan_bin), "--ring", ring_name, "--collector", c.url,
                     "--key-file", str(tmp_path / "agent.key"), "--spool-dir", str(tmp_path / "spool"),
                     "--drain-interval-ms", "20", "--shutdown-timeout-s", "10"],
                    stdout=out, stderr=subprocess.STDOUT, env={"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1"},
                )  # fmt: skip
            producer = threading.Thread(target=produce, daemon=True)
            producer.start()
            instance = c.agent.agent_id.hex()
            try:
                with httpx.Client(base_url=c.url, headers={"Authorization": f"Bearer {c.read_token}"}) as api:
                    wait_for(
                        lambda: api.get(f"/v1/instances/{instance}").status_code == 200, 60, "instance known"
                    )
                done = subprocess.run(
                    [sys.executable, "-m", "kernel_insight.cli", "timeline", "capture", "--collector", c.url,
                     "--token-file", str(tmp_path / "admin.token"), "--instance", instance, "--gpu", "0",
                     "--seconds", "2", "--wait", "60"],
                    capture_output=True, text=True, timeout=120,
                )  # fmt: skip
                assert done.returncode == 0, done.stdout + done.stderr + log.read_text()[-3000:]
                assert " done: " in done.stdout
            finally:
                stop.set()
                producer.join(10)
                agent.terminate()
                assert agent.wait(30) == 0, log.read_text()[-3000:]
            text = log.read_text()
            assert "every kernel span of GPU 0 for 2 s" in text, text[-3000:]
            with TimelineClient(c.url, c.read_token) as tl:
                (req,) = tl.captures(instance, "done")
                start, end = req.window_start_ns, req.window_end_ns
                assert end - start == 2_000_000_000
                expected = sorted(t for g, t in written if g == 0 and start <= t < end)
                assert len(expected) > RATE  # the producer ran through the window
                assert req.spans == len(expected)
                stored = sorted(
                    s.start_ns
                    for s in tl.iter_spans(instance, 0, (start // 10**6) / 1000, (end // 10**6 + 1) / 1000)
                    if start <= s.start_ns < end
                )
                assert stored == expected
    finally:
        ring.close()
