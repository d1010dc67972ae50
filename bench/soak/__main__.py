"""make soak: hours of mixed load with one fault at a time, then every record accounted for.

A real ``ki collector`` on an embedded store; ``--agents`` GPUs, each a ring fed by the C
producer (``ringtool paced``: KERNEL records at ``--rate`` plus 16 NVML-like metrics at 10 Hz)
and a ``ki-agent``: the first ``--exact-agents`` (default 2) ship every record
(``--histograms=0``), the others run with histograms on, the agent's default (kernels folded
into native histograms, only sampled spans shipped); a remote_write sender (one request of 100
samples every 10 s over one kept-alive connection, plus the alert gauge below); a ``ki import
--collector`` run of a small Prometheus-text file every ``--import-every`` seconds
(bench/soak/imports.py); the collector evaluating the shipped rules (deploy/rules/*.yml) and
the soak's own (bench/soak/alerts.py) and sending alerts to a real Alertmanager
(``prometheus-alertmanager`` on 127.0.0.1, its data in the work directory; ``--rules-resend-delay
5``, so an alert a restarted collector no longer holds expires there within 20 s); Prometheus API
queries every second; the SDK polling the health snapshot every second. Every ``--fault-every`` seconds one fault from
``FAULTS``, in an order drawn from ``--seed``, each logged with its time:

- ``collector_kill``: SIGKILL of the collector, restarted at once;
- ``agent_stop``: SIGSTOP of one agent for a fifth of the fault interval (60 s at the default), then SIGCONT;
- ``collector_reconfig``: the collector stopped and started with another ``--interval``;
- ``clock_step``: the collector restarted with its wall clock 30 s ahead or behind
  (scripts/wallshift.c, LD_PRELOAD) for a fifth of the interval, then restarted without;
- ``merge_storm``: 2,000 remote_write requests of one sample each from 8 threads (2,000 parts);
- ``network_cut``: the agents run in a network namespace this run creates, joined to the
  collector by a veth pair; its namespace end is set down for 0.3 of the fault interval (90 s at
  the default), then up (without ``ip netns``, the agents use loopback and the fault is skipped);
- ``store_disk_full``, ``spool_disk_full``: the store's data directory and the agents' folders
  (spools, logs) each live on a small loop-mounted ext4 of the run's own; a ballast file takes
  all of its free space for a fifth of the fault interval, then is deleted (without loop mounts
  they live in the work directory and the faults are skipped).

At the end the producers stop, the agents drain and stop, and the store is read. ``lost``
(written, not stored) and ``duplicated`` (stored more than once) add up: for an agent shipping
every record, each record by its correlation id in ``kernel_spans``; for a histogram agent, the
sum over its ``kernel_duration_seconds`` series of each one's last (cumulative) count against
the records its producer wrote (less: lost, more: duplicated), and any histogram sample stored
twice (same series and time); every remote_write sample acknowledged, and every sample of a
successful ``ki import``, stored once (an import that fails is retried at each later run and
once after the load; ``imports_failed`` counts those that never succeeded, the log their
reasons). ``alerts_ok``: the soak sets its gauge above the rule's threshold from 0.3 of the run
for a quarter of it (45 s to 5 min), and its alert reached Alertmanager within ``for`` + two
evaluation intervals (+10 s) of the first high sample acknowledged and left it (resolved)
within two intervals (+10 s) of the first low one, unless a fault overlapped the late stretch
(named in the log); and every rule of the collector was evaluated (in runs of
``EVERY_RULE_MINUTES`` or more), none failing outside a fault (0 without Alertmanager installed). ``leaked``: what is still there after the cleanup,
every process the soak started (each carries ``KI_SOAK_RUN`` in its environment; a child
never reaped is found by its parent pid), the network namespace and veth, the loop mounts,
the shared-memory rings (bench/soak/leaks.py); the run exits 1 when anything leaked. The largest
growth of resident memory after the warm-up (a third of the run, at most 10 minutes), over the
agents and each collector process, each judged from the end of its own warm-up (a collector a
fault restarted is judged that long after its start; one that did not live so long is logged as
not judged: bench/soak/memory.py) (``rss_growth_pct``; the log gives each one's figures, the
collector's head size and the agents' VmSize beside). The collector runs with
``--head-minutes`` of half the warm-up, so its head (recent samples for a window, by design) is
full before growth is measured, not filling during it; a quarter into the warm-up every agent is
stopped as long as an agent_stop fault stops one (at most another quarter of the warm-up) and
continued, so its catch-up has touched its start-time buffers to their full size before growth is
measured (``WARM_UP_BURST``).
``agent_rss_max_kb``: the most any agent was resident after the warm-up (held to
``AGENT_BUDGET_KB``, 5 MB); ``agent_vm_growth_kb``: the most any agent's VmSize grew after it
(0: no agent allocated anything). ``stale_s_max``: the longest an agent's
instance was reported stale after the last fault had ended (a fault's window is open from its
beginning until it is over: an agent_stop's at its SIGCONT; staleness while one runs is the
fault's own); each agent's stale/fresh turns are logged with the snapshot's ages and reasons.
Ends with ``BENCH soak minutes=<n> faults=<n>
records=<n> lost=<n> duplicated=<n> rss_growth_pct=<n> agent_rss_max_kb=<n> agent_vm_growth_kb=<n>
stale_s_max=<n> alerts_ok=<0|1>
imports=<n> imports_failed=<n> leaked=<n>``; the fault log and
the figures go to ``--log`` (default bench/results/soak-<seed>.log).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench.e2e.fleet import REPO, Collector, Node, build_ringtool, smaps_kb, wait_until
from bench.soak import leaks
from bench.soak.alerts import ALERT, GAUGE, RULE, Alertmanager, AlertWatch, Condition, RuleHealth
from bench.soak.imports import METRIC as IMPORT_METRIC
from bench.soak.imports import Importer
from bench.soak.memory import growth_pct, judged_from
from bench.soak.windows import FaultWindows
from kernel_insight.api import TokenStore
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.keys import KeyStore
from kernel_insight.collector.remote_write import encode_write_request
from kernel_insight.sdk import HealthClient

FAULTS = (
    "collector_kill",
    "agent_stop",
    "collector_reconfig",
    "clock_step",
    "merge_storm",
    "store_disk_full",
    "spool_disk_full",
    "network_cut",
)
NOT_BUILT: set[str] = set()
#: The veth pairs' /30s are carved from this /16, one per run (``Netns``): two soaks at once
#: with the same addresses would each answer the other's agents.
VETH_NET = "10.201"
RW_METRIC, STORM_METRIC = "soak_remote_write", "soak_merge_storm"
#: Runs at least this long must see every shipped rule evaluated (shorter ones, with collector
#: restarts every 20 s, can end before a 1-minute group's first slot; their rules are still listed).
EVERY_RULE_MINUTES = 10
#: The soak's collector keeps this many head windows (--head-minutes) in the warm-up, so its head
#: is full, and its memory at its size, before the flatness of memory is measured.
HEAD_WINDOWS_IN_WARM_UP = 2
#: A quarter into the warm-up every agent is stopped as long as an agent_stop fault stops one (at
#: most another quarter of the warm-up), then continued: its catch-up ships full batches
#: (``batch_records``) in full requests (``request_max_kb``), so every buffer the agent allocated at
#: start has been touched to its full size once before memory is judged. An agent allocates its
#: buffers at start (agent/src has no realloc) and touches their pages only as far as a batch or
#: request reaches; without this its RSS rose at the first catch-up of the measured stretch (a
#: fault's) by that first touch, bounded by the buffers' sizes, not by holding more
#: (bench/results/soak.md, "Agents' memory").
WARM_UP_BURST = "warm-up burst"
#: The resident memory every agent is held to (ring_keep_kb, 4,608 kB by default, is 512 kB under it).
AGENT_BUDGET_KB = 5120
WRITE_HEADERS = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"}


class Log:
    def __init__(self, path: Path) -> None:
        self.path, self.t0 = path, time.monotonic()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")

    def __call__(self, text: str) -> None:
        line = f"{time.strftime('%H:%M:%S', time.gmtime())} +{time.monotonic() - self.t0:7.1f}s {text}"
        print(line, file=sys.stderr, flush=True)
        with self.path.open("a") as f:
            f.write(line + "\n")


class Loop(threading.Thread):
    """Calls ``step`` every ``every_s`` until stopped; counts the calls that raised."""

    def __init__(self, every_s: float, step: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self.every_s, self.step = every_s, step
        self.stop = threading.Event()
        self.errors = self.calls = 0

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.calls += 1
            try:
                self.step()
            except Exception:
                self.errors += 1


def _rss_kb(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory (or another ``/proc/<pid>/status`` field in kB); 0 once it has ended."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _head_bytes(client: httpx.Client) -> float:
    """The collector's ``ki_head_bytes`` from its /metrics."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("ki_head_bytes "):
            return float(line.split()[1])
    raise ValueError("no ki_head_bytes in /metrics")


