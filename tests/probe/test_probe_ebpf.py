"""The eBPF tracer against stand-in libcuda/libcudart/libnccl built from C: it must report exactly the pattern."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from probeutil import HERE, ROOT, compile_c, drain, names_of

from kernel_insight.agent import ring_name
from kernel_insight.agent.metric_ids import MetricId
from kernel_insight.agent.probe import ebpf
from kernel_insight.agent.probe.ebpf import (
    EbpfUnavailable,
    Tracer,
    TracerConfig,
    _bpf_permitted,
    find_library,
)
from kernel_insight.agent.records import (
    CollectiveOp,
    CollectiveRecord,
    ErrorKind,
    ErrorRecord,
    LaunchRecord,
    MemopKind,
    MemopRecord,
    RecordFlag,
    SampleRecord,
    SyncKind,
    SyncRecord,
)
from kernel_insight.cli import main

C = HERE / "c"
MS = 1_000_000
MIB = 1 << 20


@pytest.fixture(scope="session")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in libraries and the two programs that call them, in one directory."""
    d = tmp_path_factory.mktemp("cuda")
    lib = ["-shared", "-fPIC", "-fvisibility=hidden"]
    compile_c([*lib, "-Wl,-soname,libcuda.so.1", str(C / "fake_cuda.c")], d / "libcuda.so.1")
    compile_c([*lib, "-Wl,-soname,libcudart.so.12", str(C / "fake_cudart.c")], d / "libcudart.so.12")
    compile_c([*lib, "-Wl,-soname,libnccl.so.2", str(C / "fake_nccl.c")], d / "libnccl.so.2")
    link = [f"-L{d}", "-l:libcuda.so.1", "-l:libcudart.so.12", "-l:libnccl.so.2", f"-Wl,-rpath,{d}"]
    compile_c([str(C / "cuda_pattern.c"), *link], d / "cuda_pattern")
    compile_c([str(C / "launch_loop.c"), *link], d / "launch_loop")
    return d


