"""The `ki` command line run as a user would: ring subcommands, the main job, the collector's start errors."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from kernel_insight.agent.ring import Ring, RingReader, ring_name
from kernel_insight.run import free_port

KI = [sys.executable, "-m", "kernel_insight.cli"]


def ki(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KI, *args], capture_output=True, text=True, timeout=60)


def test_ring_create_stat_unlink_from_the_shell() -> None:
    gpu = f"cli-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    created = ki("ring", "create", gpu, "--capacity", "1024")
    assert created.returncode == 0, created.stderr
    assert f"created /kernel_insight.{gpu}: 1024 slots, mode 0600" in created.stdout
    try:
        stat = ki("ring", "stat", gpu)
        assert stat.returncode == 0
        doc = json.loads(stat.stdout)
        assert (doc["capacity"], doc["label"], doc["dropped"]) == (1024, gpu, 0)
    finally:
        assert ki("ring", "unlink", gpu).returncode == 0
    missing = ki("ring", "stat", gpu)
    assert missing.returncode == 1
    assert "no such ring" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_ring_create_rejects_a_bad_capacity_with_one_line() -> None:
    out = ki("ring", "create", f"bad-{os.getpid()}", "--capacity", "1000")
    assert out.returncode == 1
    assert "capacity must be a power of two" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("label", ["../etc", "a b", ""])
def test_ring_names_are_validated(label: str) -> None:
    out = ki("ring", "stat", label)
    assert out.returncode == 1
    assert "invalid GPU label" in out.stderr


@pytest.mark.slow
def test_main_job_runs_collector_agent_and_simulator_and_data_arrives(tmp_path) -> None:
    prefix = f"runtest{os.getpid()}-"
    port = str(free_port())  # not the default 8470: other test files start `ki run` at the same time
    out = subprocess.run(
        [
            *KI,
            "run",
            "--data",
            str(tmp_path),
            "--port",
            port,
            "--seconds",
            "8",
            "--every",
            "3",
            "--ring-prefix",
            prefix,
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr
    reports = [line for line in out.stdout.splitlines() if "kernels this run" in line]
    assert reports, out.stdout
    final = reports[-1].replace(",", "").split()
    assert int(final[1]) > 0  # kernels went ring -> agent -> collector -> ClickHouse -> kql
    assert "1 healthy" in reports[-1]
    assert (tmp_path / "read.token").stat().st_mode & 0o777 == 0o600
    assert not os.path.exists(f"/dev/shm/kernel_insight.{prefix}0")


def test_main_job_reports_this_runs_kernels_and_says_so(monkeypatch) -> None:
    """The kernel counters are the collector's running totals since it started: with --data
    reused the figure began at 0 again beside the earlier runs' kernels, as "kernels stored".
    It is this run's count, labelled so, read only from samples since this run's collector
    started (an earlier run's last values may still lie within an instant query's lookback)."""
    from types import SimpleNamespace

    import kernel_insight.sdk
    from kernel_insight import run

    asked: list[str] = []

    class Kql:
        def __init__(self, *args: object, **kw: object) -> None:
            pass

        def __enter__(self) -> Kql:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def query(self, query: str) -> SimpleNamespace:
            asked.append(query)
            found = "kernel_launches_total" in query
            return SimpleNamespace(samples=[SimpleNamespace(value=1234.0, labels={})] if found else [])

    class Health(Kql):
        def snapshot(self) -> SimpleNamespace:
            return SimpleNamespace(instances=[])

    monkeypatch.setattr(kernel_insight.sdk, "KqlClient", Kql)
    monkeypatch.setattr(kernel_insight.sdk, "HealthClient", Health)
    line = run._report("http://127.0.0.1:1", "token", 12.0, 20.2).line
    assert "1,234 kernels this run" in line
    assert asked[0] == "sum(last_over_time(kernel_launches_total[21s]))"
    # Issue 33: "0 kernels this run" stood beside the previous run's busiest kernel: the busiest
    # kernel and the free memory are read from this run's samples too.
    assert asked[1] == "topk(1, sum by (kernel) (last_over_time(kernel_execution_time_seconds_total[21s])))"
    assert asked[2] == "sum(last_over_time(gpu_memory_free_bytes[21s]))"
    asked.clear()
    run._report("http://127.0.0.1:1", "token", 3600.0, 3610.0)
    assert asked[0] == "sum(last_over_time(kernel_launches_total[300s]))"  # the lookback, no further


@pytest.mark.slow
def test_main_job_stopped_by_sigterm_stops_what_it_started(tmp_path) -> None:
    """kill, timeout and service managers send SIGTERM: the job must end as on Ctrl-C, its
    collector, agent and simulator with it, not leave them running orphaned. Sent to the job's
    whole process group, as timeout(1) and a terminal's Ctrl-C do: only ki run must get it, so
    that its last report still reaches the collector."""
    prefix = f"runterm{os.getpid()}-"
    log = tmp_path / "out.txt"
    with log.open("w") as out:
        job = subprocess.Popen(
            [
                *KI,
                "run",
                "--data",
                str(tmp_path / "data"),
                "--port",
                str(free_port()),
                "--every",
                "1",
                "--ring-prefix",
                prefix,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 180
            while "kernels this run" not in log.read_text() and job.poll() is None:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            os.killpg(job.pid, signal.SIGTERM)
            assert job.wait(timeout=120) == 0, log.read_text()
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
    text = log.read_text()
    assert "ki run: stopping" in text
    last = text.split("ki run: stopping")[1]
    assert "not answering" not in last, last
    assert "kernels this run" in last, last
    assert last.strip().splitlines()[-1].startswith("ki run: summary: "), last
    agent_pid = int(re.search(r"agent \(pid (\d+)\)", text).group(1))  # type: ignore[union-attr]
    url = re.search(r"collector on (http://\S+)", text).group(1)  # type: ignore[union-attr]
    with pytest.raises(ProcessLookupError):
        os.kill(agent_pid, 0)
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=5).close()
    assert not os.path.exists(f"/dev/shm/kernel_insight.{prefix}0")
    children = subprocess.run(["pgrep", "-f", f"label-prefix {prefix}"], capture_output=True, text=True)
    assert children.stdout == "", "the simulator outlived the job"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--every", "0"], "argument --every: expected a number of seconds >= 0.1, got '0'"),
        (["--seconds", "-1"], "argument --seconds: expected a number of seconds >= 0, got '-1'"),
        (["--every", "nan"], "argument --every: expected a number of seconds >= 0.1, got 'nan'"),
        (
            ["--seconds", "inf"],
            "argument --seconds: expected a number of seconds up to 1000000000, got 'inf'",
        ),
        (["--port", "70000"], "argument --port: expected a port from 0 to 65535, got '70000'"),
    ],
)
def test_main_job_refuses_bad_numbers_with_one_line(tmp_path, args: list[str], message: str) -> None:
    out = ki("run", "--data", str(tmp_path), *args)
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1] == f"ki run: error: {message}"
    assert not (tmp_path / "logs").exists()  # refused before anything started


@pytest.mark.slow
def test_main_job_says_why_its_collector_did_not_start_in_one_line(tmp_path) -> None:
    """Issue 33: ``ki run --port <busy>`` (or a second ``ki run`` on the same --data) ended in a
    traceback, "the collector did not start; see the collector log", the reason only in the log."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [*KI, "run", "--data", str(tmp_path), "--port", str(port), "--seconds", "5",
             "--ring-prefix", f"runport{os.getpid()}-"],
            capture_output=True,
            text=True,
            timeout=240,
        )  # fmt: skip
    assert out.returncode == 1, out.stdout
    assert "Traceback" not in out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith("ki run: the collector did not start: ki collector: ")
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in line
    assert line.endswith(f"; see {tmp_path / 'logs' / 'collector.log'}")


