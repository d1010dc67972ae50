"""Selection by the serving engines' load: power of two choices, own requests in flight, prefix
affinity with fallback, staleness, no herding, and route() keeping the failure-cause retries."""

from __future__ import annotations

import random
from collections import Counter

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sdk_helpers import FakeServer, GiB, instance

from kernel_insight.api.health.serving import combine
from kernel_insight.sdk import (
    HealthClient,
    Instance,
    LoadPolicy,
    SelectionIndex,
    load_cost,
    prefix_key,
    route,
    weight,
)

NOW_S = 1_800_000_000.0


def loaded(
    id: str,
    waiting: int,
    running: int = 0,
    kv: float = 0.2,
    *,
    age_s: float = 0.5,
    free_gib: float = 40,
    **kw,
):
    f = instance(id, free_gib, now_ms=int(NOW_S * 1000), **kw)
    sample = int((NOW_S - age_s) * 1000)
    f.serving = combine(
        [
            ("vllm:num_requests_waiting", float(waiting), sample),
            ("vllm:num_requests_running", float(running), sample),
            ("vllm:kv_cache_usage_perc", kv, sample),
        ]
    )
    return f


def client_for(facts, clock, seed=1, **kw):
    return HealthClient(
        "http://ki",
        transport=httpx.MockTransport(FakeServer(facts)),
        clock=clock,
        wall_clock=lambda: NOW_S,
        random=random.Random(seed).random,
        **kw,
    )


def test_the_less_loaded_of_two_draws_wins(clock):
    client = client_for([loaded("busy", 20, 30), loaded("idle", 0, 2)], clock)
    picks = Counter(client.select_instance(GiB).id for _ in range(2000))
    # Equal weights: both draws hit "busy" a quarter of the time; otherwise "idle" wins.
    assert picks["idle"] / 2000 == pytest.approx(0.75, abs=0.04)


def test_kv_pressure_and_a_slow_interconnect_raise_the_cost():
    policy = LoadPolicy()
    fresh = {"now_s": NOW_S, "policy": policy, "p99_ref_s": 0.002, "own": 0}
    snap = [
        Instance.from_json(_json(f))
        for f in (loaded("a", 2), loaded("b", 2, kv=0.99), loaded("c", 2, p99=0.02))
    ]
    a, b, c = (load_cost(i, **fresh) for i in snap)
    assert b > a + 5  # a nearly full KV cache counts as several queued requests
    # Ten times the fleet's NCCL p99: an expected penalty of 0.5 x 9 queued requests, added to its load.
    assert c == pytest.approx(a + policy.nccl_weight * (0.02 / 0.002 - 1))
    stale = Instance.from_json(_json(loaded("d", 50, age_s=60)))
    assert load_cost(stale, **fresh) == pytest.approx(1.0)  # too old: not routed by


def test_a_degraded_instance_keeps_serving_once_the_others_queue(clock):
    """NCCL p99 five times the fleet's: a penalty of 2 queued requests, not a multiple of its queue.
    While the healthy instances are idle it (almost) only gets picked when both draws hit it; once
    their queues are longer than its own plus the penalty, it wins every comparison it is drawn into,
    so near saturation its capacity is used instead of lost."""

    def share(healthy_waiting: int, degraded_waiting: int) -> float:
        facts = [loaded(f"h{i}", healthy_waiting) for i in range(4)]
        facts.append(loaded("slow-nccl", degraded_waiting, p99=0.010))
        client = client_for(facts, clock)
        return Counter(client.select_instance(GiB).id for _ in range(3000))["slow-nccl"] / 3000

    # Its draw share: weight / total = (1/6) / (4 x 1/2 + 1/6) = 0.077 (docs: weight()).
    q = (1 / 6) / (4 / 2 + 1 / 6)
    assert share(0, 0) < 0.03  # idle fleet: both draws must hit it (q^2 = 0.6 %)
    busy = share(12, 8)  # 8 + 1 + 2 = 11 < 12 + 1: it wins whenever drawn
    assert busy == pytest.approx(1 - (1 - q) ** 2, abs=0.03)
    assert busy < 2 * q + 0.03  # and never more than its two draws give it: no herding onto it


def _json(f):
    from kernel_insight.api.health import HealthRule, instance_record

    return instance_record(f, HealthRule(max_errors_5m=100), int(NOW_S * 1000))


def test_own_requests_in_flight_count_until_they_end(clock):
    client = client_for([loaded("a", 0), loaded("b", 0)], clock)
    client.snapshot()
    tickets = [client.begin("a") for _ in range(5)]
    assert Counter(client.select_instance(GiB).id for _ in range(400))["a"] < 150  # a quarter: both draws "a"
    for t in tickets:
        client.end("a", t)
    assert 120 < Counter(client.select_instance(GiB).id for _ in range(400))["a"] < 280


