"""Kubernetes attribution through the wire (issue 38): the GPU's holder as the NVML sampler writes it
(FINGERPRINT POD, NAMESPACE, CONTAINER records, tests/probe/test_probe_kubelet.py writes them from a
stand-in kubelet) crosses the real ki-agent and ``ki collector`` with the kernels, and every stored
span names the pod that held the GPU when it started, one written after the next pod came too."""

from __future__ import annotations

import time

import pytest
from support.collector import running_collector, start_agent

from kernel_insight.agent.records import FingerprintField
from kernel_insight.agent.ring import Ring
from kernel_insight.sdk import TimelineClient

S = 1_000_000_000


@pytest.mark.slow
def test_spans_shipped_by_the_agent_keep_the_pod_of_their_start(tmp_path, agent_bin, ring_name):
    t0 = (time.time_ns() // S - 60) * S
    ring = Ring.create(ring_name, capacity=1 << 14)

    def holder(ts: int, pod: str, namespace: str, container: str) -> None:  # as agent/probe/nvml.py writes it
        for field, text in ((FingerprintField.POD, pod), (FingerprintField.NAMESPACE, namespace),
                            (FingerprintField.CONTAINER, container)):  # fmt: skip
            assert ring.fingerprint(field, 0, ts, ring.intern(text), 1) == 0

    def kernel(name: str, start: int, corr: int) -> None:
        assert ring.kernel(ring.intern(name), 0, start, start + 1000, 7, corr, 42) == 0

    kernel("before", t0, 1)
    holder(t0 + 1 * S, "train-0", "ml", "main")
    kernel("step", t0 + 2 * S, 2)
    holder(t0 + 3 * S, "", "", "")  # the trainer ends
    holder(t0 + 4 * S, "serve-0", "serving", "engine")
    kernel("decode", t0 + 5 * S, 3)
    kernel("step_tail", t0 + 2 * S + 500, 4)  # the trainer's, written after the server came
    try:
        with running_collector(tmp_path) as c:
            c.agent.write_key_file(tmp_path / "agent.key")
            instance = c.agent.agent_id.hex()
            agent = start_agent(tmp_path, agent_bin, ring_name, c.url, "--drain-interval-ms", "100")
            try:
                with TimelineClient(c.url, c.read_token) as tl:
                    deadline = time.monotonic() + 120
                    while len(spans := tl.spans(instance, 0, t0 / S, t0 / S + 10)) < 4:
                        assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
                        assert time.monotonic() < deadline, f"{len(spans)} spans stored after 120 s"
                        time.sleep(0.5)
                    held = {s.kernel: (s.pod, s.namespace, s.container) for s in spans}
                    assert held == {
                        "before": ("", "", ""),
                        "step": ("train-0", "ml", "main"),
                        "step_tail": ("train-0", "ml", "main"),
                        "decode": ("serve-0", "serving", "engine"),
                    }
                    mine = tl.spans(instance, 0, t0 / S, t0 / S + 10, pod="train-0")
                    assert sorted(s.kernel for s in mine) == ["step", "step_tail"]
            finally:
                agent.terminate()
                agent.wait(60)
    finally:
        ring.close()  # the fixture removes it
