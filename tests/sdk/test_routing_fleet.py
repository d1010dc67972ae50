"""The queueing fleet of bench-routing behaves as docs/routing.md describes it, and its Inference
Extension scorer scores as the extension's default profile does."""

from __future__ import annotations

import math
import random

import pytest

from bench.routing.fleet import EngineSpec, Fleet, Instance, Request
from bench.routing.queueing import Cyclic, InferenceExtension, Setup, run_picker, run_sdk


def _run(inst: Instance, reqs: list[Request]) -> Fleet:
    fleet = Fleet([inst], random.Random(1))
    for r in reqs:
        fleet.at(r.arrival_ms, 2, lambda now, r=r: fleet.dispatch(inst.id, r, now, lambda q, t: None, None))  # type: ignore[arg-type]
    fleet.run(1e9)
    return fleet


def test_a_cached_prefix_skips_its_prefill():
    spec = EngineSpec(kv_tokens=50_000)
    first = Request(0, 0.0, prefix_id=7, prefix_tokens=1000, prompt_tokens=1100, output_tokens=10)
    second = Request(1, 5000.0, prefix_id=7, prefix_tokens=1000, prompt_tokens=1100, output_tokens=10)
    _run(Instance("a", spec), [first, second])
    assert first.first_token_ms == pytest.approx(1100 * spec.prefill_ms_per_token)
    assert second.first_token_ms - second.arrival_ms == pytest.approx(100 * spec.prefill_ms_per_token)


def test_decode_slows_with_the_batch_and_every_request_finishes():
    spec = EngineSpec(kv_tokens=200_000)
    alone = Request(0, 0.0, 0, 0, 16, 100)
    _run(Instance("a", spec), [alone])
    crowd = [Request(i, 0.0, 0, 0, 16, 100) for i in range(40)]
    _run(Instance("b", spec), crowd)
    assert all(not math.isnan(r.done_ms) for r in crowd)
    assert max(r.done_ms for r in crowd) > 2 * alone.done_ms


def test_a_full_kv_cache_queues_and_preempts_but_loses_nothing():
    inst = Instance("a", EngineSpec(kv_tokens=4_000, max_seqs=48))
    reqs = [Request(i, i * 1.0, i, 0, 600, 400) for i in range(12)]
    _run(inst, reqs)
    assert all(not math.isnan(r.done_ms) for r in reqs)
    assert inst.preemptions > 0
    assert inst.kv_active() == pytest.approx(0.0, abs=1e-6)


def test_the_inference_extension_scores_queue_kv_and_prefix_with_its_default_weights():
    insts = [Instance(f"i{k}", EngineSpec(kv_tokens=64_000)) for k in range(3)]
    fleet = Fleet(insts, random.Random(1))
    gie = InferenceExtension(fleet, random.Random(2))
    gie.seen = {"i0": (4, 0.2), "i1": (0, 0.9), "i2": (2, 0.2)}
    req = Request(0, 0.0, prefix_id=3, prefix_tokens=320, prompt_tokens=640, output_tokens=10)
    # i0: 2*0 + 2*0.8 = 1.6; i1: 2*1 + 2*0.1 = 2.2; i2: 2*0.5 + 2*0.8 = 2.6
    assert gie.pick(req, 0.0, set()) == "i2"
    # Its index now says i2 holds the prompt's 40 blocks. Queues normalised over the candidates
    # (0-4): i0 2*1 + 2*0.05 = 2.1; i1 2*0.5 + 1.6 = 2.6; i2 0 + 1.6, plus 3 * 20/40 for the 20
    # prefix blocks a request of the same prefix shares = 3.1.
    gie.seen = {"i0": (0, 0.95), "i1": (2, 0.2), "i2": (4, 0.2)}
    again = Request(1, 0.0, prefix_id=3, prefix_tokens=320, prompt_tokens=640, output_tokens=10)
    assert gie.pick(again, 0.0, set()) == "i2"
    other = Request(2, 0.0, prefix_id=4, prefix_tokens=320, prompt_tokens=640, output_tokens=10)
    assert gie.pick(other, 0.0, set()) == "i1"  # no shared blocks: queue and KV decide


def test_every_strategy_meets_the_same_requests_and_the_sdk_avoids_failing_nccl():
    setup = Setup(warmup_ms=2_000, measure_ms=6_000, drain_ms=20_000, clients=4)
    sdk = run_sdk(setup, 60.0, 3)
    rr = run_picker(setup, lambda f: Cyclic("rr", [i.id for i in f.instances]), 60.0, 3)
    assert sdk.requests == rr.requests > 200
    assert sdk.unfinished == rr.unfinished == 0
    assert sdk.suitable_pct >= rr.suitable_pct
