"""The soak's end-of-run checks on their own: the alert's timing verdict and the leak finder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.soak import leaks
from bench.soak.alerts import ALERT, EVAL_S, FOR_S, SLACK_S, AlertWatch, Condition


def _watch(spells: list[list[float | None]]) -> AlertWatch:
    w = AlertWatch.__new__(AlertWatch)  # no poller thread: the spells are given
    w.spells = {ALERT: spells}
    return w


def _cond(began: float, ended: float) -> Condition:
    c = Condition(began, ended - began)
    c.acked(100.0, began)
    c.acked(0.0, ended)
    return c


def test_an_alert_firing_and_resolving_within_its_bounds_is_ok() -> None:
    ok, why = _watch([[100.0 + FOR_S + EVAL_S, 200.0 + EVAL_S]]).judge(_cond(100.0, 200.0), [])
    assert ok, why


def test_a_late_alert_is_a_failure_unless_a_fault_overlapped_the_lateness() -> None:
    late = 100.0 + FOR_S + 2 * EVAL_S + SLACK_S + 30
    spells: list[list[float | None]] = [[late, 205.0]]
    ok, why = _watch(spells).judge(_cond(100.0, 200.0), [])
    assert not ok
    assert "no fault explains it" in why
    ok, why = _watch(spells).judge(_cond(100.0, 200.0), [("collector_kill", 110.0, 115.0)])
    assert ok
    assert "collector_kill" in why
    ok, why = _watch(spells).judge(_cond(100.0, 200.0), [("agent_stop", 300.0, 360.0)])
    assert not ok, why


def test_an_alert_never_delivered_or_never_resolved_fails() -> None:
    assert not _watch([]).judge(_cond(100.0, 200.0), [])[0]
    ok, why = _watch([[115.0, None]]).judge(_cond(100.0, 200.0), [])
    assert not ok
    assert "never resolved" in why


def test_a_marked_process_and_an_unreaped_child_are_leftovers(tmp_path: Path) -> None:
    token = leaks.mark()
    try:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    finally:
        os.environ.pop(leaks.MARK)
    found = leaks.leftovers(
        token, netns=None, host_if=None, mounts=[tmp_path / "disk"], rings="ki_test_none.", wait_s=0
    )
    assert any(f"pid {child.pid} " in f for f in found), found
    child.kill()
    # SIGKILL is delivered asynchronously: until the child has exited it may still read "state R".
    # Wait for the exit without reaping it (WNOWAIT), so it stays a zombie.
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    # Killed, not reaped: a zombie, found by its parent pid (its environment is gone).
    zombie = leaks.leftovers(token, netns=None, host_if=None, mounts=[], rings="ki_test_none.", wait_s=0)
    assert any(f"pid {child.pid} " in f and "state Z" in f for f in zombie), zombie
    child.wait()
    assert leaks.leftovers(token, netns=None, host_if=None, mounts=[], rings="ki_test_none.") == []


def test_a_rule_failure_is_timed_by_its_evaluation_not_by_the_look_that_sees_it() -> None:
    """A rule that failed during a fault keeps its lastError until its group's next evaluation:
    later looks, after the fault, show the same failed evaluation and must not count it again
    (two 60-minute soaks said alerts_ok=0 for a store_disk_full failure seen after the fault)."""
    import time

    import httpx

    from bench.soak.alerts import RuleHealth

    answers: list[dict[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        rule = {"name": "r", **answers[0]}
        return httpx.Response(200, json={"data": {"groups": [{"name": "g", "rules": [rule]}]}})

    rules = RuleHealth()
    with httpx.Client(transport=httpx.MockTransport(handler), base_url="http://collector") as client:
        answers[:] = [{"health": "ok", "lastEvaluation": "2026-12-07T16:47:00Z"}]
        rules.poll(client)
        fault_begins = time.monotonic()
        answers[:] = [{"health": "err", "lastError": "disk full", "lastEvaluation": "2026-12-07T16:47:30Z"}]
        rules.poll(client)  # the failed evaluation, during the fault
        fault_ends = time.monotonic()
        time.sleep(0.01)
        rules.poll(client)  # the same evaluation seen again after the fault: not a new failure
        rules.poll(client)

        def during(a: float, b: float) -> bool:
            return fault_begins <= b and a <= fault_ends

        assert rules.problems(during) == []
        answers[:] = [{"health": "err", "lastError": "disk full", "lastEvaluation": "2026-12-07T16:49:30Z"}]
        rules.poll(client)  # a new failed evaluation, no fault running
        assert rules.problems(during) == ["g/r: disk full"]
    assert rules.evaluated == {"g/r"}


def test_each_process_is_judged_from_the_end_of_its_own_warm_up() -> None:
    """A collector restarted just before the run's warm-up ended is judged warm_s after its own
    start, not on its start-up; one that ended within its warm-up is not judged (None)."""
    from bench.soak.memory import growth_pct, judged_from

    t0, warm = 1000.0, 600.0
    first = [(t0 + 10 * i, 500_000) for i in range(120)]  # from the run's start, flat
    assert judged_from(first, t0, warm) == t0 + warm
    assert growth_pct(first, t0, warm) == (0.0, [500_000] * 60)
    # born at 585 s: grows 500 -> 560 MB in its first 10 minutes, then flat
    late = [(t0 + 585 + 10 * i, min(560_000, 500_000 + 1_000 * i)) for i in range(120)]
    pct, after = growth_pct(late, t0, warm) or (None, [])
    assert pct == 0.0
    assert after[0] == 560_000
    # judged from the run's warm-up instead, the same process "grew" 11.6%: its own start-up
    run_warm = [kb for t, kb in late if t >= t0 + warm]
    assert round(100.0 * (max(run_warm) - run_warm[0]) / run_warm[0], 1) == 11.6
    # a collector killed 5 minutes after its start is not judged
    assert growth_pct([(t0 + 900 + 10 * i, 500_000) for i in range(30)], t0, warm) is None
    # growth after the own warm-up still counts
    leaking = [(t0 + 10 * i, 500_000 + (1_000 * (i - 60) if i > 60 else 0)) for i in range(120)]
    pct, _ = growth_pct(leaking, t0, warm) or (0.0, [])
    assert round(pct, 1) == 11.8
