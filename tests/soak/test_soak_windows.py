"""The soak's fault windows: staleness during a fault is the fault's; after it, the time since it ended."""

from __future__ import annotations

from bench.soak.windows import FaultWindows


def test_a_fault_still_running_is_not_counted_from_the_end_of_the_one_before() -> None:
    # seed 1's hour: store_disk_full over at +1266 s, network_cut from +1506 s for 90 s. Every
    # instance is stale from +1566 s (nothing heard for 60 s) until the link is up again; the
    # soak once measured that from +1266 s and reported stale_s_max=328.9.
    w = FaultWindows()
    w.end(w.begin(1206.0), 1266.1)
    cut = w.begin(1506.0)
    assert w.active(1595.0)
    assert w.since_last(1595.0) is None
    w.end(cut, 1596.1)
    assert not w.active(1600.0)
    assert w.since_last(1600.0) == 1600.0 - 1596.1


def test_an_agent_stop_is_over_at_its_sigcont_not_at_its_sigstop() -> None:
    w = FaultWindows()
    stop = w.begin(3306.0)  # SIGSTOP; the agent turns stale 60 s later, while still stopped
    assert w.since_last(3365.0) is None
    assert w.end(stop, 3366.2) == 3366.2 - 3306.0
    since = w.since_last(3370.0)
    assert since is not None
    assert abs(since - 3.8) < 1e-9


def test_nothing_is_counted_before_the_first_fault_is_over() -> None:
    w = FaultWindows()
    assert w.since_last(10.0) is None
    w.begin(20.0)
    assert w.active(25.0)
    assert w.since_last(25.0) is None
    assert not w.active(19.0)