def test_main_job_reads_its_losses_from_the_collectors_own_counters() -> None:
    """ki run's reports and summary count refused batches, their failed records, dead-lettered
    batches and dropped records from /metrics (docs/metrics.md); retried and resent ones are no loss."""
    from kernel_insight.run import Losses, read_losses

    text = "\n".join(
        [
            "# HELP ki_collector_ingest_batches_total Agent batches by outcome",
            'ki_collector_ingest_batches_total{outcome="stored"} 120.0',
            'ki_collector_ingest_batches_total{outcome="failed"} 2.0',
            'ki_collector_ingest_batches_total{outcome="busy"} 5.0',
            'ki_collector_ingest_batches_total{outcome="names_unknown"} 1.0',
            'ki_collector_ingest_records_total{outcome="stored"} 90000.0',
            'ki_collector_ingest_records_total{outcome="failed"} 611.0',
            'ki_collector_records_dropped_total{reason="timestamp_out_of_range"} 3.0',
            'ki_collector_records_dropped_total{reason="name_unknown"} 0.0',
            'ki_agent_batches_dead_lettered_total{agent="a1"} 2.0',
            'ki_agent_ring_dropped_total{agent="a1"} 7.0',
            'ki_agent_ring_lost_total{agent="a1"} 0.0',
            'ki_agent_batches_sent_total{agent="a1"} 122.0',
        ]
    )
    lost = read_losses(text)
    assert lost == Losses(refused_batches=2, failed_records=611, dead_lettered=2, dropped_records=10)
    assert str(lost) == "2 batches refused (611 records failed), 2 dead-lettered, 10 records dropped"
    assert not read_losses('ki_collector_ingest_batches_total{outcome="stored"} 5.0')


