"""Instance selection over a snapshot: an index built once per snapshot, a few microseconds per pick.

Per model (and for "any model"), the healthy instances are sorted by free memory,
largest first, with cumulative weights; a pick is two bisections: one finds how
many instances have the room asked for (a prefix of the order), one draws within
that prefix in proportion to the weights.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kernel_insight.sdk._models import Instance

__all__ = ["DEFAULT_P99_REF_S", "LoadPolicy", "SelectionIndex", "load_cost", "prefix_key", "weight"]

#: The NCCL p99 a fleet without NCCL data is judged against.
DEFAULT_P99_REF_S = 0.001


@dataclass(frozen=True, slots=True)
class LoadPolicy:
    """How the serving engines' load (``Instance.serving``) steers a pick; the defaults are the ones
    docs/routing.md measures.

    * ``running_weight``: a running request counts this much of a queued one (it slows every step
      of the batch a little; a queued request waits for a whole slot).
    * ``kv_knee``, ``kv_weight``: KV cache use above the knee adds up to ``kv_weight`` queued
      requests' worth (a full cache makes new requests wait or preempts running ones).
    * ``max_age_s``: serving figures older than this are not routed by (the draw falls back to
      memory, NCCL and errors alone for that instance: a cost of 0 plus the client's own requests).
    * ``affinity_slack``: a request with a prefix key goes to its preferred instance (rendezvous
      hashing over the eligible ones) unless that one costs more than this many queued requests
      above the power-of-two pick: prefix-cache hits, but not onto a loaded instance.
    * ``affinity_choices``: how many of the key's top-ranked instances are tried before falling back.
    * ``choices``: how many weighted draws compete (power of d choices). Two: the classic; more
      concentrates many clients acting on the same snapshot on its least-loaded instances
      (herding, measured by ``make bench-routing``).
    * ``nccl_weight``: the expected penalty of a degraded interconnect, in queued requests per
      multiple of the fleet's median NCCL p99 above it (p99 5 x the median: 2 queued requests).
      Added to the load, not multiplied with it: a degraded instance loses to lightly loaded
      ones, and is used again once the others' queues are longer than its penalty, so near
      saturation its capacity is not lost (its share of the draws already shrinks with its
      weight, :func:`weight`).
    """

    running_weight: float = 0.25
    kv_knee: float = 0.5
    kv_weight: float = 16.0
    max_age_s: float = 10.0
    affinity_slack: float = 2.0
    affinity_choices: int = 2
    choices: int = 2
    nccl_weight: float = 0.5


def load_cost(
    instance: Instance,
    own: int,
    p99_ref_s: float,
    policy: LoadPolicy,
    now_s: float | None = None,
) -> float:
    """The expected wait on ``instance`` in queued requests, with the expected penalty of its
    interconnect: ``(1 + waiting + own + running_weight x running + kv term) x (1 + errors_5m)
    + nccl_weight x max(0, p99 / p99_ref - 1)``.

    ``own``: this client's requests in flight there sent after the figures were sampled (not
    in them yet). Without serving figures (or older than ``policy.max_age_s``) only ``own`` counts.
    """
    s = instance.serving
    load = 1.0 + own
    if s is not None and s.age_s(now_s) <= policy.max_age_s:
        load += float(s.requests_waiting or 0) + policy.running_weight * float(s.requests_running or 0)
        kv = s.kv_cache_usage_ratio
        if kv is not None and kv > policy.kv_knee:
            load += policy.kv_weight * (kv - policy.kv_knee) / (1.0 - policy.kv_knee)
    nccl = instance.nccl_latency_seconds
    p99 = nccl.p99 if nccl is not None else p99_ref_s
    return load * (1.0 + instance.errors_5m) + policy.nccl_weight * max(0.0, p99 / p99_ref_s - 1.0)


def prefix_key(prompt: str | bytes, chars: int = 256) -> str:
    """A prefix key for affinity: a hash of the prompt's first ``chars`` characters (~64 tokens,
    four 16-token KV blocks), so requests sharing a system prompt or conversation share a key."""
    data = prompt.encode() if isinstance(prompt, str) else prompt
    return hashlib.blake2b(data[:chars], digest_size=8).hexdigest()


@functools.lru_cache(maxsize=1 << 16)
def _log_u(key: str, instance_id: str) -> float:
    """``ln(u)``, ``u`` in (0, 1) drawn from a hash of the key and the instance: fixed per pair."""
    h = hashlib.blake2b(f"{key}|{instance_id}".encode(), digest_size=8).digest()
    return math.log((int.from_bytes(h, "big") + 0.5) / 2.0**64)


def _rank(key: str, instance: Instance, w: float) -> float:
    """Weighted rendezvous hashing: the instance with the largest ``-w / ln(u)`` wins the key, each
    in proportion to its weight, and removing one moves only its keys."""
    return -w / _log_u(key, instance.id)


def weight(instance: Instance, p99_ref_s: float) -> float:
    """``free_bytes / (1 + p99 / p99_ref) / (1 + errors_5m)``.

    * Proportional to free memory: an instance with twice the room gets twice the
      requests, which evens out memory use across the fleet instead of filling the
      emptiest instance first.
    * Divided by ``1 + p99 / p99_ref``, where ``p99_ref`` is the fleet's median NCCL p99:
      a typical instance keeps half its weight, one three times slower than typical a
      quarter; slow interconnect (congested switch, degraded NVLink) drains traffic
      gradually rather than all at once. No NCCL data counts as typical.
    * Divided by ``1 + errors_5m`` (errors in the last 5 minutes, ``300 x error_rate_per_s``):
      each recent error dilutes the share further, so an instance that keeps failing
      fades out before the server's health rule marks it unhealthy.

    A weighted random draw, not the best-scoring instance, because many clients select
    from the same snapshot independently: picking the maximum would send all of them to
    one instance until the next snapshot (herding).
    """
    free = float(instance.gpu_memory_free_bytes or 0)
    nccl = instance.nccl_latency_seconds
    p99 = nccl.p99 if nccl is not None else p99_ref_s
    return free / (1.0 + p99 / p99_ref_s) / (1.0 + instance.errors_5m)


@dataclass(frozen=True, slots=True)
class _Group:
    instances: tuple[Instance, ...]  # free memory, largest first
    neg_free: tuple[float, ...]  # -free, ascending: bisect finds the prefix with enough room
    cumulative: tuple[float, ...]  # cumulative weights in the same order


def _group(instances: Sequence[Instance], p99_ref_s: float) -> _Group:
    ordered = sorted(instances, key=lambda i: (-(i.gpu_memory_free_bytes or 0), i.id))
    cumulative = []
    total = 0.0
    for inst in ordered:
        total += weight(inst, p99_ref_s)
        cumulative.append(total)
    return _Group(
        tuple(ordered), tuple(-float(i.gpu_memory_free_bytes or 0) for i in ordered), tuple(cumulative)
    )


class SelectionIndex:
    """The eligible instances of one snapshot, grouped by model, ready for :meth:`pick`."""

    def __init__(self, instances: Sequence[Instance]) -> None:
        eligible = [i for i in instances if i.healthy and not i.stale and i.gpu_memory_free_bytes is not None]
        p99s = [i.nccl_latency_seconds.p99 for i in eligible if i.nccl_latency_seconds is not None]
        ref = statistics.median(p99s) if p99s else DEFAULT_P99_REF_S
        self.p99_ref_s = ref if ref > 0 else DEFAULT_P99_REF_S
        by_model: dict[str, list[Instance]] = {}
        for inst in eligible:
            for model in inst.models:
                by_model.setdefault(model, []).append(inst)
        self._all = _group(eligible, self.p99_ref_s)
        self._by_model = {m: _group(v, self.p99_ref_s) for m, v in by_model.items()}
        self.size = len(eligible)
        self._affinity: dict[tuple[str, int, str | None], tuple[Instance, ...]] = {}

    def serves(self, model: str) -> bool:
        """Whether any eligible instance serves ``model``."""
        return model in self._by_model

    def count(self, model: str | None) -> int:
        """Eligible instances (serving ``model``)."""
        group = self._all if model is None else self._by_model.get(model)
        return 0 if group is None else len(group.instances)

    def models(self) -> list[str]:
        """The models eligible instances serve, sorted."""
        return sorted(self._by_model)

    def most_free(self, model: str | None) -> int:
        """The largest free memory among the eligible instances (serving ``model``); 0 when none."""
        group = self._all if model is None else self._by_model.get(model)
        return int(-group.neg_free[0]) if group is not None and group.neg_free else 0

    def candidates(self, required_free_bytes: int, model: str | None) -> tuple[Instance, ...]:
        """Eligible instances with at least ``required_free_bytes`` free, largest first."""
        group = self._all if model is None else self._by_model.get(model)
        if group is None:
            return ()
        k = bisect.bisect_right(group.neg_free, -float(required_free_bytes))
        return group.instances[:k]

    def pick_preferring(
        self,
        required_free_bytes: int,
        model: str | None,
        prefer: Mapping[str, str],
        random: Callable[[], float],
        excluded: Mapping[str, float],
        now: float,
    ) -> Instance | None:
        """A weighted draw among the candidates carrying every ``prefer`` label; None when there is none."""
        near = [
            i
            for i in self.candidates(required_free_bytes, model)
            if excluded.get(i.id, 0.0) <= now and all(i.labels.get(k) == v for k, v in prefer.items())
        ]
        if not near:
            return None
        weights = [weight(i, self.p99_ref_s) for i in near]
        total = sum(weights)
        if total <= 0:
            return near[min(int(random() * len(near)), len(near) - 1)]
        r = random() * total
        for inst, w in zip(near, weights, strict=True):
            r -= w
            if r < 0:
                return inst
        return near[-1]

    def pick_loaded(
        self,
        required_free_bytes: int,
        model: str | None,
        random: Callable[[], float],
        excluded: Mapping[str, float],
        now: float,
        own: Callable[[Instance], int],
        policy: LoadPolicy,
        key: str | None = None,
        now_s: float | None = None,
    ) -> Instance | None:
        """Power of two choices: ``policy.choices`` weighted draws (:meth:`pick`), the one with the
        lower :func:`load_cost` wins; with a prefix ``key``, the key's top-ranked instance first unless it
        costs more than ``policy.affinity_slack`` above that winner. None when nothing is eligible."""
        first = self.pick(required_free_bytes, model, random, excluded, now)
        if first is None:
            return None

        def cost(i: Instance) -> float:
            return load_cost(i, own(i), self.p99_ref_s, policy, now_s)

        best, best_cost = first, cost(first)
        for _ in range(policy.choices - 1):
            other = self.pick(required_free_bytes, model, random, excluded, now)
            if other is not None and other is not best:
                c = cost(other)
                if c < best_cost:
                    best, best_cost = other, c
        if key is None:
            return best
        ranked = self._ranked(key, required_free_bytes, model, excluded, now, policy.affinity_choices)
        for inst in ranked:
            if cost(inst) <= best_cost + policy.affinity_slack:
                return inst
        return best

    def _ranked(
        self,
        key: str,
        required_free_bytes: int,
        model: str | None,
        excluded: Mapping[str, float],
        now: float,
        n: int,
    ) -> list[Instance]:
        """The key's ``n`` top-ranked candidates (weighted rendezvous over the eligible instances with
        the room), cached per key for this snapshot."""
        memo = (key, required_free_bytes, model)
        order = self._affinity.get(memo)
        if order is None:
            room = self.candidates(required_free_bytes, model)
            order = tuple(
                sorted(room, key=lambda i: _rank(key, i, weight(i, self.p99_ref_s) or 1.0), reverse=True)
            )
            if len(self._affinity) >= 4096:
                self._affinity.clear()
            self._affinity[memo] = order
        out = []
        for inst in order:
            if excluded.get(inst.id, 0.0) <= now:
                out.append(inst)
                if len(out) >= n:
                    break
        return out

    def loaded(self, model: str | None) -> bool:
        """Whether any eligible instance (serving ``model``) reports serving figures."""
        group = self._all if model is None else self._by_model.get(model)
        return group is not None and any(i.serving is not None for i in group.instances)

    def pick(
        self,
        required_free_bytes: int,
        model: str | None,
        random: Callable[[], float],
        excluded: Mapping[str, float],
        now: float,
    ) -> Instance | None:
        """A weighted random eligible instance not excluded at ``now``, or None."""
        group = self._all if model is None else self._by_model.get(model)
        if group is None:
            return None
        k = bisect.bisect_right(group.neg_free, -float(required_free_bytes))
        if k == 0:
            return None
        total = group.cumulative[k - 1]
        if total > 0:
            i = min(bisect.bisect_right(group.cumulative, random() * total, 0, k), k - 1)
        else:  # every candidate has zero free memory (and zero was asked for): uniform
            i = min(int(random() * k), k - 1)
        chosen = group.instances[i]
        if not excluded or excluded.get(chosen.id, 0.0) <= now:
            return chosen
        # Slow path: draw again among those not excluded.
        allowed = [j for j in range(k) if excluded.get(group.instances[j].id, 0.0) <= now]
        if not allowed:
            return None
        weights = [weight(group.instances[j], self.p99_ref_s) for j in allowed]
        total = sum(weights)
        if total <= 0:
            return group.instances[allowed[min(int(random() * len(allowed)), len(allowed) - 1)]]
        r = random() * total
        for j, w in zip(allowed, weights, strict=True):
            r -= w
            if r < 0:
                return group.instances[j]
        return group.instances[allowed[-1]]
