"""The CUPTI probe's records the whole way: a workload on the stand-in driver loads the probe at
cuInit (CUDA_INJECTION64_PATH), the probe writes the ring, ki-agent ships it, the collector stores
it, kql and the timeline API answer (docs/probes.md, "CUPTI activity probe")."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Iterator

import httpx
from agent_harness import wait_for
from cupti_standins import build_cupti
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from support.collector import RunningCollector, running_collector

from kernel_insight.agent.ring import Ring, ring_name
from kernel_insight.collector.keys import read_key_file
from kernel_insight.sdk import KqlClient

FILL = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_"
FILL_READABLE = "at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >"
TRITON = "triton_poi_fused_add_mul_0"
STEPS = 50


@contextlib.contextmanager
def ring_agent_collector(
    agent_bin, tmp_path, name: str, capacity: int
) -> Iterator[tuple[RunningCollector, str]]:
    """Ring name (created), a collector, and ki-agent draining the one into the other; yields the
    collector and the instance the agent reports as. Everything is gone afterwards."""
    Ring.create(name, capacity=capacity).close()
    try:
        with running_collector(tmp_path) as c:
            key = tmp_path / "agent.key"
            c.agent.write_key_file(key)
            with (tmp_path / "agent.log").open("w") as out:
                agent = subprocess.Popen(
                    [str(agent_bin), "--ring", name, "--collector", c.url, "--key-file", str(key),
                     "--spool-dir", str(tmp_path / "spool"), "--drain-interval-ms", "20", "--histograms=0",
                     "--shutdown-timeout-s", "10"],
                    stdout=out, stderr=subprocess.STDOUT,
                )  # fmt: skip
            try:
                yield c, read_key_file(key).agent_id.hex()
            finally:
                agent.terminate()
                agent.wait(30)
    finally:
        with contextlib.suppress(OSError):
            Ring.unlink(name)


def test_every_kernel_reaches_kql_and_the_timeline_with_its_launch(tmp_path, agent_bin):
    cupti = build_cupti(tmp_path / "cupti")
    prefix = f"cupti-e2e-{uuid.uuid4().hex[:8]}-"
    name = ring_name(f"{prefix}0")
    with ring_agent_collector(agent_bin, tmp_path, name, 1 << 14) as (c, instance):
        before = time.time()
        done = subprocess.run(
            [str(cupti.workload), "--steps", str(STEPS), "--nvtx", "--kernel", FILL, "--kernel", TRITON],
            env=cupti.env(prefix), capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        did = json.loads(done.stdout.strip().splitlines()[-1])
        after = time.time()
        with KqlClient(c.url, c.read_token) as kql:

            def launches() -> dict[str, float]:
                res = kql.query(f'sum by (kernel) (kernel_launches_total{{instance="{instance}"}})')
                return {s.labels["kernel"]: s.value for s in res.samples}

            wait_for(lambda: sum(launches().values()) >= did["kernels"], 90, "every kernel counted")
            assert launches() == {FILL_READABLE: STEPS, TRITON: STEPS}

            def total(expr: str) -> float:
                # The newest sample over the run: the stand-in runs all steps within a few
                # milliseconds, and two batches' samples of a counter at the same millisecond
                # are not told apart by an instant query (the report of issue 37).
                return sum(s.value for s in kql.query(f"max_over_time({expr}[10m])").samples)

            sel = f'instance="{instance}"'
            want = {
                f'gpu_memory_operations_total{{{sel},kind="memcpy"}}': STEPS,
                f'gpu_memory_operations_total{{{sel},kind="memset"}}': STEPS,
                f"cuda_syncs_total{{{sel}}}": STEPS,
                # per step: 2 kernels with their launches, a copy, a memset, a sync
                f"ki_cupti_records_total{{{sel}}}": STEPS * 7,
            }
            wait_for(lambda: all(total(q) >= n for q, n in want.items()), 60, "copies, memsets, syncs")
            assert {q: total(q) for q in want} == want
        window = {"instance": instance, "gpu": 0, "from": before - 1, "to": after + 1}
        auth = {"Authorization": f"Bearer {c.read_token}"}
        spans = httpx.get(
            c.url + "/v1/timeline/spans", params={**window, "limit": 1000}, headers=auth, timeout=30
        ).json()["spans"]
        assert len(spans) == did["kernels"]
        # The workload launches kernel k inside the NVTX ranges "step" > "layer.k".
        layer = {FILL_READABLE: "layer.0", TRITON: "layer.1"}
        for s in spans:  # the host side of each kernel, joined by correlation
            assert s["pid"] == did["pid"]
            assert s["tid"] > 0
            assert 0 < s["launch_ns"] <= s["start_ns"]
            assert s["end_ns"] - s["start_ns"] == (1000 if s["kernel"] == FILL_READABLE else 2000)
            assert s["nvtx_range"] == layer[s["kernel"]]
        # The exports carry the range in each kernel slice's args.
        export = c.url + "/v1/timeline/export"
        doc = httpx.get(export, params={**window, "format": "json"}, headers=auth, timeout=30).json()
        kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
        assert len(kernels) == did["kernels"]
        assert {(e["name"], e["args"]["nvtx_range"]) for e in kernels} == set(layer.items())
        proto = httpx.get(export, params={**window, "format": "perfetto"}, headers=auth, timeout=30)
        begins = [
            p.track_event
            for p in pb.Trace.FromString(proto.content).packet
            if p.track_event.type == pb.TrackEvent.TYPE_SLICE_BEGIN and "kernel" in p.track_event.categories
        ]
        assert len(begins) == did["kernels"]
        notes = {
            (ev.name, a.string_value) for ev in begins for a in ev.debug_annotations if a.name == "nvtx_range"
        }
        assert notes == set(layer.items())


def test_records_cupti_dropped_and_the_ring_refused_reach_kql_as_agent_counters(tmp_path, agent_bin):
    """A pool of two 4 KiB buffers that CUPTI holds until the flush (it drops the rest) and a ring of
    64 slots that the burst at the flush overfills: both counts, as the ring header has them, are
    the agent's ki_agent_cupti_dropped_records_total and ki_agent_cupti_refused_records_total."""
    cupti = build_cupti(tmp_path / "cupti")
    prefix = f"cupti-ctr-{uuid.uuid4().hex[:8]}-"
    name = ring_name(f"{prefix}0")
    with ring_agent_collector(agent_bin, tmp_path, name, 64) as (c, instance):
        subprocess.run(
            [str(cupti.workload), "--steps", "400"],
            env=cupti.env(prefix, KI_CUPTI_BUFFERS="2", KI_CUPTI_BUFFER_KB="4", KI_CUPTI_FLUSH_MS="60000",
                          KIFAKE_CUPTI_HOLD="8"),
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        with Ring.attach(name) as r:
            header = r.stats()
        assert header["cupti_dropped"] > 0
        assert header["cupti_refused"] > 0
        want = {
            "ki_agent_cupti_dropped_records_total": header["cupti_dropped"],
            "ki_agent_cupti_refused_records_total": header["cupti_refused"],
        }
        with KqlClient(c.url, c.read_token) as kql:

            def counters() -> dict[str, float]:
                got = {}
                for metric in want:
                    res = kql.query(f'max_over_time({metric}{{instance="{instance}"}}[10m])')
                    got[metric] = sum(s.value for s in res.samples)
                return got

            wait_for(lambda: counters() == want, 60, f"the agent's counters at {want}")
