"""The CUPTI activity probe (agent/cupti/) in a workload, against the stand-in CUPTI and driver
(tests/probe/c/): what reaches the ring, and that nothing the probe meets breaks the workload."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections import Counter

import pytest
from cupti_standins import ROOT, CuptiBuild, build_cupti
from probeutil import drain, names_of

from kernel_insight.agent import Ring, ring_name
from kernel_insight.agent.metric_ids import MetricId
from kernel_insight.agent.probe.cupti import cupti_environment
from kernel_insight.agent.records import (
    KernelRecord,
    LaunchRecord,
    MemopKind,
    MemopRecord,
    Record,
    RecordFlag,
    SampleRecord,
    SyncKind,
    SyncRecord,
)

FILL = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_"
CUTLASS = (
    "_ZN7cutlass7Kernel2I66cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8EEvNT_6ParamsE"
)
CUBLAS = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
TRITON = "triton_poi_fused_add_mul_0"
NLL = "_ZN2at6native12_GLOBAL__N_138nll_loss_forward_reduce_cuda_kernel_2dIflEEvPT_S4_PKT0_l"
READABLE = {
    FILL: "at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >",
    CUTLASS: "cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>",
    CUBLAS: CUBLAS,
    TRITON: TRITON,
    NLL: "at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, long>",
}
CORRELATION_TAG = 1 << 62


@pytest.fixture(scope="module")
def cupti(tmp_path_factory: pytest.TempPathFactory) -> CuptiBuild:
    return build_cupti(tmp_path_factory.mktemp("cupti"))


def run(b: CuptiBuild, prefix: str, *args: str, **env: str) -> tuple[dict[str, int], str]:
    done = subprocess.run(
        [str(b.workload), *args],
        env=b.env(prefix, **env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def rings(prefix: str, n: int, capacity: int = 1 << 16) -> list[Ring]:
    return [Ring.create(ring_name(f"{prefix}{i}"), capacity=capacity) for i in range(n)]


def of(records: list[Record], cls: type) -> list:
    return [r for r in records if isinstance(r, cls)]


def samples(records: list[Record]) -> dict[int, float]:
    """The last value of each of the probe's counts."""
    return {r.metric: r.value for r in of(records, SampleRecord)}


def kernel_args(*names: str) -> list[str]:
    return [a for n in names for a in ("--kernel", n)]


def test_every_kernel_copy_memset_and_sync_reaches_the_ring_with_its_launch(cupti, label_prefix):
    rings(label_prefix, 1)
    before = time.time_ns()
    did, err = run(cupti, label_prefix, "--steps", "20", "--nvtx", *kernel_args(FILL, CUBLAS, TRITON))
    after = time.time_ns()
    assert err == ""
    recs = drain(ring_name(f"{label_prefix}0"))
    names = names_of(recs)
    kernels = of(recs, KernelRecord)
    assert len(kernels) == did["kernels"] == 60
    by_name = Counter(names.get(k.producer, k.name_id) for k in kernels)
    assert by_name == {READABLE[FILL]: 20, CUBLAS: 20, TRITON: 20}
    for k in kernels:  # kernel i of a step runs 1 + i us on the stand-in's GPU
        index = [READABLE[FILL], CUBLAS, TRITON].index(names.get(k.producer, k.name_id))
        assert k.end_ns - k.start_ns == 1000 * (1 + index)
        assert before <= k.start_ns <= after, "CUPTI's clock mapped to the ring's (CLOCK_REALTIME)"
        assert k.pid == did["pid"]
        assert k.device == 0
        assert k.stream == 100
        assert k.correlation & CORRELATION_TAG
    launches = {(r.pid, r.grid[0] | r.grid[1] << 32): r for r in of(recs, LaunchRecord)}
    assert len(launches) == 60
    for k in kernels:
        launch = launches[(k.pid, k.correlation)]
        assert launch.flags & RecordFlag.LAUNCH_SPAN
        assert launch.function_id == k.name_id
        assert launch.tid > 0
        assert before <= launch.ts_ns <= k.start_ns + 1_000_000, "launched (host) before it ran"
        assert names.get(launch.producer, launch.block[0]).startswith("layer."), "the NVTX range around it"
    memops = Counter(MemopKind(m.kind) for m in of(recs, MemopRecord))
    assert memops == {MemopKind.MEMCPY: 20, MemopKind.MEMSET: 20}
    assert {m.nbytes for m in of(recs, MemopRecord) if m.kind == MemopKind.MEMCPY} == {4096}
    syncs = of(recs, SyncRecord)
    assert len(syncs) == 20
    assert {s.kind for s in syncs} == {SyncKind.STREAM}
    assert {s.handle for s in syncs} == {100}
    counts = samples(recs)
    written = len(kernels) + len(launches) + 40 + len(syncs)
    assert counts[MetricId.CUPTI_RECORDS] == written
    assert counts.get(MetricId.CUPTI_DROPPED, 0) == 0
    assert counts.get(MetricId.CUPTI_RING_REFUSED, 0) == 0


