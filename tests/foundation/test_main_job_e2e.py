"""The main job as a new user meets it: ``ki run`` with the instance labels the docs' SDK and
routing examples need, every documented command run as written against it (only the URL,
token and instance id substituted), then a run that passes every periodic event of the
simulator (``--compress``) with nothing refused, failed, dropped or dead-lettered (issue 33)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from docs_examples import DOCS, sdk_examples
from fastapi import FastAPI
from loopback import running_server

from kernel_insight.run import free_port

pytestmark = pytest.mark.slow

KI = [sys.executable, "-m", "kernel_insight.cli"]
ROOT = DOCS.parent
#: The summary's words when nothing was lost (kernel_insight/run.py, Losses).
NOTHING_LOST = "0 batches refused (0 records failed), 0 dead-lettered, 0 records dropped"


@contextlib.contextmanager
def _ki_run(out: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    with out.open("w") as f:
        job = subprocess.Popen([*KI, "run", *args], stdout=f, stderr=subprocess.STDOUT, text=True)
    try:
        yield job
    finally:
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)
            try:
                job.wait(60)
            except subprocess.TimeoutExpired:
                job.kill()
                job.wait()


def _wait(what: str, timeout: float, check: Callable[[], object]) -> object:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)


def _bash(line: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", line],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": path, **(env or {})},
    )


def _kql(url: str, token: str, query: str) -> list[dict[str, object]]:
    r = httpx.get(
        f"{url}/api/v1/query", params={"query": query}, headers={"Authorization": f"Bearer {token}"}
    )
    r.raise_for_status()
    result: list[dict[str, object]] = r.json()["data"]["result"]
    return result


def _finished(job: subprocess.Popen[str], out: Path, seconds: float, started: float) -> str:
    """The job's output once it ended by itself, promptly, with its summary."""
    assert job.wait(seconds + 120) == 0, out.read_text()
    took = time.monotonic() - started
    text = out.read_text()
    assert "Traceback" not in text, text
    # --seconds counts from the start, start-up included: the job ends within seconds of it
    # (a bound for load, not a figure: 4 s over at rest).
    assert took < seconds + 45, (took, text)
    summary = text.strip().splitlines()[-1]
    assert summary.startswith("ki run: summary: "), text
    return summary


