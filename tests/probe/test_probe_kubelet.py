"""Kubernetes attribution: the NVML sampler asks a stand-in kubelet (PodResourcesLister over a unix
socket, the real podresources v1 protos) which pod holds each GPU, and the collector labels that
GPU's series and kernel spans with pod, namespace and container, following pods as they come and go."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubelet_standin import Pod, StandInKubelet
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from trace_check import check_trace

from kernel_insight.agent import Ring, RingReader, ring_name
from kernel_insight.agent.probe.kubelet import Attribution, KubeletUnavailable, PodResources
from kernel_insight.agent.probe.nvml import NvmlSampler
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.derive import Deriver
from kernel_insight.collector.perfetto_trace import perfetto_trace
from kernel_insight.collector.spans import SpanWindow, read_spans, summarize
from kernel_insight.collector.trace import chrome_trace

pytestmark = pytest.mark.nvml

UUID0 = "GPU-0b1c2d3e-0000-4000-8000-000000000000"  # GPU 0's in SCRIPT; GPU 1 has none: by index
S = 1_000_000_000
T0 = 1_800_000_000 * S


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[StandInKubelet]:
    with StandInKubelet(tmp_path / "kubelet.sock") as k:
        yield k


def trainer(*gpus: str) -> Pod:
    return Pod("llama-train-0", "ml", {"trainer": {"nvidia.com/gpu": list(gpus)}, "sidecar": {"cpu": ["3"]}})


def gpu_labels(deriver: Deriver, records: object, gpu: int) -> dict[str, dict[str, str]]:
    """Each series name of ``gpu`` -> its labels, from one derived batch."""
    derived = deriver.derive(records)  # type: ignore[arg-type]
    out = {}
    for labels in derived.samples.series:
        d = dict(labels)
        if d.get("gpu") == str(gpu):
            out[d["__name__"]] = d
    return out


def sampler(fake_nvml: Path, label_prefix: str, kubelet: StandInKubelet, now: list[int]) -> NvmlSampler:
    """GPUs 0 and 1 of the NVML stand-in, asking ``kubelet`` every 10 s of the clock ``now[0]``."""
    return NvmlSampler.open(
        [0, 1],
        library=str(fake_nvml),
        label_prefix=label_prefix,
        events=False,
        kubelet_socket=str(kubelet.socket),
        pods_every_s=10,
        clock=lambda: now[0],
    )


def read(prefix: str, gpu: int) -> object:
    with RingReader.open(ring_name(f"{prefix}{gpu}")) as reader:
        return reader.read_array()


def test_the_client_lists_gpu_devices_by_container(kubelet):
    kubelet.set_pods(
        trainer(UUID0),
        Pod("mig-job", "batch", {"main": {"nvidia.com/mig-1g.10gb": ["MIG-abc"]}}),
        Pod("web", "default", {"nginx": {"example.com/nic": ["eth1"]}}),
    )
    with PodResources(str(kubelet.socket)) as client:
        assert client.gpus() == {
            UUID0: Attribution("llama-train-0", "ml", "trainer"),
            "MIG-abc": Attribution("mig-job", "batch", "main"),
        }


def test_a_kubelet_that_is_not_there_is_said_plainly(tmp_path):
    with (
        PodResources(str(tmp_path / "none.sock"), timeout_s=1) as client,
        pytest.raises(KubeletUnavailable, match=r"none\.sock: UNAVAILABLE"),
    ):
        client.gpus()


def test_series_and_kernels_of_a_gpu_carry_its_pod_while_it_holds_the_gpu(
    fake_nvml, script, label_prefix, kubelet
):
    kubelet.set_pods(trainer(UUID0, "1"))  # GPU 0 by UUID, GPU 1 by index (DEVICE_ID_STRATEGY=index)
    now = [T0]
    deriver = Deriver("host-1")  # GPU 0's agent (one agent, one Deriver, per ring)
    with sampler(fake_nvml, label_prefix, kubelet, now) as s:
        s.sample_once()
        assert s.kubelet_error == ""
        with Ring.attach(ring_name(f"{label_prefix}0")) as ring:  # a kernel of the workload on GPU 0
            ring.kernel(ring.intern("gemm_bf16"), 0, T0 + 1000, T0 + 3000, 7, 1, 42)
        got = gpu_labels(deriver, read(label_prefix, 0), 0)
        pod = {"pod": "llama-train-0", "namespace": "ml", "container": "trainer"}
        for name in ("gpu_temperature_celsius", "DCGM_FI_DEV_GPU_UTIL", "kernel_launches_total"):
            assert pod.items() <= got[name].items(), name
        gpu1 = gpu_labels(Deriver("host-1"), read(label_prefix, 1), 1)
        assert pod.items() <= gpu1["gpu_memory_used_bytes"].items()

        # The pod ends: within the refresh period the GPU's series lose the labels.
        kubelet.set_pods()
        now[0] += 5 * S
        s.sample_once()  # not due yet: nothing asked
        assert "pod" in gpu_labels(deriver, read(label_prefix, 0), 0)["gpu_temperature_celsius"]
        calls = kubelet.calls
        now[0] += 5 * S
        s.sample_once()
        assert kubelet.calls == calls + 1
        after = gpu_labels(deriver, read(label_prefix, 0), 0)
        assert "pod" not in after["gpu_temperature_celsius"]
        assert "namespace" not in after["DCGM_FI_DEV_GPU_UTIL"]

        # A new pod comes; then the kubelet goes away: the last answer stands, and the reason is kept.
        kubelet.set_pods(Pod("vllm-0", "serving", {"engine": {"nvidia.com/gpu": [UUID0]}}))
        now[0] += 10 * S
        s.sample_once()
        assert gpu_labels(deriver, read(label_prefix, 0), 0)["gpu_power_watts"]["pod"] == "vllm-0"
        kubelet.stop()
        now[0] += 10 * S
        s.sample_once()
        assert "UNAVAILABLE" in s.kubelet_error
        assert gpu_labels(deriver, read(label_prefix, 0), 0)["gpu_power_watts"]["namespace"] == "serving"


def test_the_instance_attributes_name_each_gpus_pod(fake_nvml, script, label_prefix, kubelet):
    kubelet.set_pods(trainer(UUID0))
    with NvmlSampler.open(
        [0, 1],
        library=str(fake_nvml),
        label_prefix=label_prefix,
        events=False,
        kubelet_socket=str(kubelet.socket),
    ) as s:
        s.sample_once()
        deriver = Deriver("host-1")
        (inst,) = deriver.derive(read(label_prefix, 0)).instances  # type: ignore[arg-type]
    assert inst.attributes["gpu0.pod"] == "llama-train-0"
    assert inst.attributes["gpu0.container"] == "trainer"


def test_each_span_keeps_the_pod_that_held_its_gpu_when_it_ran_through_storage_and_reads(
    fake_nvml, script, label_prefix, kubelet, tmp_path
):
    """Pods come and go on GPU 0; the kernels of each reach the store with the pod of their start,
    however late they arrive (a CUPTI buffer flushed after the next pod came keeps its pod), and the
    span reads, summary and both exports filter on and show it."""
    t0 = (time.time_ns() // S - 600) * S  # recent: the store keeps spans 7 days
    now = [t0]
    deriver = Deriver("host-1")
    store = EmbeddedStore(tmp_path / "store")
    serving = Pod("vllm-0", "serving", {"engine": {"nvidia.com/gpu": [UUID0]}})

    def kernel(name: str, start: int, corr: int) -> None:
        with Ring.attach(ring_name(f"{label_prefix}0")) as ring:
            ring.kernel(ring.intern(name), 0, start, start + 2000, 7, corr, 42)

    def ship() -> None:  # one agent batch: what the ring holds, derived and stored
        store.insert_spans(deriver.derive(read(label_prefix, 0)).spans)  # type: ignore[arg-type]

    try:
        with sampler(fake_nvml, label_prefix, kubelet, now) as s:
            kernel("before_any_pod", t0 - S, 1)  # ran before the probe knew any holder
            kubelet.set_pods(trainer(UUID0))
            s.sample_once()
            kernel("train_step", t0 + S, 2)
            ship()
            kubelet.set_pods()  # the trainer ends ...
            now[0] += 10 * S
            s.sample_once()
            kubelet.set_pods(serving)  # ... and the server comes
            now[0] += 10 * S
            s.sample_once()
            kernel("decode", t0 + 21 * S, 3)
            kernel("idle_probe", t0 + 15 * S, 4)  # between the pods
            kernel("train_tail", t0 + 5 * S, 5)  # the trainer's, flushed late: after the server came
            ship()
        window = SpanWindow("host-1", 0, t0 - 2 * S, t0 + 60 * S)
        spans, _ = read_spans(store, window, 100)
        owner = {sp["kernel"]: (sp["pod"], sp["namespace"], sp["container"]) for sp in spans}
        assert owner == {
            "before_any_pod": ("", "", ""),
            "train_step": ("llama-train-0", "ml", "trainer"),
            "train_tail": ("llama-train-0", "ml", "trainer"),
            "idle_probe": ("", "", ""),
            "decode": ("vllm-0", "serving", "engine"),
        }

        def kernels(**holder: str) -> list[str]:
            w = dataclasses.replace(window, **holder)
            return sorted(sp["kernel"] for sp in read_spans(store, w, 100)[0])

        assert kernels(pod="llama-train-0") == ["train_step", "train_tail"]
        assert kernels(namespace="serving", container="engine") == ["decode"]
        assert kernels(pod="") == ["before_any_pod", "idle_probe"]  # no pod held the GPU
        assert kernels(pod="llama-train-0", namespace="serving") == []
        summary = summarize(store, dataclasses.replace(window, pod="llama-train-0"), 10, 5)
        assert sorted(k["kernel"] for k in summary["kernels"]) == ["train_step", "train_tail"]
        assert {sp["pod"] for k in summary["kernels"] for sp in k["slowest"]} == {"llama-train-0"}

        trace = check_trace(chrome_trace(store, window))["doc"]
        args = {e["name"]: e["args"] for e in trace["traceEvents"] if e.get("ph") == "X"}
        assert (args["decode"]["pod"], args["decode"]["container"]) == ("vllm-0", "engine")
        assert "pod" not in args["idle_probe"]
        proto = pb.Trace.FromString(perfetto_trace(store, dataclasses.replace(window, namespace="ml")))
        notes = {
            p.track_event.name: {a.name: a.string_value for a in p.track_event.debug_annotations}
            for p in proto.packet
            if p.track_event.type == pb.TrackEvent.TYPE_SLICE_BEGIN
        }
        assert set(notes) == {"train_step", "train_tail"}
        assert notes["train_tail"]["pod"] == "llama-train-0"
    finally:
        store.close()