def test_a_prefix_key_sticks_to_one_instance_and_falls_back_when_it_is_loaded(clock):
    facts = [loaded(f"n{i}", 1) for i in range(8)]
    client = client_for(facts, clock)
    key = prefix_key("You are a helpful assistant. " * 20)
    assert key == prefix_key("You are a helpful assistant. " * 20 + "different question")
    home = {client.select_instance(GiB, prefix_key=key).id for _ in range(50)}
    assert len(home) == 1  # the same instance every time while it is not loaded
    others = {
        client.select_instance(GiB, prefix_key=prefix_key(f"other prompt {i}" * 30)).id for i in range(40)
    }
    assert len(others) >= 6  # keys spread over the fleet
    (chosen,) = home
    facts2 = [loaded(f.id, 40 if f.id == chosen else 1) for f in facts]
    client2 = client_for(facts2, clock)
    picks = Counter(client2.select_instance(GiB, prefix_key=key).id for _ in range(200))
    assert picks[chosen] < 15  # loaded: the runner-up or the power-of-two pick (both draws on it: 1 in 64)


def test_clients_sharing_a_snapshot_do_not_herd(clock):
    facts = [loaded(f"n{i}", 3) for i in range(10)] + [loaded("empty", 0)]
    picks = Counter(client_for(facts, clock, seed=s).select_instance(GiB).id for s in range(500))
    assert picks["empty"] < 150  # the best instance gets more, not everything
    assert len(picks) == 11
    herd = Counter(
        client_for(facts, clock, seed=s, load_policy=LoadPolicy(choices=16)).select_instance(GiB).id
        for s in range(500)
    )
    assert herd["empty"] > 300  # the least loaded of 16 draws: most clients land on the same one


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 60),  # waiting
            st.integers(0, 48),  # running
            st.floats(0.0, 1.0),  # KV cache use
            st.sampled_from([0.001, 0.0012, 0.002, 0.005, 0.02]),  # NCCL p99
            st.integers(5, 80),  # free GiB
        ),
        min_size=3,
        max_size=12,
    )
)
def test_many_clients_on_one_snapshot_never_herd(fleet):
    """Whatever the loads: clients acting on the same snapshot at once (independent random draws,
    none of their own requests counted yet) send no instance more than its two weighted draws can
    give it, ``1 - (1 - w/W)^2``, so the least-loaded instance gets at most about twice its share,
    never the whole crowd (the least loaded of 16 draws would)."""
    facts = [
        loaded(f"n{k}", w, r, kv, p99=p99, free_gib=free) for k, (w, r, kv, p99, free) in enumerate(fleet)
    ]
    index = SelectionIndex([Instance.from_json(_json(f)) for f in facts])
    shares = {i.id: weight(i, index.p99_ref_s) for i in index.candidates(0, None)}
    total = sum(shares.values())
    clients = 1500
    picks: Counter[str] = Counter()
    for c in range(clients):
        draw = random.Random(c).random
        got = index.pick_loaded(0, None, draw, {}, 0.0, lambda i: 0, LoadPolicy(), now_s=NOW_S)
        assert got is not None
        picks[got.id] += 1
    for inst_id, w in shares.items():
        bound = 1 - (1 - w / total) ** 2
        assert picks[inst_id] / clients <= bound + 0.05, (inst_id, picks, bound)


def test_without_serving_figures_the_draw_is_the_weighted_one(clock):
    client = client_for([instance("a", 10), instance("b", 30)], clock)
    picks = Counter(client.select_instance(0).id for _ in range(4000))
    assert picks["b"] / 4000 == pytest.approx(0.75, abs=0.03)


def test_route_counts_attempts_in_flight_and_keeps_the_nccl_exclusion(clock):
    client = client_for([loaded("a", 0), loaded("b", 0)], clock)
    seen: list[tuple[str, int]] = []

    def call(inst):
        seen.append((inst.id, client._core.own(inst)))
        if len(seen) == 1:
            raise RuntimeError("NCCL watchdog: collective operation timed out")
        return inst.id

    first_key = prefix_key("x" * 300)
    done = route(client, call, required_free_bytes=GiB, prefix_key=first_key, sleep=lambda s: None)
    assert seen[0][1] == 1  # counted while it ran
    assert done != seen[0][0]  # excluded after its NCCL timeout, retried elsewhere
    assert client.excluded() == {seen[0][0]: "nccl_timeout"}
    assert not any(client._core.flying.values())
