"""Selection by the serving engines' load: power of two choices, own requests in flight, prefix
affinity with fallback, staleness, no herding, and route() keeping the failure-cause retries."""

from __future__ import annotations

import random
from collections import Counter

import httpx
import pytest
from sdk_helpers import FakeServer, GiB, instance

from kernel_insight.api.health.serving import combine
from kernel_insight.sdk import HealthClient, Instance, LoadPolicy, load_cost, prefix_key, route

NOW_S = 1_800_000_000.0


def loaded(id: str, waiting: int, running: int = 0, kv: float = 0.2, *, age_s: float = 0.5, **kw):
    f = instance(id, 40, now_ms=int(NOW_S * 1000), **kw)
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


def test_kv_pressure_and_nccl_slowness_raise_the_cost():
    policy = LoadPolicy()
    fresh = {"now_s": NOW_S, "policy": policy, "p99_ref_s": 0.002, "own": 0}
    snap = [
        Instance.from_json(_json(f))
        for f in (loaded("a", 2), loaded("b", 2, kv=0.99), loaded("c", 2, p99=0.02))
    ]
    a, b, c = (load_cost(i, **fresh) for i in snap)
    assert b > a + 5  # a nearly full KV cache counts as several queued requests
    assert c > 3 * a  # ten times the fleet's NCCL p99
    stale = Instance.from_json(_json(loaded("d", 50, age_s=60)))
    assert load_cost(stale, **fresh) == pytest.approx(1.0 * (1 + 0.002 / 0.002) / 2)  # too old: not routed by


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