class Program:
    """cuda_pattern: waits for "go", runs the pattern, waits for end of input (so it can be symbolised)."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen([str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        assert self.proc.stdin is not None
        assert self.proc.stdout.readline().strip() == "ready"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def go(self) -> None:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "done"

    def finish(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        assert self.proc.wait(timeout=10) == 0


def start(config: TracerConfig) -> Tracer:
    """Start the tracer, or skip the test saying why BPF cannot run here."""
    try:
        return Tracer.start(config)
    except EbpfUnavailable as e:
        text = str(e)
        if (
            text.startswith(("BPF not permitted", "bcc is not importable"))
            or "Operation not permitted" in text
        ):
            pytest.skip(f"BPF not permitted: {text}")
        raise


def config(d: Path, prefix: str, **kw: object) -> TracerConfig:
    kw.setdefault("launch_every", 1)  # launches traced in every interval unless a test says otherwise
    return TracerConfig(
        label_prefix=prefix,
        libcuda=str(d / "libcuda.so.1"),
        libcudart=str(d / "libcudart.so.12"),
        libnccl=str(d / "libnccl.so.2"),
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def programs(stand_ins: Path) -> Iterator[list[Program]]:
    progs: list[Program] = []
    yield progs
    for p in progs:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()
        for f in (p.proc.stdin, p.proc.stdout):
            if f is not None:
                f.close()


@pytest.mark.ebpf
def test_tracer_reports_exactly_the_pattern_of_the_traced_process(stand_ins, label_prefix, programs):
    traced, other = Program(stand_ins / "cuda_pattern"), Program(stand_ins / "cuda_pattern")
    programs += [traced, other]
    with start(config(stand_ins, label_prefix, pid=traced.pid, launch_sample=1)) as tracer:
        other.go()  # the same calls from a process that is not traced
        traced.go()
        tracer.drain()
        outstanding = tracer.outstanding()
        launches = dict(tracer.launches)
        traced.finish()
        other.finish()
    recs = drain(ring_name(f"{label_prefix}0"))
    table = names_of(recs)

    def name(sid: int) -> str | None:
        return table.get(recs[0].producer, sid)

    # launches: counted in the kernel, per kernel name, every launch API
    assert {n: s.count for n, s in launches.items()} == {
        "gemm_kernel": 1000,
        "flash_attn_fwd_kernel_with_a_name_longer_than_32_bytes": 500,
        "ki_runtime_kernel_stub": 300,
    }
    assert all(sum(s.hist) == s.count and s.host_ns > 0 for s in launches.values())
    calls = {
        name(r.aux): r.value
        for r in recs
        if isinstance(r, SampleRecord) and r.metric == MetricId.LAUNCH_CALLS
    }
    assert calls == {n: float(s.count) for n, s in launches.items()}
    buckets = [
        r for r in recs if isinstance(r, SampleRecord) and r.metric == MetricId.LAUNCH_HOST_LATENCY_BUCKET
    ]
    last = max(r.ts_ns for r in buckets if name(r.aux & 0xFFFFFFFF) == "gemm_kernel")
    gemm = [r.value for r in buckets if name(r.aux & 0xFFFFFFFF) == "gemm_kernel" and r.ts_ns == last]
    assert gemm == sorted(gemm)  # cumulative le buckets, lowest first
    assert gemm[-1] == 1000  # the highest bucket holds every call
    # sampled per-launch records (1 in 1): grid and block as passed
    dims = Counter((name(r.function_id), r.grid, r.block) for r in recs if isinstance(r, LaunchRecord))
    assert dims == {
        ("gemm_kernel", (128, 1, 1), (256, 1, 1)): 1000,
        ("flash_attn_fwd_kernel_with_a_name_longer_than_32_bytes", (64, 2, 1), (128, 1, 1)): 500,
        ("ki_runtime_kernel_stub", (4, 4, 1), (32, 8, 1)): 300,
    }
    assert {r.pid for r in recs if isinstance(r, LaunchRecord)} == {traced.pid}
    # memory: the allocation trajectory, sizes on frees, the failure, what is left outstanding
    mem = [
        (r.kind, r.nbytes, r.status, bool(r.flags & RecordFlag.FAILED))
        for r in recs
        if isinstance(r, MemopRecord)
    ]
    assert mem == [
        (MemopKind.ALLOC, 1 * MIB, 0, False),
        (MemopKind.ALLOC, 3 * MIB, 0, False),
        (MemopKind.ALLOC_ASYNC, 5 * MIB, 0, False),
        (MemopKind.FREE, 1 * MIB, 0, False),
        (MemopKind.FREE_ASYNC, 5 * MIB, 0, False),
        (MemopKind.ALLOC, 2 << 40, 2, True),
    ]
    addrs = [r.address for r in recs if isinstance(r, MemopRecord)]
    assert addrs[3] == addrs[0]
    assert addrs[4] == addrs[2]
    assert addrs[5] == 0
    assert outstanding == {traced.pid: 3 * MIB}
    held = [r for r in recs if isinstance(r, SampleRecord) and r.metric == MetricId.CUDA_ALLOCATED_BYTES]
    assert [(r.aux, r.value) for r in held] == [(traced.pid, 3.0 * MIB)]
    (oom,) = [r for r in recs if isinstance(r, ErrorRecord)]
    assert (oom.kind, oom.code, oom.aux, oom.pid) == (ErrorKind.OOM, 2, 2 << 40, traced.pid)
    assert "CUDA_ERROR_OUT_OF_MEMORY" in (name(oom.detail_id) or "")
    # synchronisation waits, with their durations (20, 10 and 5 ms of sleep in the stand-in)
    syncs = [r for r in recs if isinstance(r, SyncRecord)]
    assert [(r.kind, r.handle) for r in syncs] == [
        (SyncKind.STREAM, 5),
        (SyncKind.CONTEXT, 0),
        (SyncKind.EVENT, 0x77),
    ]
    for r, ms in zip(syncs, [20, 10, 5], strict=True):
        assert ms * MS <= r.duration_ns < (ms + 40) * MS
    # NCCL: op, bytes, rank/nranks from ncclCommInitRank, host-side latency
    colls = [r for r in recs if isinstance(r, CollectiveRecord)]
    assert [(r.op, r.nbytes) for r in colls] == [
        (CollectiveOp.ALLREDUCE, 4 * MIB),
        (CollectiveOp.ALLREDUCE, 4 * MIB),
        (CollectiveOp.ALLREDUCE, 4 * MIB),
        (CollectiveOp.ALLGATHER, 2000),
        (CollectiveOp.REDUCESCATTER, 2048),
        (CollectiveOp.BROADCAST, 10),
        (CollectiveOp.SEND, 400),
        (CollectiveOp.RECV, 400),
        (CollectiveOp.GROUP, 800),
    ]
    assert all((r.rank, r.nranks) == (2, 4) for r in colls[:8])
    assert len({r.comm for r in colls[:8]}) == 1
    assert all(2 * MS <= r.duration_ns < 42 * MS for r in colls[:6])
    assert 3 * MS <= colls[8].duration_ns < 43 * MS
    assert not any(r.flags & RecordFlag.FAILED for r in colls)


@pytest.mark.ebpf
def test_launch_uprobes_are_off_by_default_and_trace_one_interval_in_n(stand_ins, label_prefix, programs):
    progs = [Program(stand_ins / "cuda_pattern") for _ in range(4)]
    programs += progs
    with start(config(stand_ins, label_prefix, launch_every=0)) as tracer:
        assert not tracer.tracing_launches
        assert "cuLaunchKernel" not in tracer.attached
        progs[0].go()
        tracer.drain()
        assert tracer.launches == {}  # no launch trapped
        assert tracer.outstanding() == {progs[0].pid: 3 * MIB}  # memory calls still traced
    with start(config(stand_ins, label_prefix, launch_every=2)) as tracer:
        seen = []
        for prog in progs[1:]:  # intervals 0 (traced), 1 (not), 2 (traced)
            seen.append(tracer.tracing_launches)
            prog.go()
            tracer.drain()
        assert seen == [True, False, True]
        assert tracer.launch_intervals == 2  # intervals 0 and 2; the third drain began interval 3
        assert {n: s.count for n, s in tracer.launches.items()} == {
            "gemm_kernel": 2000,
            "flash_attn_fwd_kernel_with_a_name_longer_than_32_bytes": 1000,
            "ki_runtime_kernel_stub": 600,
        }
    for prog in progs:
        prog.finish()


@pytest.mark.ebpf
def test_bpf_run_time_is_counted_per_call_only_while_stats_are_enabled(stand_ins, label_prefix):
    def launches(n: int) -> None:
        subprocess.run(
            [str(stand_ins / "launch_loop"), str(n)], input="go\n", text=True, check=True, capture_output=True
        )

    with start(config(stand_ins, label_prefix)) as tracer:
        before = tracer.program_stats()
        assert {"launch_drv_entry", "launch_return"} <= set(before)
        with ebpf.bpf_run_time_stats():
            launches(1000)
            during = tracer.program_stats()
        launches(500)
        after = tracer.program_stats()
    entry = during["launch_drv_entry"].run_cnt - before["launch_drv_entry"].run_cnt
    assert entry == 1000
    assert during["launch_return"].run_cnt - before["launch_return"].run_cnt == 1000
    assert during["launch_drv_entry"].run_time_ns > before["launch_drv_entry"].run_time_ns
    # off again once the block ends (unless something else on the machine turned them on)
    if Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip() == "0":
        assert after["launch_drv_entry"] == during["launch_drv_entry"]


@pytest.mark.ebpf
def test_launch_records_are_sampled_but_counts_stay_exact(stand_ins, label_prefix, programs):
    prog = Program(stand_ins / "cuda_pattern")
    programs.append(prog)
    with start(
        config(stand_ins, label_prefix, pid=prog.pid, launch_sample=100, launch_latency=False)
    ) as tracer:
        prog.go()
        tracer.drain()
        counts = {n: s.count for n, s in tracer.launches.items()}
        prog.finish()
        tracer.drain()  # the process has exited: its map entries go, its counts stay
        tracer.drain()
        after = {n: s.count for n, s in tracer.launches.items()}
        assert tracer.outstanding() == {}
        assert len(tracer._bpf[b"launches"]) == 0
        assert len(tracer._bpf[b"fnames"]) == 0
    recs = drain(ring_name(f"{label_prefix}0"))
    assert after == counts
    held = [
        (r.aux, r.value)
        for r in recs
        if isinstance(r, SampleRecord) and r.metric == MetricId.CUDA_ALLOCATED_BYTES
    ]
    assert held == [(prog.pid, 3.0 * MIB), (prog.pid, 0.0)]
    assert sum(1 for r in recs if isinstance(r, LaunchRecord)) == 18
    assert counts["gemm_kernel"] == 1000
    assert sum(counts.values()) == 1800


@pytest.mark.ebpf
@pytest.mark.slow
def test_cli_traces_a_pid_until_its_time_is_up(stand_ins, label_prefix, programs):
    prog = Program(stand_ins / "cuda_pattern")
    programs.append(prog)
    cmd = [
        sys.executable,
        "-m",
        "kernel_insight.cli",
        "probe",
        "ebpf",
        "--pid",
        str(prog.pid),
        "--seconds",
        "2",
        "--launch-every",
        "1",
    ]
    cmd += ["--label-prefix", label_prefix, "--libcuda", str(stand_ins / "libcuda.so.1")]
    cmd += ["--libcudart", str(stand_ins / "libcudart.so.12"), "--libnccl", str(stand_ins / "libnccl.so.2")]
    cli = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert cli.stderr is not None
    line = cli.stderr.readline()
    if cli.poll() is not None or "tracing" not in line:
        rest = cli.stderr.read()
        cli.wait()
        cli.stderr.close()
        if "BPF not permitted" in line + rest or "bcc is not importable" in line + rest:
            pytest.skip(f"BPF not permitted: {line + rest}")
        raise AssertionError(line + rest)
    prog.go()
    assert cli.wait(timeout=30) == 0
    summary = cli.stderr.read()
    cli.stderr.close()
    assert "1000" in summary
    assert "gemm_kernel" in summary
    assert f"pid {prog.pid}: {3 * MIB} bytes allocated and not freed" in summary
    prog.finish()
    recs = drain(ring_name(f"{label_prefix}0"))
    assert sum(1 for r in recs if isinstance(r, SyncRecord)) == 3
    assert sum(1 for r in recs if isinstance(r, CollectiveRecord)) == 9
    last: dict[int, float] = {}  # cumulative counters: a drain may land mid-pattern, the last value counts
    for r in recs:
        if isinstance(r, SampleRecord) and r.metric == MetricId.LAUNCH_CALLS:
            last[r.aux] = r.value
    assert sorted(last.values()) == [300.0, 500.0, 1000.0]


@pytest.mark.parametrize(
    ("euid", "cap_eff", "allowed"),
    [
        (0, "0000000000000000", True),
        (1000, "0000000000000000", False),
        (1000, "0000000000200000", True),  # CAP_SYS_ADMIN
        (1000, "000000c000000000", True),  # CAP_BPF and CAP_PERFMON
        (1000, "0000008000000000", False),  # CAP_BPF alone
    ],
)
def test_bpf_permission_follows_uid_and_capabilities(euid, cap_eff, allowed):
    reason = _bpf_permitted(euid, f"Name:\tpython\nCapEff:\t{cap_eff}\n")
    assert (reason is None) == allowed
    if not allowed:
        assert reason == f"needs root or CAP_BPF+CAP_PERFMON (running as uid {euid} without them)"


def test_cli_without_bpf_permission_says_so(label_prefix, monkeypatch, capsys):
    monkeypatch.setattr(
        ebpf, "_bpf_permitted", lambda: "needs root or CAP_BPF+CAP_PERFMON (running as uid 1000)"
    )
    rc = main(["probe", "ebpf", "--label-prefix", label_prefix, "--seconds", "1"])
    assert rc == 2
    assert capsys.readouterr().err.startswith("ki probe ebpf: BPF not permitted: needs root")


def test_library_is_found_in_the_traced_process_mapping(stand_ins, programs):
    prog = Program(stand_ins / "cuda_pattern")
    programs.append(prog)
    assert find_library("libcuda.so.1", prog.pid) == str(stand_ins / "libcuda.so.1")
    assert find_library("libnccl.so.2", prog.pid) == str(stand_ins / "libnccl.so.2")
    assert find_library("libcudart.so", prog.pid) == str(stand_ins / "libcudart.so.12")
    prog.go()
    prog.finish()


def test_library_is_found_on_ld_library_path(stand_ins, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", f"/nonexistent:{stand_ins}")
    assert find_library("libnccl.so.2") == str(stand_ins / "libnccl.so.2")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"pid": 1, "cgroup": "/sys/fs/cgroup"}, "not both"),
        ({"pid": -3}, "invalid pid"),
        ({"launch_sample": -1}, "launch_sample"),
        ({"drain_interval_s": 0}, "interval"),
    ],
)
def test_bad_tracer_config_is_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        TracerConfig(**kw)


def test_tracing_a_process_that_does_not_exist_is_refused(stand_ins):
    if os.geteuid() != 0:
        pytest.skip("BPF not permitted: not root, the permission check comes first")
    dead = subprocess.Popen(["true"])
    dead.wait()
    with pytest.raises(EbpfUnavailable, match=f"no process {dead.pid} to trace"):
        Tracer.start(config(stand_ins, "unused-", pid=dead.pid))


def test_missing_library_override_is_refused_clearly(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("BPF not permitted: not root, the permission check comes first")
    try:
        import bcc  # noqa: F401
    except ImportError as e:
        pytest.skip(f"BPF not permitted: bcc not importable ({e})")
    with pytest.raises(EbpfUnavailable, match=r"no such library /nonexistent/libcuda\.so\.1"):
        Tracer.start(TracerConfig(libcuda="/nonexistent/libcuda.so.1"))


@pytest.mark.ebpf
def test_a_probe_that_cannot_attach_leaves_no_ring_behind(label_prefix):
    """Issue 33: ``ki probe ebpf`` that failed (exit 2) left a 2 MB ring in /dev/shm. A library
    without the CUDA symbols (libc) compiles the program, creates the ring, then attaches nothing."""
    if os.geteuid() != 0:
        pytest.skip("BPF not permitted: not root, the permission check comes first")
    libc = "/lib/x86_64-linux-gnu/libc.so.6"
    if not os.path.exists(libc):
        pytest.skip(f"no {libc} to point --libcuda at")
    out = subprocess.run(
        [sys.executable, "-m", "kernel_insight.cli", "probe", "ebpf", "--label-prefix", label_prefix,
         "--libcuda", libc, "--seconds", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "no probe could be attached" in out.stderr
    assert not os.path.exists(f"/dev/shm{ring_name(label_prefix + '0')}")


def _cgroup2_root() -> Path | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] == "cgroup2":
            return Path(parts[1])
    return None


@pytest.mark.ebpf
def test_cgroup_filter_traces_only_that_cgroups_processes(stand_ins, label_prefix, programs):
    root = _cgroup2_root()
    if root is None or not os.access(root, os.W_OK):
        pytest.skip("no writable cgroup v2 hierarchy to make a test cgroup in")
    group = root / f"ki-probe-test-{os.getpid()}"
    group.mkdir()
    try:
        inside, outside = Program(stand_ins / "cuda_pattern"), Program(stand_ins / "cuda_pattern")
        programs += [inside, outside]
        (group / "cgroup.procs").write_text(str(inside.pid))
        with start(config(stand_ins, label_prefix, cgroup=str(group))) as tracer:
            outside.go()
            inside.go()
            tracer.drain()
            counts = {n: s.count for n, s in tracer.launches.items()}
            inside.finish()
            outside.finish()
        recs = drain(ring_name(f"{label_prefix}0"))
    finally:
        for p in programs:  # one write per pid: cgroup.procs takes a single pid per write(2)
            if p.proc.poll() is None:
                (root / "cgroup.procs").write_text(f"{p.pid}\n")
        group.rmdir()
    assert counts == {
        "gemm_kernel": 1000,
        "flash_attn_fwd_kernel_with_a_name_longer_than_32_bytes": 500,
        "ki_runtime_kernel_stub": 300,
    }
    assert {r.pid for r in recs if isinstance(r, SyncRecord)} == {inside.pid}