def test_names_are_demangled_and_kept_under_the_limit(cupti, label_prefix):
    rings(label_prefix, 1)
    long_c = "k" * 3000  # an extern "C" name far over the ring's limit
    run(
        cupti, label_prefix, "--steps", "1", *kernel_args(NLL, CUTLASS, FILL, long_c), KI_CUPTI_NAME_MAX="100"
    )
    recs = drain(ring_name(f"{label_prefix}0"))
    names = names_of(recs)
    got = {names.get(k.producer, k.name_id) for k in of(recs, KernelRecord)}
    assert got == {
        READABLE[NLL],
        READABLE[CUTLASS],
        # 106 bytes in full: the nested template arguments go first
        "at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<...>, at::detail::Array<...> >",
        "k" * 97 + "...",
    }


def test_names_past_every_shortening_are_cut(cupti, label_prefix):
    rings(label_prefix, 1)
    run(cupti, label_prefix, "--steps", "1", *kernel_args(FILL, CUTLASS), KI_CUPTI_NAME_MAX="40")
    recs = drain(ring_name(f"{label_prefix}0"))
    names = names_of(recs)
    got = {names.get(k.producer, k.name_id) for k in of(recs, KernelRecord)}
    assert got == {"at::native::vectorized_elementwise_ke...", "cutlass::Kernel2<...>"}


def test_two_gpus_each_get_their_own_records_and_names(cupti, label_prefix):
    rings(label_prefix, 2)
    did, _ = run(cupti, label_prefix, "--gpus", "2", "--steps", "5", *kernel_args(TRITON, FILL))
    for gpu in (0, 1):
        recs = drain(ring_name(f"{label_prefix}{gpu}"))
        names = names_of(recs)
        kernels = of(recs, KernelRecord)
        assert len(kernels) == did["kernels"] // 2 == 10
        assert {k.device for k in kernels} == {gpu}
        assert {names.get(k.producer, k.name_id) for k in kernels} == {TRITON, READABLE[FILL]}
        assert {s.device for s in of(recs, SyncRecord)} == {gpu}, "syncs placed by their context's device"


def test_without_a_ring_the_workload_runs_and_the_probe_says_so_once(cupti, label_prefix):
    did, err = run(cupti, label_prefix, "--steps", "50", "--threads", "2")
    assert did["kernels"] == 100
    lines = [line for line in err.splitlines() if line.startswith("ki-cupti:")]
    assert len(lines) == 1, err
    assert "counted and dropped until the ring exists" in lines[0]


def test_a_workload_that_never_initialises_cuda_sees_nothing_of_the_probe(cupti, label_prefix):
    rings(label_prefix, 1)
    did, err = run(cupti, label_prefix, "--no-init")
    assert did["kernels"] == 0
    assert err == ""
    assert drain(ring_name(f"{label_prefix}0")) == []


def test_a_refused_kind_is_said_once_and_the_others_go_on(cupti, label_prefix):
    rings(label_prefix, 1)
    did, err = run(cupti, label_prefix, "--steps", "5", KIFAKE_CUPTI_REFUSE="38")  # SYNCHRONIZATION
    assert err.count("ki-cupti:") == 1
    assert "SYNCHRONIZATION refused: CUPTI_ERROR_NOT_COMPATIBLE" in err
    recs = drain(ring_name(f"{label_prefix}0"))
    assert len(of(recs, KernelRecord)) == did["kernels"]
    assert of(recs, SyncRecord) == []


def test_without_kernel_activity_the_probe_steps_aside(cupti, label_prefix):
    rings(label_prefix, 1)
    did, err = run(cupti, label_prefix, "--steps", "5", KIFAKE_CUPTI_REFUSE="10")  # CONCURRENT_KERNEL
    assert did["kernels"] == 5
    assert "no kernel activity: stepping aside" in err
    assert drain(ring_name(f"{label_prefix}0")) == []


def test_a_cuda_12_cupti_is_read_and_an_older_one_is_not(cupti, label_prefix):
    rings(label_prefix, 1)
    did, err = run(cupti, label_prefix, "--steps", "3", KIFAKE_CUPTI_VERSION="18")  # CUDA 12.0
    assert err == ""
    assert len(of(drain(ring_name(f"{label_prefix}0")), KernelRecord)) == did["kernels"]
    did, err = run(cupti, label_prefix, "--steps", "3", KIFAKE_CUPTI_VERSION="17")
    assert "CUPTI API version 17 is older than CUDA 12's (18)" in err
    assert drain(ring_name(f"{label_prefix}0")) == []