def test_main_job_names_an_unusable_data_directory(tmp_path) -> None:
    (tmp_path / "file").write_text("")
    out = ki("run", "--data", str(tmp_path / "file" / "data"), "--seconds", "1")
    assert out.returncode == 1
    assert out.stderr.startswith(f"ki run: cannot use the data directory {tmp_path / 'file' / 'data'}: ")
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_main_job_stops_when_its_agent_cannot_drain_the_ring_and_leaves_that_ring_alone(tmp_path) -> None:
    """A second ``ki run`` on the same ring: its agent refuses (the ring has a consumer), so the run
    must say so and stop, not report an agent it does not have and then unlink the other's ring."""
    prefix = f"runbusy{os.getpid()}-"
    ring = ring_name(f"{prefix}0")
    with Ring.create(ring, capacity=1024, producer=False), RingReader.open(ring):
        try:
            out = subprocess.run(
                [
                    *KI,
                    "run",
                    "--data",
                    str(tmp_path),
                    "--port",
                    str(free_port()),
                    "--seconds",
                    "5",
                    "--ring-prefix",
                    prefix,
                ],
                capture_output=True,
                text=True,
                timeout=240,
            )
            assert out.returncode == 1, out.stdout
            assert "draining ring" not in out.stdout
            assert f"already has a consumer (pid {os.getpid()})" in out.stderr
            assert "--ring-prefix" in out.stderr
            assert os.path.exists(f"/dev/shm{ring}")  # the ring of whoever drains it stays
        finally:
            Ring.unlink(ring)


def test_collector_refuses_a_port_out_of_range_with_one_line() -> None:
    out = ki("collector", "--port", "99999")
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1] == (
        "ki collector: error: argument --port: expected a port from 0 to 65535, got '99999'"
    )


def test_collector_names_a_busy_port_and_an_unusable_store_in_one_line(tmp_path) -> None:
    (tmp_path / "file").write_text("")
    bad_store = ki("collector", "--port", "0", "--store", str(tmp_path / "file" / "store"))
    assert bad_store.returncode == 2
    assert bad_store.stderr.startswith(f"ki collector: cannot open the store {tmp_path / 'file' / 'store'}: ")
    assert "Traceback" not in bad_store.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = subprocess.run(
            [*KI, "collector", "--port", str(port), "--store", str(tmp_path / "store")],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert busy.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in busy.stderr
    assert "Traceback" not in busy.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval", "0"], "--interval: expected a number of seconds > 0, got '0'"),
        (["--interval", "nan"], "--interval: expected a number of seconds > 0, got 'nan'"),
        (["--interval", "inf"], "--interval: expected a number of seconds up to 1000000000, got 'inf'"),
        (["--stats-interval", "-5"], "--stats-interval: expected a number of seconds > 0, got '-5'"),
        (["--rules-resend-delay", "-1"], "--rules-resend-delay: expected a number of seconds >= 0, got '-1'"),
        (
            ["--rules-resend-delay", "soon"],
            "--rules-resend-delay: expected a number of seconds >= 0, got 'soon'",
        ),
        (["--query-cache-mb", "-1"], "--query-cache-mb: expected a number of MiB >= 0, got '-1'"),
    ],
)
def test_collector_refuses_periods_that_would_spin_and_negative_sizes(tmp_path, args, message) -> None:
    """--interval 0 was taken and the snapshot thread rebuilt without pause (18 s of CPU in 25 s).
    The periods are read by the argparse type ki run's --seconds and --every use (server.at_least),
    so both commands word a bad number alike, as they do a bad --port."""
    out = subprocess.run(
        [*KI, "collector", "--port", "0", "--store", str(tmp_path / "store"), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1] == f"ki collector: error: argument {message}"
    assert not (tmp_path / "store").exists()  # refused before the store was opened


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--keep-alive", "0"], "--keep-alive: expected a number of seconds > 0, got '0'"),
        (["--header-timeout", "nan"], "--header-timeout: expected a number of seconds > 0, got 'nan'"),
        (["--body-timeout", "-1"], "--body-timeout: expected a number of seconds > 0, got '-1'"),
        (
            ["--max-connections", "0"],
            "--max-connections: expected a whole number of connections >= 1, got '0'",
        ),
        (["--stale-after", "0"], "--stale-after: expected a number of seconds > 0, got '0'"),
        (["--max-data-age", "nan"], "--max-data-age: expected a number of seconds > 0, got 'nan'"),
        (["--query-timeout", "0"], "--query-timeout: expected a number of seconds > 0, got '0'"),
        (
            ["--query-max-samples", "0"],
            "--query-max-samples: expected a whole number of samples >= 1, got '0'",
        ),
        (["--sync-keep-us", "-1"], "--sync-keep-us: expected a number of microseconds >= 0, got '-1'"),
        (["--sync-sample-every", "0"], "--sync-sample-every: expected a whole number >= 1, got '0'"),
        (["--histogram-base-mb", "-1"], "--histogram-base-mb: expected a number of MiB >= 0, got '-1'"),
        (["--max-labels", "-1"], "--max-labels: expected a whole number of labels >= 0, got '-1'"),
        (["--max-name-bytes", "x"], "--max-name-bytes: expected a whole number of bytes >= 0, got 'x'"),
        (["--max-value-bytes", "-2"], "--max-value-bytes: expected a whole number of bytes >= 0, got '-2'"),
        # past these the values broke things: a dead snapshot thread, a 500 for every query,
        # tracebacks converting infinity to bytes and nanoseconds
        (["--interval", "1e308"], "--interval: expected a number of seconds up to 1000000000, got '1e308'"),
        (
            ["--query-timeout", "1e308"],
            "--query-timeout: expected a number of seconds up to 1000000000, got '1e308'",
        ),
        (
            ["--query-cache-mb", "1e308"],
            "--query-cache-mb: expected a number of MiB up to 1000000000, got '1e308'",
        ),
        (
            ["--histogram-base-mb", "1e308"],
            "--histogram-base-mb: expected a number of MiB up to 1099511627776, got '1e308'",
        ),
        (
            ["--sync-keep-us", "1e308"],
            "--sync-keep-us: expected a number of microseconds up to 1e+15, got '1e308'",
        ),
    ],
)
def test_every_number_flag_of_the_collector_is_refused_alike_before_the_store_opens(
    tmp_path, capsys, args, message
) -> None:
    """Each of these was checked after parsing in words of its own (``keep_alive_s must be
    positive, not 0.0``; ``--query-timeout and --query-max-samples must be positive``), several only
    after the store was opened; ``--max-labels -1`` was taken and refused every remote-written
    series, ``--sync-keep-us 1e308`` was a traceback. Now each has an argparse type, so the
    refusal comes from parsing, before the handler opens anything."""
    from kernel_insight.cli import build_parser

    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["collector", "--port", "0", "--store", str(tmp_path / "store"), *args])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"ki collector: error: argument {message}"


