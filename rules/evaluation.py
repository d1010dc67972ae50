"""Evaluating rules: the alert state machine, recording rules, and one group's evaluation.

The semantics are Prometheus' ``rules/alerting.go``, ``recording.go`` and ``group.go``:
an alert is *pending* from the first evaluation its expression returns its labels, *firing*
once it has been active for ``for``, and stays firing ``keep_firing_for`` after the
expression stops returning it; a resolved alert is kept (inactive) for 15 minutes so
Alertmanager hears that it resolved. Each evaluation yields the samples to write back:
``ALERTS`` and ``ALERTS_FOR_STATE`` for alerts, the recorded series for recording rules,
and a staleness marker for every series a rule returned last time and not this time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kernel_insight.kql.engine import Engine
from kernel_insight.kql.errors import KqlError
from kernel_insight.kql.histogram import FloatHistogram, HistogramError
from kernel_insight.kql.storage import STALE_NAN
from kernel_insight.kql.values import Scalar, Vector
from kernel_insight.rules.config import GroupSpec, RuleSpec
from kernel_insight.rules.template import QuerySample, TemplateError, render

__all__ = [
    "RESOLVED_RETENTION_MS",
    "Alert",
    "AlertState",
    "AlertingRule",
    "Group",
    "RecordingRule",
    "RestoredState",
    "Rule",
    "RuleEvalError",
    "WrittenSample",
    "eval_timestamp",
]

#: A resolved alert is kept this long so its resolution reaches Alertmanager (Prometheus: 15m).
RESOLVED_RETENTION_MS = 15 * 60_000

Labels = tuple[tuple[str, str], ...]
#: ``(labels, timestamp_ms, value)`` to write back into the store; the value is a float or a
#: native histogram (a recording rule over histograms records histograms, as Prometheus 3 does).
WrittenSample = tuple[Labels, int, float | FloatHistogram]
QueryFn = Callable[[str | Any, int], Vector]


class RuleEvalError(Exception):
    """A rule's evaluation failed: the query, a duplicate label set, or the limit."""


class AlertState(StrEnum):
    INACTIVE = "inactive"
    PENDING = "pending"
    FIRING = "firing"


@dataclass(slots=True)
class Alert:
    """One alert instance of a rule (one label set); times are ms since the epoch, 0 = unset."""

    labels: Labels
    annotations: Labels
    state: AlertState
    active_at_ms: int
    value: float
    fired_at_ms: int = 0
    resolved_at_ms: int = 0
    last_sent_at_ms: int = 0
    valid_until_ms: int = 0
    keep_firing_since_ms: int = 0

    def needs_sending(self, ts_ms: int, resend_delay_ms: int) -> bool:
        """Prometheus' ``needsSending``: never pending ones; resolved since last sent, or not sent for a while."""
        if self.state == AlertState.PENDING:
            return False
        if self.resolved_at_ms > self.last_sent_at_ms:
            return True
        return self.last_sent_at_ms + resend_delay_ms < ts_ms


@dataclass(frozen=True, slots=True)
class RestoredState:
    """What ALERTS_FOR_STATE said about an alert before a restart: when it became active, when last seen."""

    active_at_s: float
    seen_at_ms: int


def _query(engine: Engine, expr: Any, ts_ms: int) -> Vector:
    try:
        result = engine.instant_query(expr, ts_ms)
    except KqlError as exc:
        raise RuleEvalError(getattr(exc, "brief", None) or str(exc)) from exc
    value = result.value
    if isinstance(value, Vector):
        return value
    if isinstance(value, Scalar):
        return Vector(value.timestamp_ms, (_scalar_sample(value),))
    raise RuleEvalError("rule result is not a vector or scalar")


def _scalar_sample(value: Scalar) -> Any:
    from kernel_insight.kql.values import Sample

    return Sample((), value.timestamp_ms, value.value)


def _set(labels: Mapping[str, str] | Labels, updates: Sequence[tuple[str, str]]) -> dict[str, str]:
    out = dict(labels)
    for k, v in updates:
        if v == "":
            out.pop(k, None)
        else:
            out[k] = v
    return out


