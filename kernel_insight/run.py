"""``ki run``: the main job, as the README's run command starts it.

The whole pipeline on one machine, on loopback: a collector on the embedded
store, an enrolled native agent draining a GPU ring, and the simulator writing
realistic (``simulated="true"``) records into that ring; every few seconds it
asks the collector, through the SDK, what has arrived.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from kernel_insight.collector.flags import at_least, port_number

__all__ = ["add_commands"]

_KI = [sys.executable, "-m", "kernel_insight.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _shipped_rules() -> Path | None:
    """deploy/rules of a source checkout (what ``make run`` uses), or None when installed without it."""
    rules = Path(__file__).resolve().parent.parent / "deploy" / "rules"
    return rules if any(rules.glob("*.yml")) else None


def _enrol(data: Path) -> tuple[Path, str]:
    """The agent's key file and a read token, made once per data directory and reused."""
    from kernel_insight.api import TokenStore
    from kernel_insight.collector.keys import KeyStore

    key_file = data / "agent.key"
    if not key_file.exists():
        KeyStore(data / "keys.json").add_agent(f"{socket.gethostname()}/gpu0").write_key_file(key_file)
    token_file = data / "read.token"
    if not token_file.exists():
        token = TokenStore(data / "tokens.json").create("ki run", ["read"]).token
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
    return key_file, token_file.read_text().strip()


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


def _wait_listening(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("ki: listening on "):
            return line.split()[-1]
        if not line and proc.poll() is not None:
            break
    raise RuntimeError("the collector did not start; see the collector log")


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


def _report(url: str, token: str, elapsed: float, collector_s: float) -> str:
    """One line of what has arrived, ``elapsed`` seconds into the run, ``collector_s`` after this
    run's collector started."""
    from kernel_insight.sdk import HealthClient, KernelInsightError, KqlClient

    parts = [f"{elapsed:5.0f}s"]
    # The kernel counters are derived by the collector from zero when it starts (docs/metrics.md),
    # so their sum is this run's count, not what the store holds: with --data reused it began at
    # 0 again beside the earlier runs' kernels, under the words "kernels stored". Samples from
    # before this collector started (an earlier run's last values, still inside the lookback)
    # are kept out by the window.
    window_s = min(_LOOKBACK_S, math.ceil(collector_s))
    try:
        with KqlClient(url, token, retries=0) as kql:
            spans = kql.query(f"sum(last_over_time(kernel_launches_total[{window_s}s]))").samples
            parts.append(f"{int(spans[0].value) if spans else 0:>9,} kernels this run")
            top = kql.query("topk(1, sum by (kernel) (kernel_execution_time_seconds_total))").samples
            if top:
                name = top[0].labels.get("kernel", "?")
                parts.append(f"busiest: {name if len(name) <= 40 else name[:37] + '...'}")
            free = kql.query("sum(gpu_memory_free_bytes)").samples
            if free:
                parts.append(f"free {free[0].value / 2**30:.1f} GiB")
        with HealthClient(url, token, ttl=0) as health:
            insts = health.snapshot().instances
            healthy = sum(1 for i in insts if i.healthy)
            parts.append(f"{len(insts)} instance(s), {healthy} healthy")
    except KernelInsightError as exc:
        parts.append(f"(collector not answering yet: {exc})")
    return "  ".join(parts)


def _stop_as_on_ctrl_c(signum: int, frame: object) -> None:
    """SIGTERM (kill, timeout, a service manager) and SIGHUP (the terminal closed) stop the job as
    Ctrl-C does: without it Python dies at once and the collector, agent and simulator it
    started (in process groups of their own) run on, orphaned."""
    raise KeyboardInterrupt


def _run(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _stop_as_on_ctrl_c)
    signal.signal(signal.SIGHUP, _stop_as_on_ctrl_c)
    data = Path(args.data).resolve()
    logs = data / "logs"
    try:
        logs.mkdir(parents=True, exist_ok=True)
        key_file, token = _enrol(data)
    except OSError as exc:
        print(f"ki run: cannot use the data directory {data}: {exc}", file=sys.stderr)
        return 1
    port = args.port or _free_port()
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
    with _process(collector_cmd, logs / "collector.log", stdout=subprocess.PIPE) as collector:
        url = _wait_listening(collector, 120)
        print(f"ki run: collector on {url} (embedded ClickHouse in {data})")
        agent_cmd = [*_KI, "agent", "--ring", ring, "--ring-create", "--collector", url]
        agent_cmd += ["--key-file", str(key_file), "--spool-dir", str(data / "spool"), "--log-level", "warn"]
        with _process(agent_cmd, logs / "agent.log") as agent:
            if not _wait_consumer(agent, ring, 60):
                print(f"ki run: {_agent_failure(agent, logs / 'agent.log', ring)}", file=sys.stderr)
                return 1
            print(f"ki run: agent (pid {agent.pid}) draining ring {ring} every 100 ms")
            sim_cmd = [*_KI, "probe", "simulate", "--gpus", "1", "--label-prefix", args.ring_prefix]
            if args.seconds:
                sim_cmd += ["--seconds", str(args.seconds)]
            with _process(sim_cmd, logs / "simulate.log") as sim:
                print(
                    'ki run: simulator writing kernels, NCCL, memory and NVML-like samples (simulated="true")'
                )
                print(f"ki run: read token in {data / 'read.token'}; try:")
                print(
                    f'  curl -H "Authorization: Bearer $(cat {data / "read.token"})" {url}/v1/health/snapshot'
                )
                print(f"ki run: web UI at {url}/ (sign in with that token; docs/ui.md)")
                if rules is not None:
                    print(f"ki run: alert rules from {rules} (docs/rules.md); pending and firing alerts:")
                    print(
                        f'  curl -H "Authorization: Bearer $(cat {data / "read.token"})" {url}/api/v1/alerts'
                    )
                    print(
                        f"  (every rule with its state and last evaluation: the same with {url}/api/v1/rules)"
                    )
                t0 = time.monotonic()
                try:
                    while sim.poll() is None:
                        time.sleep(args.every)
                        now = time.monotonic()
                        print(_report(url, token, now - t0, now - collector_t0), flush=True)
                except KeyboardInterrupt:
                    print("\nki run: stopping")
            # The agent flushes what is in the ring on SIGTERM; give the collector a moment to store it.
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=30)
        time.sleep(args.every)
        now = time.monotonic()
        print(_report(url, token, now - t0, now - collector_t0), flush=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(Path("/dev/shm", ring[1:]))
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="the main job: collector + agent + simulated GPU, on this machine")
    p.add_argument("--data", default="./ki-data", help="data directory (default ./ki-data)")
    p.add_argument("--port", type=port_number, default=0, help="collector port (default: a free one)")
    p.add_argument(
        "--seconds", type=at_least(0), default=0, help="stop after this long (default 0: until Ctrl-C)"
    )
    p.add_argument("--every", type=at_least(0.1), default=5.0, help="seconds between reports (default 5)")
    p.add_argument(
        "--ring-prefix", default="run-", help="ring of the simulated GPU: /kernel_insight.<prefix>0"
    )
    p.set_defaults(handler=_run)
