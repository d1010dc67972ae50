"""What an agent with histograms on puts on the wire per second (issue 14's wire budget,
docs/agent.md "Kernel histograms and kept spans"): kept spans wait in memory and go out in about
one batch a second (``span_seal_ms``), none of them lost, and SIGTERM seals what waits.
"""

from __future__ import annotations

import math
import subprocess
import time
from pathlib import Path

import numpy as np
from agent_harness import setup

from bench.histogram.producer import build_producer
from kernel_insight.collector import wire

REPO = Path(__file__).resolve().parents[2]

RATE, SECONDS = 20_000, 2


def _run(
    tmp: Path, agent_bin: Path, ring_name: str, seal_ms: int, seconds: int = SECONDS
) -> tuple[int, int, int, int]:
    """(batches with kernel spans, spans received, spans the agent says it kept, whole seconds the
    producer took: ``seconds`` on a quiet machine, more on a loaded one, where it falls behind its pace)."""
    producer = build_producer(tmp)
    with setup(tmp, agent_bin, ring_name, capacity=1 << 16) as s:
        agent = s.start(
            "--histograms=1", "--span-sample-rate", "200", "--span-tail-rate", "50",
            "--histogram-interval-s", "1", "--span-seal-ms", str(seal_ms),
        )  # fmt: skip
        started = time.monotonic()
        done = subprocess.run(
            [str(producer), ring_name, str(RATE * seconds), "10", str(RATE), "3"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        took = math.ceil(time.monotonic() - started)
        assert done.returncode == 0, done.stderr
        assert agent.stop(timeout=30) == 0, agent.log()[-3000:]
        got = s.receiver.got
        with_spans = [b for b in got.batches.values() if len(b.arrays.get(1, ())) > 0]
        spans = sum(len(b.arrays[1]) for b in with_spans)
        # Body version 4 (3's correlation as the delta of correlation - pos, histogram increments),
        # and 5 (4 leaving out names already sent) once batches get through, decoded exactly: the
        # producer writes its names first, then kernel i with correlation i, so correlation - pos
        # is one constant and every kept kernel is a different one.
        assert {b.body_version for b in got.batches.values()} <= {4, 5}
        arr = np.concatenate([b.arrays[1] for b in with_spans])
        corr = arr["payload"].copy().view(wire._PAYLOAD_DTYPE[1])["correlation"].astype(np.int64)
        assert len(set((corr - arr["pos"].astype(np.int64)).tolist())) == 1
        assert len(set(corr.tolist())) == len(corr)
        c = got.last_counters()
        kept = sum(
            c.get(int(k), 0)
            for k in (wire.Counter.SPANS_TAIL, wire.Counter.SPANS_SAMPLED, wire.Counter.SPANS_CAPTURED)
        )
        assert c[int(wire.Counter.KERNELS_AGGREGATED)] == RATE * seconds
        return len(with_spans), spans, kept, took


def test_kept_spans_go_out_about_once_a_second_and_none_is_lost(
    tmp_path: Path, agent_bin: Path, ring_name: str
) -> None:
    batches, spans, kept, seconds = _run(tmp_path, agent_bin, ring_name, 1000)
    assert spans == kept > 200  # every kept span arrived, the last ones sealed by SIGTERM
    # 2 s of production at a 20 ms drain tick: ~100 ticks with spans; held, one batch a second of
    # production (plus the first histogram export, which seals what waits, and the last at SIGTERM).
    assert batches <= seconds + 3, (batches, seconds)


def test_span_seal_ms_below_the_tick_seals_every_tick(
    tmp_path: Path, agent_bin: Path, ring_name: str
) -> None:
    # 4 s of production: ~200 ticks with spans at 20 ms, and still 20 when a loaded machine runs the
    # agent five times less often than its tick asks
    batches, spans, kept, _ = _run(tmp_path, agent_bin, ring_name, 1, seconds=2 * SECONDS)
    assert spans == kept > 200
    assert batches >= 20, batches  # the former behaviour: a batch per drain tick that read spans