def _canon(labels: Mapping[str, str]) -> Labels:
    return tuple(sorted((k, v) for k, v in labels.items() if v != ""))


@dataclass
class Rule:
    """What every rule keeps between evaluations (health as ``/api/v1/rules`` reports it)."""

    spec: RuleSpec
    group_labels: Labels = ()
    health: str = "unknown"
    last_error: str = ""
    last_eval_ms: int = 0
    eval_seconds: float = 0.0
    previous_series: set[Labels] = field(default_factory=set)
    #: Why the last evaluation discarded some of its samples (Prometheus' append errors: the
    #: rest is written, the rule's health is ``err``); empty when it discarded none.
    discarded: str = ""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def labels(self) -> Labels:
        """The rule's labels, group labels first (the rule's own win)."""
        return _canon(_set(dict(self.group_labels), self.spec.labels))


@dataclass
class RecordingRule(Rule):
    def eval(self, engine: Engine, ts_ms: int, limit: int) -> list[WrittenSample]:
        vec = _query(engine, self.spec.query, ts_ms)
        out: list[WrittenSample] = []
        seen: set[Labels] = set()
        updates = [("__name__", self.spec.name), *self.labels]
        self.discarded = ""
        invalid: list[tuple[Labels, str]] = []
        for s in vec.samples:
            labels = _canon(_set(s.labels, updates))
            if labels in seen:
                raise RuleEvalError(
                    "vector contains metrics with the same labelset after applying rule labels"
                )
            seen.add(labels)
            if s.histogram is None:
                out.append((labels, ts_ms, s.value))
                continue
            try:
                s.histogram.validate()  # what Prometheus' TSDB refuses to append (negative buckets, ...)
            except HistogramError as exc:
                invalid.append((labels, str(exc)))
                continue
            out.append((labels, ts_ms, s.histogram))
        if limit > 0 and len(out) + len(invalid) > limit:
            raise RuleEvalError(f"exceeded limit of {limit} with {len(out) + len(invalid)} series")
        if invalid:
            # Prometheus' group.go: an append error discards that sample, the others are written
            # and the rule's health is bad with the error.
            labels, why = invalid[-1]
            self.discarded = f"histogram sample of {dict(labels)} discarded: {why}"
        return out


