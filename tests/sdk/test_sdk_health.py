"""HealthClient: snapshot cache and ETag revalidation, outage behaviour, selection, exclusion."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import httpx
import pytest
from sdk_helpers import FakeServer, GiB, instance

from kernel_insight.sdk import (
    AsyncHealthClient,
    AuthenticationError,
    HealthClient,
    NoEligibleInstance,
    SelectionIndex,
    SnapshotUnavailable,
    weight,
)


def client_for(server, clock, **kw):
    return HealthClient(
        "http://ki",
        "tok",
        transport=httpx.MockTransport(server),
        clock=clock,
        random=random.Random(1).random,
        **kw,
    )


def test_snapshot_is_typed_and_sent_with_the_token(clock):
    server = FakeServer([instance("a", 40, p99=0.003)])
    snap = client_for(server, clock).snapshot()
    a = snap.get("a")
    assert a is not None
    assert a.gpu_memory_free_bytes == 40 * GiB
    assert a.gpu_memory_free_ratio == pytest.approx(0.5)
    assert a.nccl_latency_seconds is not None
    assert a.nccl_latency_seconds.p99 == pytest.approx(0.003)
    assert a.models == ("llama-70b",)
    assert a.healthy
    assert snap.etag == server.etag
    assert server.requests[0].headers["authorization"] == "Bearer tok"


def test_cached_for_ttl_then_revalidated_with_the_etag(clock):
    server = FakeServer([instance("a")])
    client = client_for(server, clock, ttl=30)
    first = client.snapshot()
    clock.t += 29
    assert client.snapshot() is first
    assert len(server.requests) == 1
    clock.t += 2
    assert client.snapshot() is first  # 304: same object, no body
    assert len(server.requests) == 2
    assert server.requests[1].headers["if-none-match"] == server.etag
    server.set([instance("a"), instance("b")])
    clock.t += 31
    assert len(client.snapshot().instances) == 2


def test_outage_serves_the_last_snapshot_until_max_stale_then_raises(clock):
    server = FakeServer([instance("a")])
    client = client_for(server, clock, ttl=30, max_stale=120)
    client.snapshot()
    server.down = True
    clock.t += 60
    assert client.select_instance(GiB).id == "a"
    asked = len(server.requests)
    clock.t += 0.5  # within the retry backoff: no new request, selection stays fast
    client.select_instance(GiB)
    assert len(server.requests) == asked
    clock.t += 60.5  # 121 s since the last answer
    with pytest.raises(SnapshotUnavailable, match=r"121 s old, more than max_stale=120 s"):
        client.select_instance(GiB)
    server.down = False
    clock.t += 60
    assert client.select_instance(GiB).id == "a"


def test_no_snapshot_at_all_is_a_clear_error(clock):
    server = FakeServer([])
    server.down = True
    with pytest.raises(SnapshotUnavailable, match="no health snapshot: cannot reach"):
        client_for(server, clock).snapshot()


def test_server_errors_fall_back_but_auth_errors_raise(clock):
    server = FakeServer([instance("a")])
    client = client_for(server, clock)
    client.snapshot()
    server.status = 503
    clock.t += 31
    assert client.snapshot().get("a") is not None
    server.status = 401
    clock.t += 31
    with pytest.raises(AuthenticationError) as info:
        client.snapshot()
    assert info.value.status == 401
    assert info.value.message == "nope"


def test_select_keeps_only_eligible_instances(clock):
    server = FakeServer(
        [
            instance("small", 5),
            instance("big", 60),
            instance("other-model", 70, models="mistral-7b"),
            instance("stale", 70, age_s=3600),
            instance("no-data", None),
        ]
    )
    client = client_for(server, clock)
    picks = {client.select_instance(20 * GiB, model="llama-70b").id for _ in range(50)}
    assert picks == {"big"}
    assert {client.select_instance(1 * GiB).id for _ in range(200)} == {"small", "big", "other-model"}
    with pytest.raises(
        NoEligibleInstance,
        match=r"model 'llama-70b' with 100\.00 GiB free: 5 in the snapshot, 3 healthy, "
        r"2 of them serve it, 0 with the room \(most free: 60\.00 GiB\)",
    ):
        client.select_instance(100 * GiB, model="llama-70b")
    # A model nobody serves says so, whatever room there is (it used to read "0 with the room").
    with pytest.raises(
        NoEligibleInstance,
        match=r"none of the 3 healthy instances serves model 'unknown' .*models served: 'llama-70b', 'mistral-7b'",
    ):
        client.select_instance(GiB, model="unknown")
    with pytest.raises(ValueError, match="negative"):
        client.select_instance(-1)


def test_draws_follow_the_weights(clock):
    facts = [
        instance("a", 10, p99=0.002),
        instance("b", 30, p99=0.002),
        instance("c", 30, p99=0.006, errors=1),
    ]
    client = client_for(FakeServer(facts), clock)
    snap = client.snapshot()
    index = SelectionIndex(snap.instances)
    assert index.p99_ref_s == pytest.approx(0.002)
    w = {i.id: weight(i, index.p99_ref_s) for i in snap.instances}
    assert w["a"] == pytest.approx(10 * GiB / 2)
    assert w["b"] == pytest.approx(30 * GiB / 2)
    assert w["c"] == pytest.approx(30 * GiB / 4 / 2)
    n = 20_000
    counts = Counter(client.select_instance(0).id for _ in range(n))
    total = sum(w.values())
    for k, v in w.items():
        assert counts[k] / n == pytest.approx(v / total, abs=0.015)


def test_excluded_instances_are_skipped_until_the_time_passes(clock):
    client = client_for(FakeServer([instance("a", 40), instance("b", 40)]), clock)
    client.exclude("a", seconds=300, reason="kernel_oom")
    assert client.excluded() == {"a": "kernel_oom"}
    assert {client.select_instance(GiB).id for _ in range(100)} == {"b"}
    client.exclude("b", seconds=10, reason="nccl_timeout")
    with pytest.raises(NoEligibleInstance, match="2 of those excluded"):
        client.select_instance(GiB)
    clock.t += 11
    assert {client.select_instance(GiB).id for _ in range(50)} == {"b"}
    clock.t += 300
    assert client.excluded() == {}
    assert {client.select_instance(GiB).id for _ in range(100)} == {"a", "b"}


def test_async_client_shares_the_behaviour(clock):
    server = FakeServer([instance("a", 40), instance("b", 5)])

    async def handler(request):
        return server(request)

    async def go():
        async with AsyncHealthClient(
            "http://ki",
            "tok",
            transport=httpx.MockTransport(handler),
            clock=clock,
            random=random.Random(2).random,
        ) as client:
            first = await client.select_instance(20 * GiB)
            clock.t += 31
            await client.snapshot()
            client.exclude("a", 60, "kernel_oom")
            with pytest.raises(NoEligibleInstance):
                await client.select_instance(20 * GiB)
            server.down = True
            clock.t += 400
            with pytest.raises(SnapshotUnavailable):
                await client.snapshot()
            return first

    assert asyncio.run(go()).id == "a"
    assert server.requests[1].headers["if-none-match"] == server.etag
