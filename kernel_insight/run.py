"""``ki run``: the main job, as the README's run command starts it.

The whole pipeline on one machine, on loopback: a collector on the embedded
store, an enrolled native agent draining a GPU ring, and the simulator writing
realistic (``simulated="true"``) records into that ring; every few seconds it
asks the collector, through the SDK, what has arrived.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kernel_insight.collector.flags import at_least, port_number
from kernel_insight.server import DEFAULT_PORT

__all__ = ["Losses", "add_commands", "free_port", "read_losses"]

_KI = [sys.executable, "-m", "kernel_insight.cli"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the system's pick for port 0). Another process may take it
    before the caller binds it: a server that can should listen on port 0 and say its port instead."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port(requested: int) -> int:
    """``--port``, else the collector's default (what the README's and every command's defaults
    name) when it is free, else any free port."""
    if requested:
        return requested
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", DEFAULT_PORT))
        except OSError:
            return free_port()
    return DEFAULT_PORT


def _shipped_rules() -> Path | None:
    """deploy/rules of a source checkout (what ``make run`` uses), or None when installed without it."""
    rules = Path(__file__).resolve().parent.parent / "deploy" / "rules"
    return rules if any(rules.glob("*.yml")) else None


@dataclass(frozen=True)
class _Enrolment:
    key_file: Path
    token: str
    name: str  # the enrolment name, for people
    instance: str  # the instance id the API, the UI and ki timeline use (the agent id)


def _enrol(data: Path) -> _Enrolment:
    """The agent's key file and a read token, made once per data directory and reused."""
    from kernel_insight.api.tokens import TokenStore
    from kernel_insight.collector.keys import KeyStore, read_key_file

    keys = KeyStore(data / "keys.json")
    key_file = data / "agent.key"
    if not key_file.exists():
        keys.add_agent(f"{socket.gethostname()}/gpu0").write_key_file(key_file)
    token_file = data / "read.token"
    if not token_file.exists():
        token = TokenStore(data / "tokens.json").create("ki run", ["read"]).token
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
    instance = read_key_file(key_file).agent_id.hex()
    name = next((a.name for a in keys.agents() if a.agent_id == instance), "?")
    return _Enrolment(key_file, token_file.read_text().strip(), name, instance)


