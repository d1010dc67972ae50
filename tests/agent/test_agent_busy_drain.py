"""A ring that fills faster than the ticks drain it is drained before them (docs/agent.md, "The loop").

At 1M kernels/s the default ring (32,768 slots) holds 33 ms of records, less than one 100 ms
tick: without drains paced by the producers' rate, a probe that fast drops two thirds of what it
writes. Scaled down here so the margins are wide on a loaded machine: a 8,192-slot ring at
5k records/s (1.6 s of records: a drain may come 0.8 s late) under an 8 s tick.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from agent_harness import PacedProducer, setup, wait_for

from kernel_insight.agent import Ring
from kernel_insight.collector import wire

RATE = 5_000  # records/s
CAPACITY = 8192  # slots: 1.6 s of records
INTERVAL_MS = 8000  # a tick drains 5x the ring's worth
STEP_S = INTERVAL_MS / 4000  # the scenario's times, in seconds at a 4 s tick


def test_a_ring_filling_faster_than_the_ticks_is_drained_before_them(agent_bin: Path, tmp_path: Path) -> None:
    with setup(tmp_path, agent_bin, f"/ki_test_busy.{os.getpid()}", capacity=CAPACITY) as s:
        agent = s.start("--drain-interval-ms", str(INTERVAL_MS), "--histograms=1")
        agent.prioritize()  # its drains are what is judged, not the machine's scheduling
        wait_for(lambda: "started:" in agent.log(), 20, "agent start")
        t0 = time.monotonic()  # the agent's first tick (an empty ring) is now
        producer = PacedProducer(s.ring, RATE, catch_up=False)  # never above RATE, also on a loaded machine
        producer.start()
        try:
            # The first tick that sees records (t0 + 4 steps) gives the agent the producers' rate
            # (what it read and what the full ring dropped); it drains before the ticks from
            # then on. Until then the ring overflows, as it must: the agent has not seen the
            # rate yet.
            time.sleep(max(0.0, t0 + 5.5 * STEP_S - time.monotonic()))
            settled = s.ring.stats()["dropped"]
            written_settled = producer.written
            # a tick at t0 + 8 steps lies in between
            time.sleep(max(0.0, t0 + 10.5 * STEP_S - time.monotonic()))
            end = s.ring.stats()["dropped"]
            written_end = producer.written
        finally:
            producer.stop_flag.set()
            producer.join()
        assert settled > 0, "the ring never overflowed before the rate was known: the scenario did not happen"
        assert written_end - written_settled > 3 * CAPACITY
        assert producer.dropped == end  # the ring's count is the producer's
        assert end == settled, (
            f"{end - settled} of {written_end - written_settled} records dropped after the agent knew the rate"
            f" ({producer.skipped} not written while the producer was not scheduled)"
        )
        wait_for(lambda: s.ring.stats()["fill"] == 0, 20, "the agent to drain the ring")
        assert agent.stop() == 0
    counters = s.receiver.got.last_counters()
    assert counters.get(wire.Counter.BUSY_DRAINS, 0) >= 8, counters  # ~1.2 a second from t0 + 4 steps
    assert counters[wire.Counter.KERNELS_AGGREGATED] == written_end - end


def test_a_rate_that_grows_by_half_between_two_drains_loses_nothing(agent_bin: Path, tmp_path: Path) -> None:
    """The margin busy drains at half a ring keep (docs/agent.md, "The loop"): paced at the rate of the
    last interval, the ring is three quarters full at the next drain when the rate grew by half just
    after the last one, and drops nothing; paced for three quarters of the ring it would overflow."""
    base, grown = RATE // 2, RATE * 3 // 4  # 1.6 s between busy drains at the base rate
    with setup(tmp_path, agent_bin, f"/ki_test_burst.{os.getpid()}", capacity=CAPACITY) as s:
        agent = s.start("--drain-interval-ms", str(INTERVAL_MS), "--histograms=1")
        agent.prioritize()  # its drains are what is judged, not the machine's scheduling
        wait_for(lambda: "started:" in agent.log(), 20, "agent start")
        t0 = time.monotonic()
        producer = PacedProducer(s.ring, base, catch_up=False)
        producer.start()
        try:
            time.sleep(
                max(0.0, t0 + 5.5 * STEP_S - time.monotonic())
            )  # the first tick gave the agent the rate
            settled = s.ring.stats()["dropped"]
            written_settled = producer.written
            # Three jumps, each 2 steps after the last fall back (the pace settled at the base rate),
            # each right after a drain: the worst case, a whole interval at the new rate.
            for _ in range(3):
                _after_a_drain(s.ring)
                producer.set_rate(grown)
                time.sleep(2.0 * STEP_S)
                producer.set_rate(base)
                time.sleep(2.0 * STEP_S)
            end = s.ring.stats()["dropped"]
            written_end = producer.written
        finally:
            producer.stop_flag.set()
            producer.join()
        assert written_end - written_settled > 5 * CAPACITY
        assert producer.dropped == end
        assert end == settled, (
            f"{end - settled} of {written_end - written_settled} records dropped when the rate grew by half"
            f" ({producer.skipped} not written while the producer was not scheduled)"
        )
        wait_for(lambda: s.ring.stats()["fill"] == 0, 20, "the agent to drain the ring")
        assert agent.stop() == 0
    counters = s.receiver.got.last_counters()
    assert counters[wire.Counter.KERNELS_AGGREGATED] == written_end - end


def _after_a_drain(ring: Ring) -> None:
    """Returns as soon as the ring's fill falls: the agent has just drained it."""
    last = ring.stats()["fill"]
    deadline = time.monotonic() + 5 * STEP_S
    while time.monotonic() < deadline:
        time.sleep(0.001)
        fill = ring.stats()["fill"]
        if fill < last:
            return
        last = fill
    raise AssertionError(f"no drain in {5 * STEP_S:.0f} s")