def _wallshift(out: Path) -> Path:
    lib = out / "wallshift.so"
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O2", "-o", str(lib), str(REPO / "scripts" / "wallshift.c"), "-ldl"],
        check=True,
    )
    return lib


class SmallDisk:
    """An ext4 of ``size`` bytes in a sparse file, loop-mounted at ``path``; ``fill`` takes its free space."""

    def __init__(self, path: Path, size: int) -> None:
        self.path, self.image = path, path.with_suffix(".img")
        self.ballast = path / "ballast"
        path.mkdir(parents=True)
        with self.image.open("wb") as f:
            f.truncate(size)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(self.image)], check=True, capture_output=True)
        subprocess.run(
            ["mount", "-o", "loop", str(self.image), str(path)], check=True, capture_output=True, text=True
        )

    def fill(self) -> int:
        st = os.statvfs(self.path)
        free = st.f_bavail * st.f_frsize
        with self.ballast.open("wb") as f, contextlib.suppress(OSError):  # the last blocks: as many as fit
            os.posix_fallocate(f.fileno(), 0, free)
        return free

    def free(self) -> None:
        self.ballast.unlink(missing_ok=True)

    def close(self) -> None:
        if subprocess.run(["umount", str(self.path)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)
        self.image.unlink(missing_ok=True)


class Netns:
    """A network namespace for the agents, joined to this one by a veth pair; ``cut`` sets its end down."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.name, self.host_if, self.ns_if = f"kisoak{tag}", f"kish{tag}", f"kisn{tag}"
        block = os.getpid() % (1 << 14)  # the run's /30 of VETH_NET, unless another holds it
        taken = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
        while f" {VETH_NET}.{block >> 6}.{(block & 63) * 4 + 1}/" in taken:
            block = (block + 1) % (1 << 14)
        #: The collector's end (this namespace) and the agents' end.
        self.host_ip = f"{VETH_NET}.{block >> 6}.{(block & 63) * 4 + 1}"
        self.agents_ip = f"{VETH_NET}.{block >> 6}.{(block & 63) * 4 + 2}"
        steps = [
            ["ip", "netns", "add", self.name],
            [
                "ip",
                "link",
                "add",
                self.host_if,
                "type",
                "veth",
                "peer",
                "name",
                self.ns_if,
                "netns",
                self.name,
            ],
            ["ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if],
            ["ip", "link", "set", self.host_if, "up"],
            [
                "ip",
                "netns",
                "exec",
                self.name,
                "ip",
                "addr",
                "add",
                f"{self.agents_ip}/30",
                "dev",
                self.ns_if,
            ],
            ["ip", "netns", "exec", self.name, "ip", "link", "set", self.ns_if, "up"],
            ["ip", "netns", "exec", self.name, "ip", "link", "set", "lo", "up"],
        ]
        try:
            for step in steps:
                subprocess.run(step, check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError):
            self.close()
            raise

    def link(self, up: bool) -> None:
        subprocess.run(
            ["ip", "netns", "exec", self.name, "ip", "link", "set", self.ns_if, "up" if up else "down"],
            check=True,
        )

    def close(self) -> None:
        subprocess.run(
            ["ip", "netns", "del", self.name], capture_output=True, check=False
        )  # the veth goes with it
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, check=False)


def _stop_by_hand(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60.0, help="how long the load runs (default 60)")
    ap.add_argument(
        "--fault-every", type=float, default=300.0, metavar="S", help="seconds between faults (default 300)"
    )
    ap.add_argument("--seed", type=int, default=1, help="draws the faults' order (default 1)")
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--rate", type=int, default=1000, help="KERNEL records/s per agent (default 1000)")
    ap.add_argument(
        "--exact-agents", type=int, default=2, metavar="N",
        help="agents that ship every span (--histograms=0), checked record by record; the others fold"
        " kernels into histograms and are checked by their counts (default 2)",
    )  # fmt: skip
    ap.add_argument(
        "--import-every", type=float, default=180.0, metavar="S",
        help="seconds between ki import runs (default 180; at most a third of the run)",
    )  # fmt: skip
    ap.add_argument("--log", type=Path, help="fault log and figures (default bench/results/soak-<seed>.log)")
    ap.add_argument("--dir", type=Path, help="work here (default: a temporary directory)")
    args = ap.parse_args()
    # Stopped by hand: Ctrl-C, or SIGTERM where a shell started the soak in the background (such a
    # job ignores SIGINT). Raised in the main thread, so the processes, the network namespace, the
    # loop mounts and the rings are cleaned up on the way out, as at the end of a run.
    signal.signal(signal.SIGINT, _stop_by_hand)
    signal.signal(signal.SIGTERM, _stop_by_hand)
    run_s = args.minutes * 60
    token_mark = leaks.mark()  # before the first process starts: every one inherits it
    log = Log(args.log or REPO / "bench" / "results" / f"soak-{args.seed}.log")
    rng = random.Random(args.seed)
    order = list(FAULTS)
    rng.shuffle(order)
    log(
        f"soak: {args.minutes:g} min, {args.agents} agents at {args.rate}/s, a fault every {args.fault_every:g} s, seed {args.seed}: {order}"
    )
    disks: dict[str, SmallDisk] = {}  # unmounted last: the temporary directory's removal skips them
    left_behind: dict[str, str | None] = {"netns": None, "host_if": None}
    ring_prefix = f"ki_e2e.{os.getpid()}."  # bench.e2e.fleet.Node's ring names
    try:
        with tempfile.TemporaryDirectory(
            prefix="ki-soak-", dir=args.dir, ignore_cleanup_errors=True
        ) as tmp_name:
            tmp = Path(tmp_name)
            ringtool = build_ringtool(tmp)
            shift_lib = _wallshift(tmp)
            agent_bin = tmp / "agent-build" / "ki-agent"
            (tmp / "agent-build").mkdir()
            subprocess.run(
                ["make", "-s", "-C", str(REPO / "agent" / "src"), f"OUT={tmp / 'agent-build'}"], check=True
            )
            for fault, sub, size in (
                ("store_disk_full", "store-disk", 16 << 30),
                ("spool_disk_full", "agents-disk", 4 << 30),
            ):
                try:
                    disks[fault] = SmallDisk(tmp / sub, size)
                except (OSError, subprocess.CalledProcessError) as exc:
                    log(f"no loop mount for {fault} ({getattr(exc, 'stderr', '') or exc}): skipped")
                    NOT_BUILT.add(fault)
            store_dir = disks["store_disk_full"].path if "store_disk_full" in disks else tmp
            agents_dir = disks["spool_disk_full"].path if "spool_disk_full" in disks else tmp
            keys = KeyStore(tmp / "keys.json")
            nodes = [Node(agents_dir, i, keys, agent_bin, ringtool) for i in range(args.agents)]
            netns: Netns | None = None
            try:
                netns = Netns()
            except (OSError, subprocess.CalledProcessError) as exc:
                log(
                    f"no network namespace ({getattr(exc, 'stderr', '') or exc}): agents on loopback, network_cut skipped"
                )
                NOT_BUILT.add("network_cut")
            if netns is not None:
                left_behind.update(netns=netns.name, host_if=netns.host_if)
            token = TokenStore(tmp / "tokens.json").create("soak", ["read", "ingest"]).token
            (tmp / "soak-rules.yml").write_text(RULE)
            rule_flags = [
                "--rules",
                str(REPO / "deploy" / "rules" / "*.yml"),
                "--rules",
                str(tmp / "soak-rules.yml"),
            ]
            am: Alertmanager | None = None
            if Alertmanager.BINARY is None:
                log("no prometheus-alertmanager: rules evaluated, alerts not delivered (alerts_ok=0)")
            else:
                am = Alertmanager(tmp)
                # A firing alert's endsAt is 4 resend delays ahead: Alertmanager resolves it by
                # itself within 20 s when a restarted collector no longer has it to resolve.
                rule_flags += ["--alertmanager", am.url, "--rules-resend-delay", "5"]
            auth = {"Authorization": f"Bearer {token}"}
            warm_s = min(600.0, run_s / 3)
            head_minutes = warm_s / 60 / HEAD_WINDOWS_IN_WARM_UP
            collector = Collector(
                store_dir / "data", tmp / "keys.json", tmp / "collector.log", interval_s=2.0,
                host=netns.host_ip if netns else "127.0.0.1", tokens=tmp / "tokens.json",
                extra=["--head-minutes", f"{head_minutes:g}", *rule_flags],
            )  # fmt: skip
            stopped: dict[int, tuple[float, int]] = {}  # agent index -> (when its SIGSTOP ends, its window)
            faults_done = 0
            windows = FaultWindows()
            rss: dict[str, list[tuple[float, int]]] = {}
            head_mb: dict[
                str, list[tuple[float, float]]
            ] = {}  # collector -> (time, its ki_head_bytes in MiB)
            #: agent -> (time, VmSize): its buffers are all allocated at start
            vm_kb: dict[str, list[tuple[float, int]]] = {}
            #: process -> (time, RssAnon, RssFile): the heaps against pages of mapped files (chDB's library)
            split_kb: dict[str, list[tuple[float, int, int]]] = {}
            #: collector -> its mappings' (resident, anonymous) kB at its first look after the
            #: warm-up and at its latest: what grew, by mapping (chDB's library, [heap], arenas)
            maps_kb: dict[str, list[dict[str, tuple[int, int]]]] = {}
            was_stale: dict[str, bool] = {}
            rw_acked: set[float] = set()
            stale_after_fault = [0.0]
            client = httpx.Client(base_url=collector.url, timeout=30, headers=auth)
            rules_client = httpx.Client(base_url=collector.url, timeout=30, headers=auth)
            rules = RuleHealth()
            importer = Importer(tmp, collector.url, token)
            watch = AlertWatch(am.url) if am is not None else None
            alert_hold = max(45.0, min(300.0, run_s / 4))
            try:
                collector.start()
                for i, n in enumerate(nodes):
                    n.start_producer(args.rate, run_s)
                    n.start_agent(
                        collector.url, histograms=i >= args.exact_agents, netns=netns.name if netns else None
                    )
                t_start = time.monotonic()
                cond = Condition(t_start + 0.3 * run_s, alert_hold)
                log(f"collector pid {collector.pid}; agents {[n.agent.pid for n in nodes if n.agent]}")

                rw_seq = [0]

                def remote_write() -> None:
                    base = rw_seq[0]
                    now = int(time.time() * 1000)
                    samples = [(now + i, float(base + i)) for i in range(100)]
                    gauge = cond.value(time.monotonic())
                    body = encode_write_request(
                        [
                            ({"__name__": RW_METRIC, "job": "soak"}, samples),
                            ({"__name__": GAUGE, "job": "soak"}, [(now, gauge)]),
                        ]
                    )
                    rw_seq[0] += 100
                    if client.post("/api/v1/write", content=body, headers=WRITE_HEADERS).status_code != 204:
                        raise OSError("remote_write refused")
                    cond.acked(gauge, time.monotonic())
                    rw_acked.update(v for _, v in samples)

                def query() -> None:
                    r = httpx.get(
                        f"{collector.url}/api/v1/query",
                        headers=auth,
                        params={"query": "sum by (instance) (rate(gpu_kernel_launches_total[1m]))"},
                        timeout=30,
                    )
                    r.raise_for_status()

                health = HealthClient(collector.url, token, ttl=0, timeout=10)
                ids = {n.agent_id: i for i, n in enumerate(nodes)}

                def poll() -> None:
                    now = time.monotonic()
                    active = windows.active(now)
                    snap = health.snapshot()
                    wall_ms = time.time() * 1000
                    for inst in snap.instances:
                        if inst.id in ids and was_stale.get(inst.id, False) != inst.stale:
                            was_stale[inst.id] = inst.stale
                            heard = (
                                "never"
                                if inst.last_heard_ms is None
                                else f"{(wall_ms - inst.last_heard_ms) / 1000:.1f} s"
                            )
                            log(
                                f"agent{ids[inst.id]} {'stale' if inst.stale else 'fresh'}"
                                f"{' (lagging)' if inst.lagging else ''}: data {(wall_ms - inst.last_seen_ms) / 1000:.1f} s old,"
                                f" heard {heard} ago, ingest lag {inst.ingest_lag_s}, snapshot as of"
                                f" {(wall_ms - snap.as_of_ms) / 1000:.1f} s ago{', during a fault' if active else ''};"
                                f" {'; '.join(inst.reasons) or 'no reasons'}"
                            )  # fmt: skip
                    since = windows.since_last(now)
                    if since is None:
                        return
                    for inst in snap.instances:
                        if inst.id in ids and inst.stale:
                            stale_after_fault[0] = max(stale_after_fault[0], since)

                def memory() -> None:
                    now = time.monotonic()
                    if collector.proc is not None and collector.proc.poll() is None:
                        pid = collector.pid  # a restarted collector is another process: another series
                        rss.setdefault(f"collector{pid}", []).append((now, _rss_kb(pid)))
                        split_kb.setdefault(f"collector{pid}", []).append(
                            (now, _rss_kb(pid, "RssAnon"), _rss_kb(pid, "RssFile"))
                        )
                        looks = rss[f"collector{pid}"]
                        if now >= judged_from(looks, t_start, warm_s) and (maps := smaps_kb(pid)):
                            seen = maps_kb.setdefault(f"collector{pid}", [])
                            seen[1:] = [maps]
                            if len(seen) == 1:
                                seen.append(maps)
                        with contextlib.suppress(httpx.HTTPError, ValueError):
                            head_mb.setdefault(f"collector{pid}", []).append(
                                (now, _head_bytes(client) / (1 << 20))
                            )
                    for i, n in enumerate(nodes):
                        if n.agent is not None:
                            rss.setdefault(f"agent{i}", []).append((now, _rss_kb(n.agent.pid)))
                            vm_kb.setdefault(f"agent{i}", []).append((now, _rss_kb(n.agent.pid, "VmSize")))

                loops = [
                    Loop(10, remote_write), Loop(1, query), Loop(1, poll), Loop(10, memory),
                    Loop(min(args.import_every, run_s / 3), importer.step), Loop(15, lambda: rules.poll(rules_client)),
                ]  # fmt: skip
                for loop in loops:
                    loop.start()

                def restart(*, interval: float, env: dict[str, str] | None = None) -> None:
                    collector.stop()
                    collector.interval_s = interval
                    saved = {k: os.environ.get(k) for k in (env or {})}
                    os.environ.update(
                        env or {}
                    )  # the collector's process inherits it; nothing else starts meanwhile
                    try:
                        collector.start()
                    finally:
                        for k, v in saved.items():
                            if v is None:
                                os.environ.pop(k, None)
                            else:
                                os.environ[k] = v

                hold_s = args.fault_every / 5
                next_fault, k = t_start + args.fault_every, 0
                burst_at: float | None = t_start + warm_s / 4
                while time.monotonic() < t_start + run_s:
                    now = time.monotonic()
                    for i, (until, w) in list(stopped.items()):
                        if now >= until:
                            agent = nodes[i].agent
                            assert agent is not None
                            agent.send_signal(signal.SIGCONT)
                            del stopped[i]
                            took = windows.end(w, time.monotonic())
                            what = windows.spans()[w][0]
                            log(f"agent{i} continued; {what}: over after {took:.1f} s")
                    if burst_at is not None and now >= burst_at:
                        burst_at = None
                        window = windows.begin(now, WARM_UP_BURST)
                        hold = min(hold_s, warm_s / 4)
                        for i, n in enumerate(nodes):
                            if i not in stopped and n.agent is not None:
                                n.agent.send_signal(signal.SIGSTOP)
                                stopped[i] = (now + hold, window)
                        log(
                            f"{WARM_UP_BURST}: every agent stopped for {hold:g} s (buffers at full size once)"
                        )
                    if now < next_fault:
                        time.sleep(min(1.0, next_fault - now))
                        continue
                    name = order[k % len(order)]
                    k += 1
                    next_fault += args.fault_every
                    begin = time.monotonic()
                    if name in NOT_BUILT:
                        log(f"fault {name}: skipped (not built yet)")
                        continue
                    log(f"fault {name}: begins")
                    window = windows.begin(
                        begin, name
                    )  # open: meanwhile the snapshot's verdicts are the fault's
                    if name == "collector_kill":
                        assert collector.proc is not None
                        collector.proc.send_signal(signal.SIGKILL)
                        collector.proc.wait()
                        restart(interval=collector.interval_s)
                    elif name == "agent_stop":
                        i = rng.randrange(len(nodes))
                        agent = nodes[i].agent
                        assert agent is not None
                        agent.send_signal(signal.SIGSTOP)
                        if i in stopped:  # still in the warm-up's stop: that one ends here, this one goes on
                            windows.end(stopped[i][1], time.monotonic())
                        stopped[i] = (time.monotonic() + hold_s, window)
                        log(f"agent{i} stopped for {hold_s:g} s")
                    elif name == "collector_reconfig":
                        restart(interval=5.0 if collector.interval_s == 2.0 else 2.0)
                        log(f"collector now --interval {collector.interval_s:g}")
                    elif name == "clock_step":
                        step = rng.choice((30, -30))
                        restart(
                            interval=collector.interval_s,
                            env={"LD_PRELOAD": str(shift_lib), "WALLSHIFT_S": str(step)},
                        )
                        log(f"collector clock {step:+d} s for {hold_s:g} s")
                        time.sleep(hold_s)
                        restart(interval=collector.interval_s)
                    elif name == "network_cut":
                        assert netns is not None
                        cut_s = args.fault_every * 0.3
                        netns.link(False)
                        log(f"agents' network down for {cut_s:g} s")
                        time.sleep(cut_s)
                        netns.link(True)
                    elif name in disks:
                        took = disks[name].fill()
                        log(f"{disks[name].path.name} full ({took >> 20} MiB of ballast) for {hold_s:g} s")
                        time.sleep(hold_s)
                        disks[name].free()
                    elif name == "merge_storm":

                        def one(j: int) -> None:
                            body = encode_write_request(
                                [
                                    (
                                        {"__name__": STORM_METRIC, "n": str(j % 50)},
                                        [(int(time.time() * 1000), float(j))],
                                    )
                                ]
                            )
                            with contextlib.suppress(httpx.HTTPError):
                                httpx.post(
                                    f"{collector.url}/api/v1/write",
                                    content=body,
                                    headers={**WRITE_HEADERS, **auth},
                                    timeout=30,
                                )

                        with ThreadPoolExecutor(8) as pool:
                            list(pool.map(one, range(2000)))
                    faults_done += 1
                    if name != "agent_stop":  # that one is over at its SIGCONT
                        log(f"fault {name}: over after {windows.end(window, time.monotonic()):.1f} s")
                for i in list(stopped):
                    agent = nodes[i].agent
                    assert agent is not None
                    agent.send_signal(signal.SIGCONT)
                for loop in loops:
                    loop.stop.set()
                    loop.join(30)
                health.close()
                log(
                    f"load over: queries {loops[1].calls} ({loops[1].errors} failed), remote_write {loops[0].calls} ({loops[0].errors} failed), snapshot polls {loops[2].calls} ({loops[2].errors} failed), rule reads {loops[5].calls} ({loops[5].errors} failed)"
                )
                if importer.pending:
                    importer.attempt()  # the failed imports' last retry, on a collector with no fault
                for line in importer.failures:
                    log(line)
                log(
                    f"ki import: {importer.runs} runs, {importer.succeeded} succeeded, {len(importer.pending)} failed for good,"
                    f" {len(importer.failures)} failed attempts"
                )
                if watch is not None and cond.ended is not None:
                    deadline = (
                        time.monotonic() + 120
                    )  # it resolves within two evaluations of the condition's end
                    while (
                        time.monotonic() < deadline
                        and (watch.spells.get(ALERT) or [[0.0, None]])[-1][1] is None
                    ):
                        time.sleep(1)
                produced = [n.produced(timeout=run_s + 120) for n in nodes]

                def drained() -> bool:
                    return all(n.backlog() == 0 and n.ring_fill() == 0 for n in nodes)

                wait_until(drained, 600, "the agents to deliver everything")
                for n in nodes:
                    n.stop_agent()
            finally:
                client.close()
                rules_client.close()
                if watch is not None:
                    watch.close()
                for n in nodes:
                    n.close()
                collector.stop()
                if am is not None:
                    am.close()
                if netns is not None:
                    netns.close()

            with EmbeddedStore(store_dir / "data", cache_bytes=0) as store:
                spans = {
                    r["instance"]: (int(r["n"]), int(r["u"]))
                    for r in store.query(
                        "SELECT instance, count() AS n, uniqExact(correlation) AS u FROM ki.kernel_spans GROUP BY instance"
                    ).to_pylist()
                }
                rw = store.query(
                    f"SELECT count() AS n, uniqExact(value) AS u FROM ki.samples WHERE metric = '{RW_METRIC}'"
                ).to_pylist()[0]
                rw_values = set(
                    store.query(f"SELECT DISTINCT value FROM ki.samples WHERE metric = '{RW_METRIC}'")
                    .column("value")
                    .to_pylist()
                )
                imported = store.query(
                    f"SELECT count() AS n, uniqExact(value) AS u, groupUniqArray(value) AS v FROM ki.samples"
                    f" WHERE metric = '{IMPORT_METRIC}'"
                ).to_pylist()[0]
                # The histogram agents' kernels: each series' last (cumulative) count, summed per instance.
                folded = {
                    r["instance"]: int(r["n"])
                    for r in store.query(
                        "SELECT s.instance AS instance, sum(h.c) AS n FROM"
                        " (SELECT fingerprint, max(count) AS c FROM ki.histograms"
                        "  WHERE metric = 'kernel_duration_seconds' GROUP BY fingerprint) AS h"
                        " INNER JOIN (SELECT DISTINCT fingerprint, labels['instance'] AS instance FROM ki.series"
                        "  WHERE metric = 'kernel_duration_seconds') AS s ON h.fingerprint = s.fingerprint"
                        " GROUP BY instance"
                    ).to_pylist()
                }
                hist_rows = store.query(
                    "SELECT count() AS n, uniqExact(fingerprint, ts) AS u FROM ki.histograms"
                    " WHERE metric = 'kernel_duration_seconds'"
                ).to_pylist()[0]
            records = lost = duplicated = dropped = 0
            for i, (n, (written, ring_full, _)) in enumerate(zip(nodes, produced, strict=True)):
                records += written
                dropped += ring_full
                if i < args.exact_agents:  # every span shipped: each record by its correlation id
                    got, unique = spans.get(n.agent_id, (0, 0))
                    lost += max(written - unique, 0)
                    duplicated += got - unique
                    log(f"agent{i} (every span): {written} written, {unique} stored, {got - unique} twice")
                else:  # folded: the histograms' counts
                    counted = folded.get(n.agent_id, 0)
                    lost += max(written - counted, 0)
                    duplicated += max(counted - written, 0)
                    log(
                        f"agent{i} (histograms): {written} written, {counted} counted by its kernel histograms,"
                        f" {spans.get(n.agent_id, (0, 0))[0]} spans kept"
                    )
            hist_dup = int(hist_rows["n"]) - int(hist_rows["u"])
            if hist_dup:
                log(f"{hist_dup} kernel histogram samples stored twice (same series and time)")
            duplicated += hist_dup
            import_values = set(imported["v"])
            lost_import = len(importer.acked - import_values)
            dup_import = int(imported["n"]) - int(imported["u"])
            log(
                f"ki import: {len(importer.acked)} samples of successful imports, {lost_import} of them not stored,"
                f" {dup_import} stored twice"
            )
            lost += lost_import
            duplicated += dup_import
            fault_spans = windows.spans()
            alert_problems = rules.problems(
                lambda a, b: any(fb <= b and a <= fe for _, fb, fe in fault_spans),
                every_rule=args.minutes >= EVERY_RULE_MINUTES,
            )
            log(f"rules: {len(rules.names)} seen, {len(rules.evaluated)} evaluated and healthy")
            for problem in alert_problems:
                log(f"rule problem: {problem}")
            if watch is None:
                alerts_ok, verdict = False, "no Alertmanager"
            else:
                alerts_ok, verdict = watch.judge(cond, fault_spans)
                for name, spells in sorted(watch.spells.items()):
                    times = ", ".join(
                        f"{a - t_start:.0f}-{'' if b is None else f'{b - t_start:.0f}'} s"
                        for a, b in spells
                        if a is not None
                    )
                    log(f"alertmanager: {name} active {times}")
            alerts_ok = alerts_ok and not alert_problems
            log(f"soak alert {ALERT}: {verdict}; alerts_ok={int(alerts_ok)}")
            lost_rw = len(rw_acked - rw_values)
            lost += lost_rw
            duplicated += int(rw["n"]) - int(rw["u"])
            growth = 0.0
            agent_rss_max = agent_vm_growth = 0
            not_judged: list[str] = []
            for proc, points in rss.items():
                judged = growth_pct(points, t_start, warm_s)
                if judged is None:
                    not_judged.append(
                        f"{proc} (looked at {points[0][0] - t_start:.0f}-{points[-1][0] - t_start:.0f} s)"
                    )
                else:
                    pct, after = judged
                    since = judged_from(points, t_start, warm_s)
                    growth = max(growth, pct)
                    head = [mb for t, mb in head_mb.get(proc, ()) if t >= since]
                    vm = [kb for t, kb in vm_kb.get(proc, ()) if t >= since and kb > 0]
                    if proc.startswith("agent"):
                        agent_rss_max = max(agent_rss_max, max(after))
                        agent_vm_growth = max(agent_vm_growth, max(vm) - vm[0] if vm else 0)
                    split = [(a, f) for t, a, f in split_kb.get(proc, ()) if t >= since and a > 0]
                    log(
                        f"rss {proc} from {since - t_start:.0f} s (its own warm-up's end):"
                        f" {after[0]} -> {after[-1]} kB (max {max(after)})"
                        + (
                            f"; head {head[0]:.0f} -> {head[-1]:.0f} MiB (max {max(head):.0f})"
                            if head
                            else ""
                        )
                        + (f"; VmSize {min(vm)}-{max(vm)} kB" if vm else "")
                        + (
                            f"; RssAnon {split[0][0]} -> {split[-1][0]} kB (max {max(a for a, _ in split)}),"
                            f" RssFile {split[0][1]} -> {split[-1][1]} kB (max {max(f for _, f in split)})"
                            if split
                            else ""
                        )
                    )
                    if proc in maps_kb:
                        first, last = maps_kb[proc]
                        moved = sorted(
                            (last.get(m, (0, 0))[0] - first.get(m, (0, 0))[0], m)
                            for m in first.keys() | last.keys()
                        )
                        log(
                            f"smaps {proc} after the warm-up, resident kB by mapping that moved 1 MB or more: "
                            + (
                                ", ".join(
                                    f"{m} {first.get(m, (0, 0))[0]} -> {last.get(m, (0, 0))[0]}"
                                    for d, m in moved
                                    if abs(d) >= 1024
                                )
                                or "none"
                            )
                        )
            if not_judged:
                log(
                    f"memory not judged (ended within its own warm-up of {warm_s:.0f} s): {', '.join(not_judged)}"
                )
            log(
                f"agents after the warm-up: resident at most {agent_rss_max} kB (held to {AGENT_BUDGET_KB}),"
                f" VmSize grew by at most {agent_vm_growth} kB (0: nothing allocated after the start)"
            )
            log(
                f"records {records} written by the producers ({dropped} dropped by a full ring), {lost} lost, {duplicated} duplicated; remote_write {len(rw_acked)} acknowledged, {lost_rw} lost"
            )
            line = (
                f"BENCH soak minutes={args.minutes:g} faults={faults_done} records={records} lost={lost} "
                f"duplicated={duplicated} rss_growth_pct={growth:.1f} agent_rss_max_kb={agent_rss_max} agent_vm_growth_kb={agent_vm_growth} stale_s_max={stale_after_fault[0]:.1f} "
                f"alerts_ok={int(alerts_ok)} imports={importer.succeeded} imports_failed={len(importer.pending)}"
            )
    finally:
        for disk in disks.values():
            disk.close()
            shutil.rmtree(disk.path.parent, ignore_errors=True)
    left = leaks.leftovers(
        token_mark, netns=left_behind["netns"], host_if=left_behind["host_if"],
        mounts=[d.path for d in disks.values()], rings=ring_prefix,
    )  # fmt: skip
    for thing in left:
        log(f"left behind: {thing}")
    line += f" leaked={len(left)}"
    log(line)
    print(line)
    if left:
        sys.exit(1)


if __name__ == "__main__":
    main()