def test_the_main_job_runs_every_documented_command_and_every_simulated_event_and_loses_nothing(tmp_path):
    llm = FastAPI()

    @llm.post("/v1/completions")
    async def complete(body: dict) -> dict:  # the stand-in inference server the routing examples call
        return {"text": "hello", "max_tokens": body.get("max_tokens")}

    data, port = tmp_path / "data", free_port()
    prefix = f"e2e{os.getpid()}-"
    with running_server(llm) as endpoint:
        # 1. A quiet GPU (no simulated Xid, which makes it unhealthy for 5 minutes) serving the
        # docs' model at the stand-in's endpoint: every documented command, as written.
        out = tmp_path / "run1.txt"
        started = time.monotonic()
        seconds = 75
        with _ki_run(out, "--data", str(data), "--port", str(port), "--seconds", str(seconds), "--every", "5",
                     "--ring-prefix", prefix, "--error-rate", "0",
                     "--label", "model=llama-70b", "--label", f"endpoint={endpoint}") as job:  # fmt: skip
            _wait(
                "a healthy instance with memory data",
                150,
                lambda: re.search(r"free .* 1 healthy", out.read_text()),
            )
            text = out.read_text()
            url = re.search(r"collector on (http://\S+)", text).group(1)  # type: ignore[union-attr]
            instance = re.search(r"instance \S+, id ([0-9a-f]{32})", text).group(1)  # type: ignore[union-attr]
            assert url == f"http://127.0.0.1:{port}"
            assert "labels endpoint=" in text
            assert "model=llama-70b" in text
            token = (data / "read.token").read_text().strip()

            # What ki run printed to paste into another shell.
            printed = [line.strip() for line in text.splitlines() if line.startswith(("  curl ", "  ki "))]
            assert len(printed) == 4, text
            for line in printed:
                done = _bash(line, tmp_path)
                assert done.returncode == 0, (line, done.stderr)
                if line.startswith("curl"):
                    assert '"status":"error"' not in done.stdout.replace(" ", ""), (line, done.stdout)
            assert (tmp_path / "trace.json").stat().st_size > 1000  # spans, not an empty trace

            # The README's and docs' commands: the collector's default URL is ki run's here.
            def as_here(line: str) -> str:
                return line.replace("http://127.0.0.1:8470", url).replace("node-1", instance)

            readme = (ROOT / "README.md").read_text()
            assert "curl http://127.0.0.1:8470/metrics" in readme
            metrics = _bash(as_here("curl -fsS http://127.0.0.1:8470/metrics"), tmp_path)
            assert "ki_collector_ingest_batches_total" in metrics.stdout
            api = (DOCS / "api.md").read_text()
            export = re.search(
                r"`(ki timeline export --collector http://127\.0\.0\.1:8470 [^`]*)`", api
            ).group(1)  # type: ignore[union-attr]
            done = _bash(
                as_here(export).replace("trace.json", "api-trace.json"), tmp_path, {"KI_TOKEN": token}
            )
            assert done.returncode == 0, (export, done.stderr)
            assert "open it in https://ui.perfetto.dev" in done.stdout
            rules = (DOCS / "rules.md").read_text()
            alerts = re.search(r"^(curl http://127\.0\.0\.1:8470/api/v1/alerts)", rules, re.M).group(1)  # type: ignore[union-attr]
            done = _bash(as_here(alerts) + f' -fsS -H "Authorization: Bearer {token}"', tmp_path)
            assert '"status":"success"' in done.stdout.replace(" ", ""), done.stdout
            article = re.search(r"The article's rule, as a file:\n\n```yaml\n(.*?)```", rules, re.S).group(1)  # type: ignore[union-attr]
            (tmp_path / "article.yml").write_text(article)
            assert _bash("ki rules check article.yml", tmp_path).returncode == 0

            # The SDK's health, selection and routing examples (docs/api.md, docs/routing.md).
            examples = sdk_examples()
            assert [n for n, _ in examples if n.startswith("routing.md")], (
                "docs/routing.md has no SDK example"
            )
            for name, code in examples:
                printed_out = io.StringIO()
                with contextlib.redirect_stdout(printed_out):
                    exec(compile(code.replace("http://collector:8470", url).replace("ki_...", token), name, "exec"),
                         {"__name__": "__docs__"})  # fmt: skip
                assert "hello" in printed_out.getvalue(), (name, printed_out.getvalue())
            summary = _finished(job, out, seconds, started)
        assert summary.endswith(NOTHING_LOST), summary
        assert "1 instance(s), 1 healthy" in summary

        # 2. Every periodic event of the simulator, 30 times as often, on the same data: the
        # reports start again from this run's kernels and nothing is lost.
        out = tmp_path / "run2.txt"
        started = time.monotonic()
        seconds = 80
        with _ki_run(out, "--data", str(data), "--port", str(port), "--seconds", str(seconds), "--every", "10",
                     "--ring-prefix", prefix, "--compress", "30") as job:  # fmt: skip
            _wait("the collector", 150, lambda: "kernels this run" in out.read_text())
            seen: dict[str, bool] = {}
            queries = {
                "fingerprint": "count(gpu_memory_total_bytes)",
                "errors": 'sum(kernel_errors_total{kind=~"xid|nccl_timeout"}) > 0',
                "oom": 'sum(kernel_errors_total{kind="oom"}) > 0',
                "failed allocations": "sum(gpu_memory_operation_failures_total) > 0",
                "histograms": "histogram_count(sum(kernel_duration_seconds)) > 0",
            }

            def all_seen() -> bool:
                for what, q in queries.items():
                    seen[what] = seen.get(what) or bool(_kql(url, token, q))
                snap = httpx.get(
                    f"{url}/v1/health/snapshot", headers={"Authorization": f"Bearer {token}"}
                ).json()
                names = [i["fingerprint"]["gpu_model"] for i in snap["instances"]]
                seen["fingerprint"] = seen["fingerprint"] and any("(simulated)" in n for n in names)
                return all(seen.values())

            _wait(f"every periodic event ({seen})", seconds + 60, all_seen)
            summary = _finished(job, out, seconds, started)
        text = out.read_text()
        assert summary.endswith(NOTHING_LOST), summary
        assert "LOST" not in text
        # an unhealthy instance says why (the simulated Xid errors, or the OOM episode's errors)
        assert re.search(r"0 healthy \((\d+ xid error|\d+ errors in the last 5 minutes)", text), text
        first = next(line for line in text.splitlines() if "kernels this run" in line)
        assert "busiest" not in first or int(first.split()[1].replace(",", "")) > 0, first
    assert not Path(f"/dev/shm/kernel_insight.{prefix}0").exists()