@contextlib.contextmanager
def _process(cmd: list[str], log: Path, **kw: object) -> Iterator[subprocess.Popen[str]]:
    """A child that is asked to stop (SIGTERM, then SIGKILL) however the job ends.

    In a process group of its own: Ctrl-C (the terminal signals its whole foreground group) and
    timeout(1) (its child's group) reach only ki run, which stops the agent first and reports
    once more before the collector goes; in ki run's group the collector died with it and the
    last report read 'collector not answering'."""
    with log.open("a") as out:
        proc = subprocess.Popen(  # type: ignore[call-overload]
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=kw.pop("stdout", out),
            stderr=out,
            text=True,
            process_group=0,
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


class _NotStarted(Exception):
    """A child that did not start; the message says why (its own words) and where its log is."""


def _last_words(log: Path, since: int) -> str:
    """The reason a child gave in its log after byte ``since``: its last line of its own
    (``ki collector: ...``), else its last line."""
    with log.open("rb") as f:
        f.seek(since)
        lines = [x for x in f.read().decode(errors="replace").splitlines() if x.strip()]
    own = [x for x in lines if x.startswith("ki ")]
    return (own or lines or ["(nothing in its log)"])[-1].strip()


def _wait_listening(proc: subprocess.Popen[str], timeout: float, log: Path, since: int) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("ki: listening on "):
            return line.split()[-1]
        if not line and proc.poll() is not None:
            break
    if proc.poll() is None:
        raise _NotStarted(f"the collector did not listen within {timeout:.0f} s; see {log}")
    words = _last_words(log, since)
    hint = " (another ki run on this --data?)" if "lock" in words.lower() else ""
    raise _NotStarted(f"the collector did not start: {words}{hint}; see {log}")


def _wait_consumer(agent: subprocess.Popen[str], ring: str, timeout: float) -> bool:
    """Whether the agent became the ring's consumer: a ring that exists is not enough, since
    another run's agent may drain it (ours then refuses to start, and the ring is not ours)."""
    from kernel_insight.agent.ring import Ring, RingError

    deadline = time.monotonic() + timeout
    while agent.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(RingError), Ring.attach(ring, producer=False) as r:
            if r.stats()["consumer_pid"] == agent.pid:
                return True
        time.sleep(0.05)
    return False


def _agent_failure(agent: subprocess.Popen[str], log: Path, ring: str) -> str:
    """One line on why the agent is not draining the ring, with the agent's own last words."""
    if agent.poll() is None:
        return f"the agent did not attach to ring {ring}; see {log}"
    lines = log.read_text(errors="replace").strip().splitlines()
    said = f": {lines[-1]}" if lines else ""
    return f"the agent exited ({agent.returncode}){said} (another ki run? give it --ring-prefix); see {log}"


#: Past this, an instant query's lookback (5 m) no longer reaches an earlier run's samples.
_LOOKBACK_S = 300

#: Batch outcomes that are refusals (docs/metrics.md, ki_collector_ingest_batches_total): the
#: batch is not stored, and unless its agent sends it again it is lost. ``busy`` and
#: ``unavailable`` (503) are retried, ``duplicate`` was stored before, ``names_unknown`` is
#: answered by the agent sending its names and the batch again.
_REFUSED = ("rejected", "unauthenticated", "forbidden", "failed")

#: Records lost on their way, from the agents' counters (each agent's, exported on /metrics).
_AGENT_DROPS = (
    "ki_agent_ring_dropped_total",
    "ki_agent_ring_lost_total",
    "ki_agent_spool_dropped_records_total",
)


@dataclass(frozen=True)
class Losses:
    """What the pipeline lost, from the collector's and its agents' own counters (``/metrics``)."""

    refused_batches: int = 0  # agent batches the collector refused (not stored)
    failed_records: int = 0  # the records in them
    dead_lettered: int = 0  # refused batches the agents gave up on (their dead-letter files)
    dropped_records: int = 0  # records left out at derivation, or dropped by a ring or a spool

    def __bool__(self) -> bool:
        return any(dataclasses.astuple(self))

    def __str__(self) -> str:
        return (
            f"{self.refused_batches:,} batches refused ({self.failed_records:,} records failed), "
            f"{self.dead_lettered:,} dead-lettered, {self.dropped_records:,} records dropped"
        )


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def read_losses(exposition: str) -> Losses:
    """:class:`Losses` from the collector's ``/metrics`` text (docs/metrics.md)."""
    totals: dict[str, float] = {}
    for line in exposition.splitlines():
        m = _SAMPLE.match(line)
        if m is None:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name in ("ki_collector_ingest_batches_total", "ki_collector_ingest_records_total"):
            outcome = re.search(r'outcome="([^"]*)"', labels)
            if outcome is None or outcome.group(1) not in _REFUSED:
                continue
        totals[name] = totals.get(name, 0.0) + value
    return Losses(
        refused_batches=int(totals.get("ki_collector_ingest_batches_total", 0)),
        failed_records=int(totals.get("ki_collector_ingest_records_total", 0)),
        dead_lettered=int(totals.get("ki_agent_batches_dead_lettered_total", 0)),
        dropped_records=int(
            totals.get("ki_collector_records_dropped_total", 0) + sum(totals.get(n, 0) for n in _AGENT_DROPS)
        ),
    )


def _losses(url: str) -> Losses | None:
    import httpx

    try:
        answer = httpx.get(f"{url}/metrics", timeout=10)
        answer.raise_for_status()
    except httpx.HTTPError:
        return None
    return read_losses(answer.text)


@dataclass
class _Report:
    line: str
    kernels: int | None = None
    instances: int | None = None
    healthy: int | None = None
    losses: Losses | None = None


def _report(url: str, token: str, elapsed: float, collector_s: float) -> _Report:
    """What has arrived, ``elapsed`` seconds into the run, ``collector_s`` after this run's
    collector started, and what was lost on the way."""
    from kernel_insight.sdk import HealthClient, KernelInsightError, KqlClient

    parts = [f"{elapsed:5.0f}s"]
    report = _Report("")
    # The kernel counters are derived by the collector from zero when it starts (docs/metrics.md),
    # so their sum is this run's count, not what the store holds: with --data reused it began at
    # 0 again beside the earlier runs' kernels, under the words "kernels stored". Samples from
    # before this collector started (an earlier run's last values, still inside the lookback)
    # are kept out by the window, for the busiest kernel and the free memory as well.
    window = f"[{min(_LOOKBACK_S, math.ceil(collector_s))}s]"
    try:
        with KqlClient(url, token, retries=0) as kql:
            spans = kql.query(f"sum(last_over_time(kernel_launches_total{window}))").samples
            report.kernels = int(spans[0].value) if spans else 0
            parts.append(f"{report.kernels:>9,} kernels this run")
            top = kql.query(
                f"topk(1, sum by (kernel) (last_over_time(kernel_execution_time_seconds_total{window})))"
            ).samples
            if top:
                name = top[0].labels.get("kernel", "?")
                parts.append(f"busiest: {name if len(name) <= 40 else name[:37] + '...'}")
            free = kql.query(f"sum(last_over_time(gpu_memory_free_bytes{window}))").samples
            if free:
                parts.append(f"free {free[0].value / 2**30:.1f} GiB")
        with HealthClient(url, token, ttl=0) as health:
            insts = health.snapshot().instances
            report.instances, report.healthy = len(insts), sum(1 for i in insts if i.healthy)
            why = sorted({r for i in insts if not i.healthy for r in i.reasons})
            parts.append(
                f"{len(insts)} instance(s), {report.healthy} healthy"
                + (f" ({'; '.join(why)})" if why else "")
            )
    except KernelInsightError as exc:
        parts.append(f"(collector not answering yet: {exc})")
    report.losses = _losses(url)
    if report.losses:
        parts.append(f"LOST: {report.losses} (see the logs)")
    elif report.losses is not None:
        parts.append("nothing lost")
    report.line = "  ".join(parts)
    return report


def _summary(report: _Report, seconds: float) -> str:
    """The run's last line: how long, what arrived, what was lost."""
    kernels = "?" if report.kernels is None else f"{report.kernels:,}"
    healthy = "?" if report.instances is None else f"{report.instances} instance(s), {report.healthy} healthy"
    lost = "losses unknown (collector not answering)" if report.losses is None else str(report.losses)
    return f"ki run: summary: {seconds:.0f} s, {kernels} kernels stored, {healthy}; {lost}"


def _settle(url: str, timeout: float, least: float = 2.0) -> None:
    """Wait until the collector has stored what the stopped agent sent last and a query sees it:
    at least ``least`` seconds, then until its row counters stay still for a second (at most
    ``timeout``)."""
    import httpx

    start = time.monotonic()
    last = None
    while time.monotonic() < start + timeout:
        try:
            text = httpx.get(f"{url}/metrics", timeout=5).text
        except httpx.HTTPError:
            return
        now = [x for x in text.splitlines() if x.startswith(("ki_collector_ingest_", "ki_collector_rows"))]
        if now == last and time.monotonic() >= start + least:
            return
        last = now
        time.sleep(1.0)


def _stop_as_on_ctrl_c(signum: int, frame: object) -> None:
    """SIGTERM (kill, timeout, a service manager) and SIGHUP (the terminal closed) stop the job as
    Ctrl-C does: without it Python dies at once and the collector, agent and simulator it
    started (in process groups of their own) run on, orphaned."""
    raise KeyboardInterrupt


def _labels(values: list[str] | None) -> dict[str, str]:
    from kernel_insight.collector.keys import parse_label_args

    labels = parse_label_args(values)
    bad = [f"{k}={v}" for k, v in labels.items() if "," in v]
    if bad:
        raise ValueError(f"--label {bad[0]}: a value must not hold a comma")
    return labels


def _run(args: argparse.Namespace) -> int:
    t_start = time.monotonic()
    deadline = t_start + args.seconds if args.seconds else math.inf
    signal.signal(signal.SIGTERM, _stop_as_on_ctrl_c)
    signal.signal(signal.SIGHUP, _stop_as_on_ctrl_c)
    try:
        labels = _labels(args.label)
    except ValueError as exc:
        print(f"ki run: {exc}", file=sys.stderr)
        return 2
    data = Path(args.data).resolve()
    logs = data / "logs"
    try:
        logs.mkdir(parents=True, exist_ok=True)
        enrolment = _enrol(data)
    except OSError as exc:
        print(f"ki run: cannot use the data directory {data}: {exc}", file=sys.stderr)
        return 1
    token, token_file = enrolment.token, data / "read.token"
    port = _port(args.port)
    ring = f"/kernel_insight.{args.ring_prefix}0"
    print(f"ki run: data in {data}; logs in {logs}")
    collector_cmd = [*_KI, "collector", "--store", str(data), "--port", str(port)]
    collector_cmd += [
        "--keys",
        str(data / "keys.json"),
        "--tokens",
        str(data / "tokens.json"),
        "--interval",
        "2",
    ]
    rules = _shipped_rules()
    if rules is not None:
        collector_cmd += ["--rules", str(rules / "*.yml")]
    collector_t0 = time.monotonic()
    collector_log = logs / "collector.log"
    since = collector_log.stat().st_size if collector_log.exists() else 0
    last: _Report | None = None
    with _process(collector_cmd, collector_log, stdout=subprocess.PIPE) as collector:
        try:
            url = _wait_listening(collector, 120, collector_log, since)
        except _NotStarted as exc:
            print(f"ki run: {exc}", file=sys.stderr)
            return 1
        print(f"ki run: collector on {url} (embedded ClickHouse in {data})")
        agent_cmd = [*_KI, "agent", "--ring", ring, "--ring-create", "--collector", url]
        agent_cmd += ["--key-file", str(enrolment.key_file), "--spool-dir", str(data / "spool")]
        agent_cmd += ["--log-level", "warn"]
        if labels:
            agent_cmd += ["--labels", ",".join(f"{k}={v}" for k, v in labels.items())]
        with _process(agent_cmd, logs / "agent.log") as agent:
            if not _wait_consumer(agent, ring, 60):
                print(f"ki run: {_agent_failure(agent, logs / 'agent.log', ring)}", file=sys.stderr)
                return 1
            print(f"ki run: agent (pid {agent.pid}) draining ring {ring} every 100 ms")
            shown = ", ".join(f"{k}={v}" for k, v in labels.items())
            print(
                f"ki run: instance {enrolment.name}, id {enrolment.instance}"
                + (f", labels {shown}" if shown else "")
                + " (the id is what the API, the UI and ki timeline take)"
            )
            sim_cmd = [*_KI, "probe", "simulate", "--gpus", "1", "--label-prefix", args.ring_prefix]
            if args.compress != 1:
                sim_cmd += ["--compress", str(args.compress)]
            if args.error_rate is not None:
                sim_cmd += ["--error-rate", str(args.error_rate)]
            if args.seconds:
                sim_cmd += ["--seconds", str(max(1.0, deadline - time.monotonic()))]
            with _process(sim_cmd, logs / "simulate.log") as sim:
                print(
                    'ki run: simulator writing kernels, NCCL, memory and NVML-like samples (simulated="true")'
                    + (f", rare events {args.compress:g} times as often" if args.compress != 1 else "")
                )
                auth = f'-H "Authorization: Bearer $(cat {token_file})"'
                print(f"ki run: read token in {token_file}; from another shell:")
                print(f"  curl {auth} {url}/v1/health/snapshot")
                print(
                    f"  curl -G {auth} {url}/api/v1/query --data-urlencode "
                    "'query=sum(rate(kernel_launches_total[1m]))'"
                )
                print(
                    f"  ki timeline export --collector {url} --token-file {token_file} "
                    f"--instance {enrolment.instance} --gpu 0 --from now-10s --to now -o trace.json"
                )
                print(f"ki run: web UI at {url}/ (sign in with that token; docs/ui.md)")
                if rules is not None:
                    print(f"ki run: alert rules from {rules} (docs/rules.md); pending and firing alerts:")
                    print(f"  curl {auth} {url}/api/v1/alerts")
                    print(
                        f"  (every rule with its state and last evaluation: the same with {url}/api/v1/rules)"
                    )
                t0 = time.monotonic()
                try:
                    # The simulator stops itself at the deadline (its --seconds), a moment after it
                    # for its own start-up: waited for, so that what it wrote is in the last report.
                    while sim.poll() is None:
                        time.sleep(max(0.2, min(args.every, deadline - time.monotonic())))
                        now = time.monotonic()
                        last = _report(url, token, now - t0, now - collector_t0)
                        print(last.line, flush=True)
                except KeyboardInterrupt:
                    print("\nki run: stopping")
            # The agent flushes what is in the ring on SIGTERM; the collector stores it before
            # the last report.
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=30)
        _settle(url, 10)
        now = time.monotonic()
        last = _report(url, token, now - t0, now - collector_t0)
        print(last.line, flush=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(Path("/dev/shm", ring[1:]))
    print(_summary(last, time.monotonic() - t_start), flush=True)
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="the main job: collector + agent + simulated GPU, on this machine")
    p.add_argument("--data", default="./ki-data", help="data directory (default ./ki-data)")
    p.add_argument(
        "--port",
        type=port_number,
        default=0,
        help=f"collector port (default {DEFAULT_PORT}, the other commands' default, when free; else any free one)",
    )
    p.add_argument(
        "--seconds",
        type=at_least(0),
        default=0,
        help="stop this long after starting, start-up included (default 0: until Ctrl-C)",
    )
    p.add_argument(
        "--label",
        action="append",
        metavar="NAME=VALUE",
        help="a label of the instance (model, endpoint, host, rack, ...: what the SDK selects and routes "
        "by, docs/routing.md); repeatable",
    )
    p.add_argument(
        "--error-rate",
        type=at_least(0),
        default=None,
        metavar="PER_S",
        help="the simulated GPU's random Xid and NCCL errors per second (default 1/600); an Xid makes the "
        "instance unhealthy for 5 minutes, so 0 keeps it routable (to try the SDK's examples)",
    )
    p.add_argument(
        "--compress",
        type=at_least(1),
        default=1.0,
        metavar="FACTOR",
        help="the simulator's rare events (fingerprints, errors, OOM episodes, checkpoints) FACTOR times "
        "as often, to see them all in minutes (default 1; docs/probes.md)",
    )
    p.add_argument("--every", type=at_least(0.1), default=5.0, help="seconds between reports (default 5)")
    p.add_argument(
        "--ring-prefix", default="run-", help="ring of the simulated GPU: /kernel_insight.<prefix>0"
    )
    p.set_defaults(handler=_run)