@dataclass
class AlertingRule(Rule):
    active: dict[Labels, Alert] = field(default_factory=dict)
    #: ALERTS_FOR_STATE read back after a restart, applied once to alerts that reappear.
    restored: dict[Labels, RestoredState] = field(default_factory=dict)

    def eval(
        self,
        engine: Engine,
        ts_ms: int,
        limit: int,
        *,
        query_offset_ms: int = 0,
        external_labels: Mapping[str, str] | None = None,
        external_url: str = "",
    ) -> list[WrittenSample]:
        spec = self.spec
        qts = ts_ms - query_offset_ms
        vec = _query(engine, spec.query, qts)
        rule_labels = self.labels
        rule_annotations = spec.annotations

        def tmpl_query(q: str) -> list[QuerySample]:
            v = _query(engine, q, qts)
            return [QuerySample(dict(s.labels), s.value) for s in v.samples]

        found: dict[Labels, Alert] = {}
        for s in vec.samples:
            metric = {k: v for k, v in s.labels if k != "__name__"}
            tmpl_labels = dict(s.labels)  # the template sees __name__ too, as in Prometheus

            def expand(text: str, metric: Mapping[str, str] = tmpl_labels, value: float = s.value) -> str:
                if "{{" not in text:
                    return text
                try:
                    return render(
                        text,
                        labels=metric,
                        value=value,
                        external_labels=external_labels,
                        external_url=external_url,
                        query=tmpl_query,
                        now_s=ts_ms / 1000,
                        name=f"__alert_{spec.name}",
                    )
                except TemplateError as exc:
                    return f"<error expanding template: {exc}>"

            labels = dict(metric)
            for k, v in rule_labels:
                labels[k] = expand(v)
            labels["alertname"] = spec.name
            key = _canon(labels)
            annotations = _canon({k: expand(v) for k, v in rule_annotations})
            if key in found:
                raise RuleEvalError(
                    "vector contains metrics with the same labelset after applying alert labels"
                )
            found[key] = Alert(key, annotations, AlertState.PENDING, ts_ms, s.value)

        for key, new in found.items():
            old = self.active.get(key)
            if old is not None and old.state != AlertState.INACTIVE:
                old.value, old.annotations = new.value, new.annotations
                continue
            restored = self.restored.pop(key, None)
            if restored is not None:
                new.active_at_ms = self._restored_active_at(restored, ts_ms)
            self.active[key] = new
        self.restored.clear()

        out: list[WrittenSample] = []
        active_pending = 0
        for key, a in list(self.active.items()):
            if key not in found:
                keep = False
                if a.state == AlertState.FIRING and spec.keep_firing_for_ms > 0:
                    if a.keep_firing_since_ms == 0:
                        a.keep_firing_since_ms = ts_ms
                    keep = ts_ms - a.keep_firing_since_ms < spec.keep_firing_for_ms
                if a.state == AlertState.PENDING or (
                    a.resolved_at_ms and ts_ms - a.resolved_at_ms > RESOLVED_RETENTION_MS
                ):
                    del self.active[key]
                if a.state != AlertState.INACTIVE and not keep:
                    a.state = AlertState.INACTIVE
                    a.resolved_at_ms = ts_ms
                if not keep:
                    continue
            else:
                a.keep_firing_since_ms = 0
            active_pending += 1
            if a.state == AlertState.PENDING and ts_ms - a.active_at_ms >= spec.for_ms:
                a.state = AlertState.FIRING
                a.fired_at_ms = ts_ms
            if a.state == AlertState.FIRING and ts_ms - a.active_at_ms < spec.for_ms:
                a.state, a.fired_at_ms, a.last_sent_at_ms, a.keep_firing_since_ms = (
                    AlertState.PENDING,
                    0,
                    0,
                    0,
                )
            base = _set(dict(rule_labels), a.labels)
            base["alertname"] = spec.name
            out.append((_canon({**base, "__name__": "ALERTS", "alertstate": a.state.value}), qts, 1.0))
            out.append((_canon({**base, "__name__": "ALERTS_FOR_STATE"}), qts, float(a.active_at_ms // 1000)))
        if limit > 0 and active_pending > limit:
            self.active = {}
            raise RuleEvalError(f"exceeded limit of {limit} with {active_pending} alerts")
        return out

    def _restored_active_at(self, restored: RestoredState, ts_ms: int) -> int:
        """Prometheus' RestoreForState without the grace period: a firing alert keeps its start;
        a pending one does not count the time nobody evaluated it."""
        active_ms = int(restored.active_at_s * 1000)
        spent = restored.seen_at_ms - active_ms
        if spent >= self.spec.for_ms:
            return active_ms
        return active_ms + max(0, ts_ms - restored.seen_at_ms)

    def alerts_to_send(self, ts_ms: int, resend_delay_ms: int, interval_ms: int) -> list[Alert]:
        """The alerts Prometheus' ``sendAlerts`` would send now (marks them sent)."""
        out = []
        for a in self.active.values():
            if a.needs_sending(ts_ms, resend_delay_ms):
                a.last_sent_at_ms = ts_ms
                a.valid_until_ms = ts_ms + 4 * max(resend_delay_ms, interval_ms)
                out.append(dataclasses.replace(a))
        return out

    @property
    def state(self) -> AlertState:
        """The most severe state of its alerts (what ``/api/v1/rules`` shows)."""
        states = {a.state for a in self.active.values()}
        for s in (AlertState.FIRING, AlertState.PENDING):
            if s in states:
                return s
        return AlertState.INACTIVE


def eval_timestamp(key: str, interval_ms: int, now_ms: int) -> int:
    """The group's latest slot at or before ``now_ms``: multiples of the interval shifted by a
    per-group offset (a hash of file and name), as Prometheus spreads groups over the interval."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    offset = int.from_bytes(digest, "little") % interval_ms
    adj = now_ms - offset
    return adj - adj % interval_ms + offset


class Group:
    """A group's rules and state; :meth:`eval` runs every rule at one timestamp, in order."""

    def __init__(self, spec: GroupSpec) -> None:
        self.spec = spec
        self.rules: list[AlertingRule | RecordingRule] = [
            AlertingRule(r, spec.labels) if r.kind == "alert" else RecordingRule(r, spec.labels)
            for r in spec.rules
        ]
        self.last_eval_ms = 0
        self.eval_seconds = 0.0

    @property
    def key(self) -> str:
        return self.spec.key

    def adopt(self, old: Group) -> None:
        """Carry alert state and last-returned series over from the group this one replaces (a reload)."""
        by_name = {(type(r).__name__, r.name, r.spec.expr, r.labels): r for r in old.rules}
        for r in self.rules:
            prev = by_name.get((type(r).__name__, r.name, r.spec.expr, r.labels))
            if prev is None:
                continue
            r.previous_series = prev.previous_series
            r.health, r.last_error, r.last_eval_ms, r.eval_seconds = (
                prev.health,
                prev.last_error,
                prev.last_eval_ms,
                prev.eval_seconds,
            )
            if isinstance(r, AlertingRule) and isinstance(prev, AlertingRule):
                r.active = prev.active
        self.last_eval_ms, self.eval_seconds = old.last_eval_ms, old.eval_seconds

    def eval(
        self,
        engine: Engine,
        ts_ms: int,
        *,
        external_labels: Mapping[str, str] | None = None,
        external_url: str = "",
        write: Callable[[list[WrittenSample]], None] | None = None,
        on_alerts: Callable[[AlertingRule, int], None] | None = None,
        before_rule: Callable[[Rule], None] | None = None,
    ) -> None:
        """Evaluate every rule at ``ts_ms``; each rule's samples are written before the next rule
        runs (a recording rule's output is visible to the rules after it, as in Prometheus)."""
        start = time.perf_counter()
        offset = self.spec.query_offset_ms
        for rule in self.rules:
            if before_rule is not None:
                before_rule(rule)
            t0 = time.perf_counter()
            rule.last_eval_ms = ts_ms
            try:
                if isinstance(rule, AlertingRule):
                    samples = rule.eval(
                        engine,
                        ts_ms,
                        self.spec.limit,
                        query_offset_ms=offset,
                        external_labels=external_labels,
                        external_url=external_url,
                    )
                else:
                    samples = rule.eval(engine, ts_ms - offset, self.spec.limit)
            except RuleEvalError as exc:
                rule.health, rule.last_error = "err", str(exc)
                rule.eval_seconds = time.perf_counter() - t0
                continue
            rule.health, rule.last_error = ("err", rule.discarded) if rule.discarded else ("ok", "")
            if isinstance(rule, AlertingRule) and on_alerts is not None:
                on_alerts(rule, ts_ms)
            returned = {lbl for lbl, _, _ in samples}
            stale_at = ts_ms - offset
            samples += [(lbl, stale_at, STALE_NAN) for lbl in rule.previous_series - returned]
            rule.previous_series = returned
            if write is not None and samples:
                write(samples)
            rule.eval_seconds = time.perf_counter() - t0
        self.last_eval_ms = ts_ms
        self.eval_seconds = time.perf_counter() - start

    def stale_all(self, ts_ms: int) -> list[WrittenSample]:
        """Staleness markers for every series the group wrote last (when it is removed or handed over)."""
        out: list[WrittenSample] = []
        for rule in self.rules:
            out += [(lbl, ts_ms, STALE_NAN) for lbl in rule.previous_series]
            rule.previous_series = set()
        return out


def finite(v: float) -> bool:
    return not (math.isnan(v) or math.isinf(v))