def test_another_subscriber_leaves_kernels_without_their_launches(cupti, label_prefix):
    rings(label_prefix, 1)
    did, err = run(cupti, label_prefix, "--steps", "5", KIFAKE_CUPTI_NO_SUBSCRIBE="1")
    assert "another CUPTI tool?" in err
    recs = drain(ring_name(f"{label_prefix}0"))
    assert len(of(recs, KernelRecord)) == did["kernels"]
    assert of(recs, LaunchRecord) == []


def test_an_empty_buffer_pool_drops_records_and_counts_every_one(cupti, label_prefix):
    """Two 4 KiB buffers (about 18 kernel records each) and CUPTI holding full buffers until the
    flush: requests find the pool empty, CUPTI drops; kernels written + dropped = kernels run."""
    rings(label_prefix, 1)
    did, err = run(
        cupti, label_prefix, "--steps", "100", KI_CUPTI_BUFFERS="2", KI_CUPTI_BUFFER_KB="4",
        KI_CUPTI_FLUSH_MS="60000", KIFAKE_CUPTI_HOLD="8",
    )  # fmt: skip
    assert err.count("ki-cupti: all 2 activity buffers are in use") == 1
    recs = drain(ring_name(f"{label_prefix}0"))
    counts = samples(recs)
    kept = len(of(recs, KernelRecord)) + len(of(recs, MemopRecord)) + len(of(recs, SyncRecord))
    assert 0 < kept < 4 * did["kernels"]
    assert kept + counts[MetricId.CUPTI_DROPPED] == 4 * did["kernels"], "kernel, copy, memset, sync per step"
    assert counts[MetricId.CUPTI_POOL_EXHAUSTED] > 0
    with Ring.attach(ring_name(f"{label_prefix}0")) as r:  # what the agent ships as its counter
        assert r.stats()["cupti_dropped"] == counts[MetricId.CUPTI_DROPPED]


def test_a_full_ring_refuses_records_and_they_are_counted(cupti, label_prefix):
    rings(label_prefix, 1, capacity=64)
    did, _ = run(cupti, label_prefix, "--steps", "200")
    recs = drain(ring_name(f"{label_prefix}0"))
    assert len(recs) <= 64
    with Ring.attach(ring_name(f"{label_prefix}0")) as r:
        stats = r.stats()
    assert stats["dropped"] > 0, "the ring counted its refusals too"
    # Every record the probe meant to write is in the ring or in the header's count, which the
    # agent ships as ki_agent_cupti_refused_records_total: a kernel and its launch, a copy, a
    # memset and a sync per step.
    written = len(of(recs, KernelRecord)) + len(of(recs, LaunchRecord)) + len(of(recs, MemopRecord))
    written += len(of(recs, SyncRecord))
    assert stats["cupti_refused"] > 0
    assert written + stats["cupti_refused"] == 5 * did["kernels"]
    assert stats["cupti_refused"] <= stats["dropped"], "a full ring's refusals are among its drops"


def test_a_forked_child_writes_nothing_and_exits(cupti, label_prefix):
    rings(label_prefix, 1)
    did, _ = run(cupti, label_prefix, "--fork", "--threads", "2", "--steps", "100")
    assert did["child_status"] == 0
    kernels = of(drain(ring_name(f"{label_prefix}0")), KernelRecord)
    assert {k.pid for k in kernels} == {did["pid"]}
    assert len(kernels) == len({k.correlation for k in kernels}) == did["kernels"]


def test_a_flush_racing_the_exit_loses_and_repeats_nothing(cupti, label_prefix):
    rings(label_prefix, 1, capacity=1 << 17)
    for _ in range(5):
        did, _ = run(
            cupti, label_prefix, "--flush-race", "--threads", "4", "--steps", "200", KI_CUPTI_FLUSH_MS="1"
        )
        kernels = of(drain(ring_name(f"{label_prefix}0")), KernelRecord)
        assert len(kernels) == len({k.correlation for k in kernels}) == did["kernels"] == 800


@pytest.mark.parametrize("seed", range(1, 9))
def test_a_fuzzed_activity_stream_never_breaks_the_workload(cupti, label_prefix, seed):
    rings(label_prefix, 4)
    _did, _ = run(cupti, label_prefix, "--fuzz", f"{seed}:3000", "--steps", "2", KI_CUPTI_NAME_MAX="96")
    for gpu in range(4):
        recs = drain(ring_name(f"{label_prefix}{gpu}"))  # every record decodes
        names = names_of(recs)
        for k in of(recs, KernelRecord):
            assert k.device == gpu
            name = names.get(k.producer, k.name_id)
            assert name is not None
            assert len(name.encode()) <= 96
        if gpu == 0:  # records for GPUs without a ring (4-63) or past 63 are counted, with GPU 0's
            assert samples(recs)[MetricId.CUPTI_RING_REFUSED] > 0