def test_collector_refuses_stale_after_above_max_data_age_before_the_store_opens(tmp_path, capsys) -> None:
    """The one check of two flags together: it came after the store was opened."""
    from kernel_insight.cli import main

    store = tmp_path / "store"
    assert main(["collector", "--port", "0", "--store", str(store), "--stale-after", "400"]) == 2
    assert capsys.readouterr().err == (
        "ki collector: --stale-after (400 s) must not be above --max-data-age (300 s)\n"
    )
    assert not store.exists()


def test_the_collector_number_flags_keep_their_values_and_their_zeros() -> None:
    """The types refuse only what was refused (or broke) before: 0 still turns a limit off or keeps
    every sync, and the defaults are unchanged."""
    from kernel_insight.cli import build_parser

    zeros = ["--max-labels", "0", "--max-name-bytes", "0", "--max-value-bytes", "0", "--sync-keep-us", "0"]
    args = build_parser().parse_args(
        ["collector", *zeros, "--histogram-base-mb", "0", "--sync-sample-every", "1", "--keep-alive", "0.5"]
    )
    assert (args.max_labels, args.max_name_bytes, args.max_value_bytes) == (0, 0, 0)
    assert (args.sync_keep_us, args.histogram_base_mb, args.sync_sample_every) == (0, 0, 1)
    assert args.keep_alive == 0.5
    assert isinstance(args.max_labels, int)
    assert isinstance(args.sync_sample_every, int)
    defaults = build_parser().parse_args(["collector"])
    assert (defaults.stale_after, defaults.max_data_age, defaults.query_max_samples) == (60, 300, 50_000_000)
    assert (defaults.max_labels, defaults.sync_keep_us, defaults.histogram_base_mb) == (30, 50, 256)


def test_a_path_that_cannot_be_used_is_one_line_for_every_command(tmp_path) -> None:
    """The dispatcher words OSErrors no command caught itself: ki schema --write into a file."""
    (tmp_path / "file").write_text("")
    out = ki("schema", "--write", str(tmp_path / "file" / "deploy"))
    assert out.returncode == 1
    assert out.stderr == f"ki schema: [Errno 20] Not a directory: '{tmp_path / 'file' / 'deploy'}'\n"
