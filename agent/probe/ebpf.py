"""The eBPF tracer: what the host sees of CUDA and NCCL, from uprobes on their libraries (bcc).

Launches are counted in the kernel (per process, API and function handle,
with a log2 histogram of the call's host time) and flushed to the ring as
cumulative samples once per drain; a launch costs the traced thread one
uprobe pair (a trap each: microseconds in a VM) and no event, so the launch
uprobes are off unless asked for (``launch_every``: attached one drain interval
in every N). Per-launch LAUNCH records are optional and sampled. Timelines tie
launches to kernels through the CUDA-event probe's own records, not these.
Memory, synchronisation and NCCL calls become one record each (MEMOP, SYNC,
COLLECTIVE), with their host-side duration.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import importlib
import os
import re
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from kernel_insight.agent.metric_ids import MetricId
from kernel_insight.agent.probe._bpf import BPF_TEXT, EV_COLLECTIVE, EV_LAUNCH, EV_MEMOP, EV_SYNC, NAME_LEN
from kernel_insight.agent.records import ErrorKind, MemopKind
from kernel_insight.agent.ring import Ring, ring_name

__all__ = [
    "API_NAMES",
    "BpfProgramStats",
    "EbpfUnavailable",
    "LaunchStats",
    "Tracer",
    "TracerConfig",
    "bpf_run_time_stats",
    "find_library",
]

#: The launch aggregates are GPU_SAMPLE metrics (agent/metric_ids.py, docs/metrics.md):
#: aux = kernel-name string id (bucket index << 32 for buckets; buckets are cumulative).

API_NAMES = {0: "cuLaunchKernel", 1: "cuLaunchKernel_ptsz", 2: "cudaLaunchKernel"}
CUDA_ERROR_OUT_OF_MEMORY = 2
_HIST = 32
_MEMOP_CALL = {1: "cuMemAlloc_v2", 2: "cuMemFree_v2", 3: "cuMemAllocAsync", 4: "cuMemFreeAsync"}


class EbpfUnavailable(Exception):
    """The tracer cannot run here (no bcc, BPF not permitted, no library to trace); the message says why."""


@dataclass(frozen=True, slots=True)
class TracerConfig:
    """What to trace and where the records go; library paths default to what the dynamic loader finds."""

    gpu: int = 0
    label_prefix: str = ""
    pid: int | None = None  # trace one process...
    cgroup: str | None = None  # ...or the processes of one cgroup v2 directory, else all
    libcuda: str | None = None
    libcudart: str | None = None
    libnccl: str | None = None
    launch_sample: int = 0  # one LAUNCH record per this many launches (0: none, 1: every launch)
    launch_latency: bool = True  # a uretprobe per launch for the host-time histogram
    #: Launch uprobes attached one drain interval in every this many (0: never, the default;
    #: 1: always): each traced launch traps, so tracing 1 interval in N costs 1/N of that.
    launch_every: int = 0
    drain_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if self.pid is not None and self.cgroup is not None:
            raise ValueError("ebpf: trace by pid or by cgroup, not both")
        if self.pid is not None and self.pid <= 0:
            raise ValueError(f"ebpf: invalid pid {self.pid}")
        if self.launch_sample < 0:
            raise ValueError("ebpf: launch_sample must be 0 (off) or a positive period")
        if self.launch_every < 0:
            raise ValueError("ebpf: launch_every must be 0 (launch uprobes off) or a positive period")
        if self.drain_interval_s <= 0:
            raise ValueError("ebpf: drain interval must be positive")
        if not 0 <= self.gpu <= 0xFFFF:
            raise ValueError(f"ebpf: invalid GPU index {self.gpu}")


@dataclass(slots=True)
class LaunchStats:
    """Launches of one kernel name seen so far (all traced processes, all launch APIs)."""

    count: int = 0
    host_ns: int = 0
    hist: list[int] = field(default_factory=lambda: [0] * _HIST)


@dataclass(frozen=True, slots=True)
class BpfProgramStats:
    """The kernel's run-time statistics of one loaded BPF program (zero unless stats are enabled).

    ``run_time_ns`` is CPU the program spent in the threads that hit its
    probe, on the tracer's behalf; it excludes the uprobe trap itself.
    """

    run_time_ns: int
    run_cnt: int


class _Event(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("kind", ctypes.c_uint32),
        ("ts", ctypes.c_uint64),
        ("dur", ctypes.c_uint64),
        ("a", ctypes.c_uint64),
        ("b", ctypes.c_uint64),
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("status", ctypes.c_int32),
        ("rank", ctypes.c_uint32),
        ("nranks", ctypes.c_uint32),
        ("dims", ctypes.c_uint32 * 6),
        ("pad", ctypes.c_uint32),
    ]


# (library, symbol, entry function, return function or None)
_PROBES: list[tuple[str, str, str, str | None]] = [
    ("cuda", "cuModuleGetFunction", "getfn_entry", "getfn_return"),
    ("cuda", "cuLibraryGetKernel", "getfn_entry", "getfn_return"),
    ("cuda", "cuLaunchKernel", "launch_drv_entry", "launch_return"),
    ("cuda", "cuLaunchKernel_ptsz", "launch_ptsz_entry", "launch_return"),
    ("cuda", "cuMemAlloc_v2", "alloc_entry", "mem_return"),
    ("cuda", "cuMemAllocAsync", "alloc_async_entry", "mem_return"),
    ("cuda", "cuMemFree_v2", "free_entry", "mem_return"),
    ("cuda", "cuMemFreeAsync", "free_async_entry", "mem_return"),
    ("cuda", "cuStreamSynchronize", "sync_stream_entry", "sync_return"),
    ("cuda", "cuCtxSynchronize", "sync_ctx_entry", "sync_return"),
    ("cuda", "cuEventSynchronize", "sync_event_entry", "sync_return"),
    ("cudart", "cudaLaunchKernel", "launch_rt_entry", "launch_return"),
    ("nccl", "ncclCommInitRank", "comm_init_entry", "comm_init_return"),
    ("nccl", "ncclCommInitRankConfig", "comm_init_entry", "comm_init_return"),
    ("nccl", "ncclAllReduce", "allreduce_entry", "coll_return"),
    ("nccl", "ncclAllGather", "allgather_entry", "coll_return"),
    ("nccl", "ncclReduceScatter", "reducescatter_entry", "coll_return"),
    ("nccl", "ncclBroadcast", "broadcast_entry", "coll_return"),
    ("nccl", "ncclSend", "send_entry", "coll_return"),
    ("nccl", "ncclRecv", "recv_entry", "coll_return"),
    ("nccl", "ncclGroupStart", "group_start_entry", None),
    ("nccl", "ncclGroupEnd", "group_end_entry", "coll_return"),
]
_SONAMES = {"cuda": "libcuda.so.1", "cudart": "libcudart.so", "nccl": "libnccl.so.2"}


def find_library(soname: str, pid: int | None = None) -> str | None:
    """Where the dynamic loader would find ``soname`` (a prefix such as ``libcudart.so`` matches any version).

    A traced process's own mapping wins (it may load a wheel's copy, such as
    PyTorch's NCCL); then LD_LIBRARY_PATH, the loader cache (``ldconfig -p``)
    and the default directories.
    """

    def matches(name: str) -> bool:
        return name.startswith(soname)

    if pid is not None:
        try:
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith("/") and matches(os.path.basename(parts[5])):
                    return parts[5]
        except OSError:
            pass
    for d in (d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d):
        hits = sorted(glob.glob(os.path.join(glob.escape(d), soname + "*")))
        if hits:
            return hits[0]
    try:
        out = subprocess.run(
            ["ldconfig", "-p"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    arch = {"x86_64": "x86-64", "aarch64": "AArch64"}.get(os.uname().machine, "")
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)", line)
        if m and matches(m.group(1)) and arch in m.group(2):
            return m.group(3)
    for d in (
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/lib64",
        "/usr/lib",
        "/lib",
    ):
        hits = sorted(glob.glob(os.path.join(d, soname + "*")))
        if hits:
            return hits[0]
    return None


def _bpf_permitted(euid: int | None = None, status: str | None = None) -> str | None:
    """None when this process may load BPF programs and uprobes, else the reason it may not."""
    euid = os.geteuid() if euid is None else euid
    if euid == 0:
        return None
    try:
        text = Path("/proc/self/status").read_text() if status is None else status
        m = re.search(r"CapEff:\s*([0-9a-fA-F]+)", text)
        cap = int(m.group(1), 16) if m else 0
    except (OSError, ValueError):
        cap = 0
    cap_sys_admin, cap_perfmon, cap_bpf = 1 << 21, 1 << 38, 1 << 39
    if cap & cap_sys_admin or (cap & cap_bpf and cap & cap_perfmon):
        return None
    return f"needs root or CAP_BPF+CAP_PERFMON (running as uid {euid} without them)"


def _import_bcc() -> Any:
    try:
        return importlib.import_module("bcc")
    except ImportError as e:
        raise EbpfUnavailable(
            f"bcc is not importable from this Python ({e}): install Debian's python3-bpfcc and run "
            "scripts/setup_ebpf.sh so the virtual environment sees it (never 'pip install bcc', "
            "an unrelated package)"
        ) from None


class Tracer:
    """Uprobes on libcuda, libcudart and libnccl, drained into one GPU's ring.

    Example::

        with Tracer.start(TracerConfig(gpu=0, pid=1234)) as tracer:
            tracer.run(seconds=10)
    """

    def __init__(
        self,
        config: TracerConfig,
        bpf: Any,
        ring: Ring,
        attached: list[str],
        skipped: list[str],
        launch_probes: list[tuple[bytes, bytes, bytes, bytes | None]] | None = None,
    ) -> None:
        self.config = config
        self._bpf = bpf
        # (library path, symbol, entry program, return program or None) of the launch uprobes,
        # attached only while launches are traced (launch_every)
        self._launch_probes = launch_probes or []
        self._launch_attached = False
        self._interval = 0  # drains so far: the duty cycle's clock
        self.launch_intervals = 0  # drain intervals during which launches were traced
        self.ring = ring
        self.attached = attached
        self.skipped = skipped
        self._names: dict[tuple[int, int, int], str] = {}
        self._launch_seen: dict[tuple[int, int, int], tuple[int, int, tuple[int, ...]]] = {}
        self.launches: dict[str, LaunchStats] = defaultdict(LaunchStats)
        self._outstanding: dict[int, int] = defaultdict(int)
        self._outstanding_sent: dict[int, int] = {}
        self._retired: dict[str, LaunchStats] = {}  # launches of processes that have exited, by name
        self._mono_to_real = time.time_ns() - time.monotonic_ns()
        self._stop = threading.Event()
        self._closed = False
        self.records_written = 0
        self.events_seen = 0
        bpf[b"events"].open_ring_buffer(self._on_event)

    @classmethod
    def start(cls, config: TracerConfig) -> Self:
        """Compile the BPF program and attach every probe whose library and symbol exist."""
        reason = _bpf_permitted()
        if reason is not None:
            raise EbpfUnavailable(f"BPF not permitted: {reason}")
        if config.pid is not None and not _alive(config.pid):
            raise EbpfUnavailable(f"no process {config.pid} to trace")
        bcc = _import_bcc()
        libs: dict[str, str] = {}
        overrides = {"cuda": config.libcuda, "cudart": config.libcudart, "nccl": config.libnccl}
        for key, override in overrides.items():
            if override is not None:
                if not os.path.exists(override):
                    raise EbpfUnavailable(f"no such library {override} (--lib{key})")
                libs[key] = os.path.realpath(override)
            else:
                found = find_library(_SONAMES[key], config.pid)
                if found is not None:
                    libs[key] = os.path.realpath(found)
        if not libs:
            raise EbpfUnavailable(
                "nothing to trace: libcuda.so.1, libcudart.so and libnccl.so.2 are not where the dynamic "
                "loader looks (no NVIDIA driver?); pass --libcuda/--libcudart/--libnccl PATH"
            )
        text = (
            BPF_TEXT.replace("__NAME_LEN__", str(NAME_LEN))
            .replace("__SAMPLE_N__", str(config.launch_sample))
            .replace("__LATENCY__", "1" if config.launch_latency else "0")
            .replace("FILTER", _filter(config.cgroup))
        )
        try:
            bpf = bcc.BPF(text=text.encode())
        except Exception as e:
            raise EbpfUnavailable(
                f"BPF program failed to load: {str(e)[:300]} (kernel headers under /lib/modules/{os.uname().release}/build? "
                "run scripts/setup_ebpf.sh)"
            ) from None
        attached: list[str] = []
        skipped: list[str] = []
        launch_probes: list[tuple[bytes, bytes, bytes, bytes | None]] = []
        pid = config.pid if config.pid is not None else -1
        for lib, sym, entry, ret in _PROBES:
            path = libs.get(lib)
            if path is None:
                skipped.append(f"{sym} (no {_SONAMES[lib]})")
                continue
            if ret == "launch_return" and not config.launch_latency:
                ret = None
            if entry.startswith("launch_"):  # attached by the duty cycle (launch_every), if at all
                if config.launch_every:
                    launch_probes.append(
                        (path.encode(), sym.encode(), entry.encode(), None if ret is None else ret.encode())
                    )
                continue
            try:
                # bcc wants bytes (str draws a DeprecationWarning)
                bpf.attach_uprobe(name=path.encode(), sym=sym.encode(), fn_name=entry.encode(), pid=pid)
                if ret is not None:
                    bpf.attach_uretprobe(name=path.encode(), sym=sym.encode(), fn_name=ret.encode(), pid=pid)
            except Exception as e:
                skipped.append(f"{sym} ({e})")
                continue
            attached.append(sym)
        tracer_ring = None
        name = ring_name(f"{config.label_prefix}{config.gpu}")
        # A ring this start creates goes again when it fails: a failed probe left a 2 MB ring
        # in /dev/shm that nothing drains. One that was there (an agent's) stays.
        created = not os.path.exists(f"/dev/shm{name}")
        try:
            tracer_ring = Ring.attach(name, create=True)
            tracer = cls(config, bpf, tracer_ring, attached, skipped, launch_probes)
            tracer._cycle_launches()  # the first interval traces launches whenever any does
        except BaseException:
            bpf.cleanup()
            if tracer_ring is not None:
                tracer_ring.close()
                if created:
                    Ring.unlink(name)
            raise
        if not tracer.attached:
            tracer.close()
            if created:
                Ring.unlink(name)
            off = " (launch uprobes are off: launch_every=0)" if not config.launch_every else ""
            raise EbpfUnavailable(
                f"no probe could be attached{off}: {'; '.join(skipped) or 'nothing else to trace'}"
            )
        return tracer

    def describe(self) -> str:
        who = (
            f"pid {self.config.pid}"
            if self.config.pid
            else f"cgroup {self.config.cgroup}"
            if self.config.cgroup
            else "all processes"
        )
        return f"{len(self.attached)} functions of {who} into {self.ring.name}"

    # ---- draining -------------------------------------------------------------------

    def run(self, seconds: float | None = None) -> None:
        """Drain every interval until ``seconds`` pass or close()."""
        end = None if seconds is None else time.monotonic() + seconds
        while not self._stop.is_set():
            self.drain()
            if end is not None and time.monotonic() >= end:
                return
            wait = self.config.drain_interval_s
            if end is not None:
                wait = min(wait, max(0.0, end - time.monotonic()))
            self._stop.wait(wait)
        self.drain()

    def drain(self) -> int:
        """Read pending events and the launch maps into the ring; returns records written.

        Also turns the launch uprobes on or off for the next interval (``launch_every``)."""
        before = self.records_written
        self._mono_to_real = time.time_ns() - time.monotonic_ns()
        self._bpf.ring_buffer_consume()
        self._flush_launches()
        self._forget_exited()
        self._flush_outstanding()
        self._interval += 1
        self._cycle_launches()
        return self.records_written - before

    @property
    def tracing_launches(self) -> bool:
        """Whether the launch uprobes are attached now."""
        return self._launch_attached

    def _cycle_launches(self) -> None:
        """Attach the launch uprobes for one interval in every ``launch_every``, detach them otherwise."""
        every = self.config.launch_every
        want = bool(self._launch_probes) and every > 0 and self._interval % every == 0
        if want == self._launch_attached:
            if want:
                self.launch_intervals += 1
            return
        pid = self.config.pid if self.config.pid is not None else -1
        for path, sym, entry, ret in self._launch_probes:
            name = sym.decode()
            if want:
                try:
                    self._bpf.attach_uprobe(name=path, sym=sym, fn_name=entry, pid=pid)
                    if ret is not None:
                        self._bpf.attach_uretprobe(name=path, sym=sym, fn_name=ret, pid=pid)
                except Exception as e:
                    if name not in self.skipped and all(not s.startswith(f"{name} (") for s in self.skipped):
                        self.skipped.append(f"{name} ({e})")
                    continue
                if name not in self.attached:
                    self.attached.append(name)
            else:
                with contextlib.suppress(Exception):
                    self._bpf.detach_uprobe(name=path, sym=sym, pid=pid)
                if ret is not None:
                    with contextlib.suppress(Exception):
                        self._bpf.detach_uretprobe(name=path, sym=sym, pid=pid)
        self._launch_attached = want
        if want:
            self.launch_intervals += 1

    def _forget_exited(self) -> None:
        """Fold the launch counts of processes that exited into per-name totals and drop their map entries.

        Without this the BPF maps (fixed size) would fill with the keys of
        long-gone processes on a machine that starts many.
        """
        pids = {k[0] for k in self._launch_seen} | set(self._outstanding)
        dead = {p for p in pids if not _alive(p)}
        if not dead:
            return
        launches = self._bpf[b"launches"]
        for key in [k for k in self._launch_seen if k[0] in dead]:
            count, sum_ns, hist = self._launch_seen.pop(key)
            r = self._retired.setdefault(self._name(*key), LaunchStats())
            r.count += count
            r.host_ns += sum_ns
            r.hist = [a + b for a, b in zip(r.hist, hist, strict=True)]
            with contextlib.suppress(KeyError):
                del launches[launches.Key(*key)]
        fnames = self._bpf[b"fnames"]
        for k in [k for k in fnames.keys() if int(k.pid) in dead]:  # noqa: SIM118  (a BPF map, not a dict)
            with contextlib.suppress(KeyError):
                del fnames[k]
        self._names = {k: v for k, v in self._names.items() if k[0] not in dead}
        for pid in dead:
            if self._outstanding.get(pid):
                self._outstanding[pid] = 0  # the driver frees a dead process's memory
        for pid in [
            p for p, n in self._outstanding.items() if p in dead and self._outstanding_sent.get(p) == n
        ]:
            del self._outstanding[pid]  # its 0 has been written

    def _flush_outstanding(self) -> None:
        ts = time.time_ns()
        for pid, n in self._outstanding.items():
            if self._outstanding_sent.get(pid) != n:
                self._outstanding_sent[pid] = n
                self._put(self.ring.sample(MetricId.CUDA_ALLOCATED_BYTES, self.config.gpu, ts, float(n), pid))

    def summary(self, top: int = 10) -> str:
        """A few lines for a person: the most launched kernels and what each process holds."""
        lines = [f"{'launches':>10} {'host us/launch':>14}  kernel"]
        ranked = sorted(self.launches.items(), key=lambda kv: -kv[1].count)[:top]
        for name, st in ranked:
            per = st.host_ns / st.count / 1e3 if st.count and st.host_ns else float("nan")
            lines.append(f"{st.count:>10} {per:>14.2f}  {name}")
        for pid, n in sorted(self.outstanding().items()):
            lines.append(f"pid {pid}: {n} bytes allocated and not freed")
        return "\n".join(lines)

    def outstanding(self) -> dict[int, int]:
        """Bytes allocated and not yet freed, per process, from what the tracer saw."""
        return {pid: n for pid, n in self._outstanding.items() if n}

    def _real(self, mono_ns: int) -> int:
        return mono_ns + self._mono_to_real

    def _put(self, rc: int) -> None:
        if rc == 0:
            self.records_written += 1

    def _name(self, pid: int, api: int, fn: int) -> str:
        key = (pid, api, fn)
        name = self._names.get(key)
        if name is not None:
            return name
        if api == 2:  # cudaLaunchKernel: fn is the host stub; its symbol is the kernel's name
            sym = self._bpf.sym(fn, pid, show_module=False, show_offset=False, demangle=True)
            text = sym.decode(errors="replace") if isinstance(sym, bytes) else str(sym)
            name = text if text and text != "[unknown]" else None
        else:
            fkey = self._bpf[b"fnames"].Key(pid, 0, fn)
            try:
                raw = self._bpf[b"fnames"][fkey].s
                name = bytes(raw).split(b"\0", 1)[0].decode(errors="replace") or None
            except KeyError:
                name = None
        if name is None:
            return f"unknown_0x{fn:x}"  # not cached: the name may be learnt later
        self._names[key] = name
        return name

    def _flush_launches(self) -> None:
        totals: dict[str, LaunchStats] = {}
        changed: set[str] = set()
        for k, v in self._bpf[b"launches"].items():
            key = (int(k.pid), int(k.api), int(k.fn))
            hist = tuple(int(x) for x in v.hist)
            now = (int(v.count), int(v.sum_ns), hist)
            prev = self._launch_seen.get(key)
            name = self._name(*key)
            if prev != now:
                self._launch_seen[key] = now
                changed.add(name)
        if not changed:
            return
        for name, r in self._retired.items():
            totals[name] = LaunchStats(r.count, r.host_ns, list(r.hist))
        for key, (count, sum_ns, hist) in self._launch_seen.items():
            name = self._name(*key)
            t = totals.setdefault(name, LaunchStats())
            t.count += count
            t.host_ns += sum_ns
            t.hist = [a + b for a, b in zip(t.hist, hist, strict=True)]
        ts = time.time_ns()
        dev = self.config.gpu
        for name in changed:
            t = totals[name]
            self.launches[name] = t
            sid = self.ring.intern(name)
            self._put(self.ring.sample(MetricId.LAUNCH_CALLS, dev, ts, float(t.count), sid))
            if self.config.launch_latency:
                self._put(self.ring.sample(MetricId.LAUNCH_HOST_TIME, dev, ts, t.host_ns / 1e9, sid))
                # Cumulative (Prometheus le) buckets up to the highest one used; the ones above
                # equal the call count, which the collector writes as the +Inf bucket.
                top = max((b for b, n in enumerate(t.hist) if n), default=-1)
                cumulative = 0
                for bucket in range(top + 1):
                    cumulative += t.hist[bucket]
                    aux = sid | bucket << 32
                    self._put(
                        self.ring.sample(MetricId.LAUNCH_HOST_LATENCY_BUCKET, dev, ts, float(cumulative), aux)
                    )

    def _on_event(self, _ctx: Any, data: Any, _size: int) -> None:
        e = ctypes.cast(data, ctypes.POINTER(_Event)).contents
        self.events_seen += 1
        ring = self.ring
        dev = self.config.gpu
        ts = self._real(int(e.ts))
        if e.type == EV_LAUNCH:
            sid = ring.intern(self._name(int(e.pid), int(e.kind), int(e.a)))
            self._put(ring.launch(sid, dev, ts, e.pid, e.tid, *e.dims))
        elif e.type == EV_MEMOP:
            kind = int(e.kind)
            status = int(e.status)
            if status == 0:
                sign = 1 if kind in (MemopKind.ALLOC, MemopKind.ALLOC_ASYNC) else -1
                self._outstanding[int(e.pid)] += sign * int(e.b)
            self._put(ring.memop(kind, dev, ts, e.a, e.b, e.pid, e.tid, status))
            if status == CUDA_ERROR_OUT_OF_MEMORY:
                what = (
                    f"{_MEMOP_CALL.get(kind, 'alloc')} of {int(e.b)} bytes failed: CUDA_ERROR_OUT_OF_MEMORY"
                )
                self._put(ring.error(ErrorKind.OOM, dev, ts, status, e.b, e.pid, ring.intern(what)))
        elif e.type == EV_SYNC:
            self._put(ring.sync(e.kind, dev, ts, e.dur, e.a, e.pid, e.tid))
        elif e.type == EV_COLLECTIVE:
            failed = 1 if e.status != 0 else 0
            self._put(ring.collective(e.kind, dev, ts, e.a, e.dur, e.b, e.rank, e.nranks, failed))

    def program_stats(self) -> dict[str, BpfProgramStats]:
        """Run time and run count of each loaded BPF program, from ``/proc/self/fdinfo/<prog fd>``.

        The counters only advance while BPF statistics are enabled
        (``bpf_run_time_stats()``); they are cumulative since the program was loaded.
        """
        stats: dict[str, BpfProgramStats] = {}
        for name, fn in self._bpf.funcs.items():
            key = name.decode() if isinstance(name, bytes) else str(name)
            stats[key] = _read_prog_fdinfo(int(fn.fd))
        return stats

    # ---- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Detach every probe and close the ring; safe twice."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._bpf.cleanup()
        self.ring.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _read_prog_fdinfo(fd: int) -> BpfProgramStats:
    fields: dict[str, int] = {}
    for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("run_time_ns", "run_cnt"):
            fields[key] = int(value.strip())
    if len(fields) != 2:
        raise EbpfUnavailable(f"fd {fd} reports no BPF run-time statistics (kernel older than 5.1?)")
    return BpfProgramStats(fields["run_time_ns"], fields["run_cnt"])


_BPF_ENABLE_STATS = 32  # bpf(2) command; attr: u32 type
_BPF_STATS_RUN_TIME = 0
_NR_BPF = {"x86_64": 321, "aarch64": 280}


@contextlib.contextmanager
def bpf_run_time_stats() -> Iterator[str]:
    """Have the kernel account BPF programs' run time while the block runs; yields how it was enabled.

    Uses the ``BPF_ENABLE_STATS`` command (Linux 5.8), whose fd keeps the
    statistics on until it is closed, so a crash cannot leave them on; else
    sets ``kernel.bpf_stats_enabled`` and restores the previous value.  The
    statistics cost two clock reads per program run, so they stay off otherwise.
    """
    nr = _NR_BPF.get(os.uname().machine)
    if nr is not None:
        libc = ctypes.CDLL(None, use_errno=True)
        attr = (ctypes.c_uint32 * 2)(_BPF_STATS_RUN_TIME, 0)
        fd = libc.syscall(nr, _BPF_ENABLE_STATS, ctypes.byref(attr), ctypes.sizeof(attr))
        if fd >= 0:
            try:
                yield "BPF_ENABLE_STATS"
            finally:
                os.close(fd)
            return
    knob = Path("/proc/sys/kernel/bpf_stats_enabled")
    try:
        previous = knob.read_text().strip()
        knob.write_text("1\n")
    except OSError as e:
        raise EbpfUnavailable(f"cannot enable BPF run-time statistics: {e}") from None
    try:
        yield "kernel.bpf_stats_enabled"
    finally:
        knob.write_text(previous + "\n")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _filter(cgroup: str | None) -> str:
    if cgroup is None:
        return ""
    try:
        cgid = os.stat(cgroup).st_ino  # a cgroup v2 directory's inode number is its id
    except OSError as e:
        raise EbpfUnavailable(f"no cgroup {cgroup}: {e.strerror}") from None
    return f"if (bpf_get_current_cgroup_id() != {cgid}ULL) return 1;"