SAN_CFLAGS = "-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"


def test_a_fuzzed_stream_under_asan_and_ubsan(tmp_path, label_prefix):
    """The probe and the stand-ins built with AddressSanitizer and UBSan (the workload loads them
    through LD_PRELOAD'ed runtimes): fuzzed records, forks, two GPUs and a flush racing the exit
    end without one report (a fuzzed timestamp overflowed int64 in the clock mapping before)."""
    runtimes = []
    for name in ("libasan.so", "libubsan.so"):
        path = subprocess.run(
            ["gcc", "-print-file-name=" + name], capture_output=True, text=True
        ).stdout.strip()
        if not path.startswith("/"):
            pytest.skip(f"gcc has no {name} here: no sanitizer build")
        runtimes.append(path)
    out = tmp_path / "san"
    out.mkdir()
    subprocess.run(
        ["make", "-s", "-C", str(ROOT / "agent" / "cupti"), f"OUT={out}", f"CFLAGS={SAN_CFLAGS}", "all", "standins"],
        check=True, capture_output=True,
    )  # fmt: skip
    b = CuptiBuild(out / "libki_cupti.so.1", out, out / "cupti_workload")
    rings(label_prefix, 4)
    for seed in (1, 2, 3):
        env = b.env(
            label_prefix, LD_PRELOAD=" ".join(runtimes), ASAN_OPTIONS="detect_leaks=0", KI_CUPTI_NAME_MAX="40"
        )
        done = subprocess.run(
            [str(b.workload), "--fuzz", f"{seed}:4000", "--steps", "20", "--nvtx", "--threads", "2", "--gpus", "2",
             "--fork", "--flush-race"],
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert "runtime error" not in done.stderr
        assert "ERROR: AddressSanitizer" not in done.stderr


def test_the_c_metric_ids_are_the_python_ones():
    header = (ROOT / "agent" / "cupti" / "ki_cupti.h").read_text()
    ids = dict(re.findall(r"#define KI_METRIC_(CUPTI_\w+) (\d+)", header))
    assert {k: int(v) for k, v in ids.items()} == {
        m.name: int(m) for m in MetricId if m.name.startswith("CUPTI_")
    }


def test_ki_probe_cupti_runs_the_command_with_the_probe(cupti, label_prefix, tmp_path):
    rings(label_prefix, 1)
    env = cupti.env(label_prefix, KI_CUPTI_INJECTION=str(cupti.probe))
    del env["CUDA_INJECTION64_PATH"]
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "ki"), "probe", "cupti", "--label-prefix", label_prefix, "--",
         str(cupti.workload), "--steps", "3"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(of(drain(ring_name(f"{label_prefix}0")), KernelRecord)) == 3


def test_ki_probe_cupti_says_what_is_missing(tmp_path):
    ki = str(ROOT / ".venv" / "bin" / "ki")
    none = subprocess.run([ki, "probe", "cupti"], capture_output=True, text=True, timeout=60, check=False)
    assert none.returncode == 1
    assert "no command to run" in none.stderr
    gone = subprocess.run(
        [ki, "probe", "cupti", "--", "true"], capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "KI_CUPTI_INJECTION": str(tmp_path / "nope.so")},
    )  # fmt: skip
    assert gone.returncode == 2
    assert "CUPTI injection library not found" in gone.stderr


def test_the_environment_names_the_probe_and_keeps_a_users_nvtx_injection(tmp_path):
    lib = tmp_path / "libki_cupti.so.1"
    env = cupti_environment({"NVTX_INJECTION64_PATH": "/x/libcupti.so"}, label_prefix="p", library=lib)
    assert env["CUDA_INJECTION64_PATH"] == str(lib)
    assert env["KI_PROBE_LABEL_PREFIX"] == "p"
    assert env["NVTX_INJECTION64_PATH"] == "/x/libcupti.so"
    assert cupti_environment({"KI_CUPTI_LIBRARY": "/y.so"}, library=lib)["NVTX_INJECTION64_PATH"] == "/y.so"


def test_the_package_build_makes_the_probe():
    """make build (setup.py) puts it beside ki-agent, where ki probe cupti looks."""
    lib = ROOT / "agent" / "bin" / "libki_cupti.so.1"
    assert lib.is_file(), "run make build"
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    exported = {line.split()[-1] for line in out.stdout.splitlines()}
    assert "InitializeInjection" in exported
    assert not {s for s in exported if s.startswith("ki_")}, "only the driver's entry point is exported"
