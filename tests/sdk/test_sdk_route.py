"""route()/aroute() and the routing transports: each failure cause gets its own reaction."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest
from sdk_helpers import FakeServer, GiB, instance

from kernel_insight.sdk import (
    AsyncHealthClient,
    AsyncRoutingTransport,
    Failure,
    HealthClient,
    Instance,
    NoEligibleInstance,
    RouteFailed,
    RoutePolicy,
    RoutingTransport,
    aroute,
    classify,
    prefix_key,
    route,
)


def _fleet(*specs):
    facts = []
    for name, free in specs:
        f = instance(name, free)
        f.labels = {**f.labels, "endpoint": f"http://{name}.test:8000"}
        facts.append(f)
    return FakeServer(facts)


def _health(server, clock, seed=1):
    return HealthClient(
        "http://ki",
        "tok",
        transport=httpx.MockTransport(server),
        clock=clock,
        random=random.Random(seed).random,
    )


class Sleeps(list):
    def __call__(self, s: float) -> None:
        self.append(s)


@pytest.mark.parametrize(
    ("response", "exc", "want"),
    [
        (httpx.Response(200, text="ok"), None, None),
        (httpx.Response(500, text="CUDA error: out of memory"), None, Failure.OOM),
        (
            httpx.Response(500, json={"error": "torch.cuda.OutOfMemoryError: tried to allocate"}),
            None,
            Failure.OOM,
        ),
        (httpx.Response(507, text="full"), None, Failure.OOM),
        (httpx.Response(504, text="gateway"), None, Failure.DEADLINE),
        (httpx.Response(503, text="deadline exceeded after 2s"), None, Failure.DEADLINE),
        (
            httpx.Response(
                500, text="[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)"
            ),
            None,
            Failure.NCCL_TIMEOUT,
        ),
        (
            httpx.Response(500, text="NCCL watchdog: collective operation timed out"),
            None,
            Failure.NCCL_TIMEOUT,
        ),
        (httpx.Response(500, text="boom"), None, Failure.OTHER),
        (httpx.Response(400, text="bad prompt"), None, Failure.OTHER),
        (
            httpx.Response(200, headers={"grpc-status": "4", "grpc-message": "too slow"}),
            None,
            Failure.DEADLINE,
        ),
        (httpx.Response(200, headers={"grpc-status": "8", "grpc-message": "no room"}), None, Failure.OOM),
        (httpx.Response(200, headers={"grpc-status": "0"}), None, None),
        (None, httpx.ReadTimeout("read timed out"), Failure.DEADLINE),
        (None, TimeoutError(), Failure.DEADLINE),
        (None, RuntimeError("CUDA_ERROR_OUT_OF_MEMORY"), Failure.OOM),
        (None, RuntimeError("NCCL communicator timed out"), Failure.NCCL_TIMEOUT),
        (None, ValueError("nope"), Failure.OTHER),
        ("a plain result", None, None),
    ],
)
def test_the_default_classifier(response, exc, want):
    assert classify(response, exc) is want


def test_grpc_errors_are_classified_by_their_code_without_grpc_installed():
    class StatusCode:  # the shape of grpc.StatusCode members: value = (int, name)
        def __init__(self, value):
            self.value = value

    class RpcError(Exception):
        def __init__(self, code, details):
            super().__init__(details)
            self._code, self._details = code, details

        def code(self):
            return self._code

        def details(self):
            return self._details

    assert classify(None, RpcError(StatusCode((4, "deadline exceeded")), "slow")) is Failure.DEADLINE
    assert classify(None, RpcError(StatusCode((8, "resource exhausted")), "")) is Failure.OOM
    assert (
        classify(None, RpcError(StatusCode((13, "internal")), "NCCL timeout in allreduce"))
        is Failure.NCCL_TIMEOUT
    )
    assert classify(None, RpcError(StatusCode((13, "internal")), "bug")) is Failure.OTHER


def test_oom_retries_at_once_on_an_instance_with_more_room(clock):
    health = _health(_fleet(("small", 20), ("mid", 40), ("big", 70)), clock)
    sleeps, tried = Sleeps(), []

    def call(inst):
        tried.append(inst.id)
        if inst.id != "big":
            return httpx.Response(500, text="CUDA out of memory")
        return httpx.Response(200, text="done")

    for _ in range(20):
        tried.clear()
        r = route(health, call, required_free_bytes=10 * GiB, model="llama-70b", sleep=sleeps)
        assert r.text == "done"
        assert tried[-1] == "big"
        assert len(tried) == len(set(tried))  # never the same instance twice
        frees = {"small": 20, "mid": 40, "big": 70}
        assert [frees[t] for t in tried] == sorted(frees[t] for t in tried)  # each retry has more room
    assert sleeps == []  # no backoff for an OOM
    assert health.excluded() == {}  # and nobody else is affected


def test_deadline_backs_off_100_200_400_ms_then_gives_up(clock):
    health = _health(_fleet(("a", 40), ("b", 40)), clock)
    sleeps, seen = Sleeps(), []
    with pytest.raises(RouteFailed) as info:
        route(
            health,
            lambda inst: httpx.Response(504, text="upstream timed out"),
            sleep=sleeps,
            observe=seen.append,
        )
    assert sleeps == [0.1, 0.2, 0.4]
    assert [a.failure for a in info.value.attempts] == [Failure.DEADLINE] * 4
    assert info.value.last.status_code == 504
    assert "4 attempt(s)" in str(info.value)
    assert len(seen) == 4
    # A deadline then a success: one backoff.
    sleeps.clear()
    outcomes = iter([httpx.ReadTimeout("slow"), httpx.Response(200)])

    def flaky(inst):
        o = next(outcomes)
        if isinstance(o, Exception):
            raise o
        return o

    assert route(health, flaky, sleep=sleeps).status_code == 200
    assert sleeps == [0.1]


def test_nccl_timeout_excludes_the_instance_for_five_minutes(clock):
    health = _health(_fleet(("a", 40), ("b", 40), ("c", 40)), clock)
    bad = "a"
    sleeps = Sleeps()

    def call(inst):
        if inst.id == bad:
            raise RuntimeError("NCCL watchdog: collective operation timed out")
        return inst.id

    for _ in range(30):
        assert route(health, call, sleep=sleeps) in {"b", "c"}
    assert sleeps == []
    excluded = health.excluded()
    assert excluded in ({}, {"a": "nccl_timeout"})
    if not excluded:  # the draw never hit "a" in 30 tries: force it
        health2 = _health(_fleet(("a", 40)), clock)
        with pytest.raises(RouteFailed, match="no instance left"):
            route(health2, call)
        assert health2.excluded() == {"a": "nccl_timeout"}
        health = health2
    clock.t += 299
    assert "a" in health.excluded()
    clock.t += 2
    assert health.excluded() == {}


def test_other_failures_follow_the_callers_policy(clock):
    health = _health(_fleet(("a", 40), ("b", 40)), clock)
    calls = []

    def call(inst):
        calls.append(inst.id)
        return httpx.Response(400, text="bad prompt")

    # Default: no retry, the response comes back as it is.
    assert route(health, call).status_code == 400
    assert len(calls) == 1
    with pytest.raises(ValueError, match="nope"):
        route(health, lambda i: (_ for _ in ()).throw(ValueError("nope")))
    # A policy that retries twice after 50 ms, then stops.
    sleeps = Sleeps()
    policy = RoutePolicy(on_other=lambda n, outcome: 0.05 if n < 3 else None)
    calls.clear()
    assert route(health, call, policy=policy, sleep=sleeps).status_code == 400
    assert len(calls) == 3
    assert sleeps == [0.05, 0.05]


def test_no_instance_at_all_is_no_eligible_instance(clock):
    health = _health(_fleet(("a", 4)), clock)
    with pytest.raises(NoEligibleInstance):
        route(health, lambda i: "x", required_free_bytes=10 * GiB)


def test_aroute_makes_the_same_decisions(clock):
    server = _fleet(("small", 20), ("big", 70))

    async def main():
        health = AsyncHealthClient(
            "http://ki",
            "tok",
            transport=httpx.MockTransport(server),
            clock=clock,
            random=random.Random(3).random,
        )
        sleeps = []

        async def sleep(s):
            sleeps.append(s)

        async def call(inst):
            if inst.id == "small":
                return httpx.Response(500, text="out of memory")
            return inst.id

        got = {await aroute(health, call, sleep=sleep) for _ in range(10)}
        outcomes = iter([TimeoutError(), "ok"])

        async def slow(inst):
            o = next(outcomes)
            if isinstance(o, Exception):
                raise o
            return o

        second = await aroute(health, slow, sleep=sleep)
        await health.aclose()
        return got, second, sleeps

    got, second, sleeps = asyncio.run(main())
    assert got == {"big"}
    assert second == "ok"
    assert sleeps == [0.1]


def test_the_transport_routes_requests_to_the_instances_endpoint_and_retries_by_cause(clock):
    health = _health(_fleet(("small", 20), ("big", 70)), clock)
    hosts = []

    def backend(request: httpx.Request) -> httpx.Response:
        hosts.append(request.url.host)
        assert request.url.path == "/v1/completions"
        assert request.url.params["stream"] == "false"
        assert request.content == b'{"prompt":"hi"}'  # the body travels again on the retry
        if request.url.host == "small.test":
            return httpx.Response(500, text="CUDA out of memory")
        return httpx.Response(200, json={"served_by": request.url.host})

    transport = RoutingTransport(
        health, model="llama-70b", required_free_bytes=lambda req: GiB, inner=httpx.MockTransport(backend)
    )
    with httpx.Client(transport=transport) as client:
        for _ in range(10):
            r = client.post(
                "http://llm/v1/completions?stream=false",
                content=b'{"prompt":"hi"}',
                headers={"content-type": "application/json"},
            )
            assert r.json() == {"served_by": "big.test"}
    assert set(hosts) <= {"small.test", "big.test"}
    assert hosts.count("big.test") == 10


def test_the_async_transport_routes_too(clock):
    server = _fleet(("a", 40))

    async def backend(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=request.url.host)

    async def main():
        health = AsyncHealthClient("http://ki", "tok", transport=httpx.MockTransport(server), clock=clock)
        transport = AsyncRoutingTransport(health, inner=httpx.MockTransport(backend))
        async with httpx.AsyncClient(transport=transport) as client:
            r = await client.get("http://llm/health")
        await health.aclose()
        return r.text

    assert asyncio.run(main()) == "a.test"


def test_an_instance_without_an_endpoint_label_is_a_clear_error(clock):
    health = _health(FakeServer([instance("bare", 40)]), clock)
    transport = RoutingTransport(health, inner=httpx.MockTransport(lambda r: httpx.Response(200)))
    with httpx.Client(transport=transport) as client, pytest.raises(ValueError, match="no 'endpoint' label"):
        client.get("http://llm/")


def test_selection_prefers_the_callers_rack_while_it_has_room(clock):
    facts = [instance("a1", 40), instance("a2", 10), instance("b1", 70)]
    racks = {"a1": "ra", "a2": "ra", "b1": "rb"}
    for f in facts:
        f.labels = {**f.labels, "rack": racks[f.id]}
    health = _health(FakeServer(facts), clock)
    assert {health.select_instance(GiB, prefer={"rack": "ra"}).id for _ in range(100)} == {"a1", "a2"}
    # Only a1 in the rack has 20 GiB; with a1 excluded the draw leaves the rack.
    assert {health.select_instance(20 * GiB, prefer={"rack": "ra"}).id for _ in range(50)} == {"a1"}
    assert {health.select_instance(20 * GiB, prefer={"rack": "ra"}, avoid=["a1"]).id for _ in range(20)} == {
        "b1"
    }
    assert {health.select_instance(GiB, prefer={"rack": "nowhere"}).id for _ in range(200)} == {
        "a1",
        "a2",
        "b1",
    }
    # route() passes it on: an OOM in the rack moves the retry to more room, wherever it is.
    tried = []

    def call(inst):
        tried.append(inst.id)
        return httpx.Response(500, text="out of memory") if inst.id == "a2" else inst.id

    got = {route(health, call, prefer={"rack": "ra"}) for _ in range(30)}
    assert got == {"a1"}


def test_the_transport_passes_each_requests_prefix_key_to_selection(clock):
    keys = []

    class Health:
        def select_instance(self, required, model, *, avoid, prefer, prefix_key=None):
            keys.append(prefix_key)
            return Instance.from_json({"id": "a", "labels": {"endpoint": "http://a.test"}, "healthy": True})

        def exclude(self, *a, **k):
            pass

    transport = RoutingTransport(
        Health(),
        inner=httpx.MockTransport(lambda r: httpx.Response(200)),
        prefix_key=lambda request: prefix_key(request.content.decode()),
    )
    with httpx.Client(transport=transport) as client:
        client.post("http://llm/v1/completions", content=b"system prompt A, question 1")
    assert keys == [prefix_key("system prompt A, question 1")]
