"""The rule manager inside ``ki collector``: loads rule files, runs each group on its own thread.

Each group is evaluated at its interval on slots aligned as Prometheus aligns them
(:func:`~kernel_insight.rules.evaluation.eval_timestamp`); what it produces is written
into the store (recorded series, ``ALERTS``, ``ALERTS_FOR_STATE``, staleness markers)
and firing or resolved alerts go to the :class:`~kernel_insight.rules.notifier.Notifier`.
Over a shared ClickHouse a :class:`~kernel_insight.rules.lease.Lease` decides which
collector evaluates a group; the collector that takes a group over (or starts again)
reads ``ALERTS_FOR_STATE`` back, so pending and firing alerts keep their start time.
A reload that fails keeps the groups that were running (as Prometheus does).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernel_insight.collector.clickhouse.store import StorageError, Store
from kernel_insight.collector.rows import HistogramBuilder, SampleBuilder
from kernel_insight.kql.engine import Engine
from kernel_insight.kql.storage import Matcher, is_stale_value
from kernel_insight.rules.config import (
    DEFAULT_INTERVAL_MS,
    GroupSpec,
    RuleFileError,
    expand_globs,
    load_files,
)
from kernel_insight.rules.defaults import DEFAULT_RESEND_DELAY_MS
from kernel_insight.rules.evaluation import (
    AlertingRule,
    Group,
    RestoredState,
    Rule,
    WrittenSample,
    eval_timestamp,
)
from kernel_insight.rules.lease import Lease
from kernel_insight.rules.notifier import Notifier, alert_payload
from kernel_insight.rules.prefetch import CycleStorage, read_windows, served_from_memory

__all__ = [
    "OUTAGE_TOLERANCE_MS",
    "ReloadStatus",
    "RuleManager",
    "rule_manager_for",
]

#: How far back ALERTS_FOR_STATE is read when restoring (Prometheus' ``--rules.alert.for-outage-tolerance``).
OUTAGE_TOLERANCE_MS = 3_600_000


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class ReloadStatus:
    """The outcome of the last (re)load: ``error`` empty when it succeeded."""

    at_ms: int
    error: str = ""
    files: tuple[str, ...] = ()


class _Writer:
    """Buffers a group's output and writes it in one insert at the end of the evaluation.

    A rule that reads a buffered metric sees it through the evaluation's
    :class:`CycleStorage` when all its reads are answered from memory; otherwise the buffer
    is inserted first, as Prometheus commits each rule's output before the next rule runs.
    """

    def __init__(self, store: Store, cycle: CycleStorage | None = None) -> None:
        self.store = store
        self.cycle = cycle
        self.buffer: list[WrittenSample] = []
        self.absorbed = 0  # buffer[:absorbed] is already in the cycle's memory
        self.names: set[str] = set()
        self.served: dict[int, bool] = {}

    def add(self, samples: list[WrittenSample]) -> None:
        self.buffer += samples
        for labels, _, _ in samples:
            for k, v in labels:
                if k == "__name__":
                    self.names.add(v)
                    break

    def before(self, rule: Rule) -> None:
        if len(self.buffer) == self.absorbed or not any(n in rule.spec.expr for n in self.names):
            return
        served = self.served.get(id(rule))
        if served is None:
            served = self.served[id(rule)] = served_from_memory(rule.spec.query)
        if served and self.cycle is not None:
            self.cycle.absorb(self.buffer[self.absorbed :], load=True)
            self.absorbed = len(self.buffer)
        else:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        b = SampleBuilder()
        h = HistogramBuilder()
        for labels, ts, value in self.buffer:
            if isinstance(value, float):
                b.add_canonical(labels, ts, value)
            else:
                # Native histograms recorded by a rule go into the histograms table as
                # remote_write's do (docs/storage.md). The rule checked them as Prometheus'
                # TSDB does (validate()); the table also wants no more observations in the
                # buckets than the count, which only float rounding past 1e-9 could break.
                try:
                    h.add_histogram(labels, ts, value)
                except ValueError as exc:
                    print(
                        f"ki: rules: histogram sample of {dict(labels)} not written: {exc}", file=sys.stderr
                    )
        rest = self.buffer[self.absorbed :]
        self.buffer, self.names, self.absorbed = [], set(), 0
        if len(b):
            self.store.insert_samples(b.build())
        if len(h):
            self.store.insert_histograms(h.build())
        if self.cycle is not None:
            self.cycle.absorb(rest)


class _Runner:
    """One group's thread: wait for the next slot, hold the lease, evaluate, write, notify."""

    def __init__(self, manager: RuleManager, group: Group) -> None:
        self.manager = manager
        self.group = group
        self.stop = threading.Event()
        self.leader = manager.lease is None
        self.needs_restore = True
        self.thread = threading.Thread(target=self._run, name=f"ki-rules-{group.spec.name}", daemon=True)
        #: How far back each metric is read, so one evaluation reads each metric once (rules/prefetch.py).
        self.windows = read_windows(r.spec.query for r in group.rules)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        spec = self.group.spec
        interval = spec.interval_ms
        next_ts = eval_timestamp(spec.key, interval, self.manager.clock()) + interval
        while not self.stop.wait(max(0.0, (next_ts - self.manager.clock()) / 1000)):
            now = self.manager.clock()
            if now - next_ts >= interval:  # missed slots: evaluate the latest, as Prometheus does
                next_ts += (now - next_ts) // interval * interval
            ts, next_ts = next_ts, next_ts + interval
            try:
                self.tick(ts)
            except Exception as exc:  # a store outage must not end the group's thread
                self.group.last_eval_ms = ts
                for r in self.group.rules:
                    r.health, r.last_error = "err", f"{type(exc).__name__}: {exc}"

    def tick(self, ts: int) -> None:
        """One evaluation slot (also what tests call directly)."""
        m = self.manager
        spec = self.group.spec
        if m.lease is not None:
            try:
                held = m.lease.hold(spec.key, spec.interval_ms * 3 // 2)
            except StorageError:
                held = False
            if not held:
                self.leader = False
                self.needs_restore = True
                return
            self.leader = True
        if self.needs_restore:
            m.restore(self.group, ts)
            self.needs_restore = False
        storage = CycleStorage(m.store.storage(), ts - spec.query_offset_ms, self.windows)
        writer = _Writer(m.store, storage)
        self.group.eval(
            Engine(storage),
            ts,
            external_labels=m.external_labels,
            external_url=m.external_url,
            write=writer.add,
            on_alerts=lambda rule, t: m.notify(rule, t, spec.interval_ms),
            before_rule=writer.before,
        )
        writer.flush()


class RuleManager:
    """Rule groups from ``patterns`` evaluated over ``store``; ``start()``/``shutdown()`` (safe twice).

    Example::

        manager = RuleManager(store, ["deploy/rules/*.yml"], alertmanagers=["http://127.0.0.1:9093"])
        manager.start()
    """

    def __init__(
        self,
        store: Store,
        patterns: Sequence[str],
        *,
        alertmanagers: Sequence[str] = (),
        external_url: str = "",
        external_labels: Mapping[str, str] | None = None,
        resend_delay_ms: int = DEFAULT_RESEND_DELAY_MS,
        lease: Lease | None = None,
        default_interval_ms: int = DEFAULT_INTERVAL_MS,
        notifier: Notifier | None = None,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self.store = store
        self.patterns = list(patterns)
        self.external_url = external_url
        self.external_labels = dict(external_labels or {})
        self.resend_delay_ms = resend_delay_ms
        self.lease = lease
        self.default_interval_ms = default_interval_ms
        self.notifier = notifier or Notifier(alertmanagers)
        self.clock = clock
        self.runners: dict[str, _Runner] = {}
        self.status = ReloadStatus(0)
        self._lock = threading.Lock()
        self._started = False

    # ---- loading ---------------------------------------------------------------------

    def _specs(self) -> tuple[list[GroupSpec], list[str]]:
        files = expand_globs(self.patterns)
        return load_files(files, default_interval_ms=self.default_interval_ms), files

    def load(self) -> None:
        """Load the rule files (raises :class:`RuleFileError`); groups start with :meth:`start`."""
        specs, files = self._specs()
        with self._lock:
            self.runners = {s.key: _Runner(self, Group(s)) for s in specs}
            self.status = ReloadStatus(self.clock(), "", tuple(files))

    def reload(self) -> ReloadStatus:
        """Read the rule files again; unchanged groups keep running, changed ones keep their alerts.
        On an error nothing changes and the error is returned (and shown by the API)."""
        try:
            specs, files = self._specs()
        except RuleFileError as exc:
            self.status = ReloadStatus(self.clock(), str(exc), self.status.files)
            return self.status
        with self._lock:
            old = self.runners
            new: dict[str, _Runner] = {}
            for s in specs:
                prev = old.get(s.key)
                if prev is not None and prev.group.spec == s:
                    new[s.key] = prev
                    continue
                group = Group(s)
                if prev is not None:
                    group.adopt(prev.group)
                runner = _Runner(self, group)
                if prev is not None:
                    runner.needs_restore = prev.needs_restore
                new[s.key] = runner
            stopped = [r for k, r in old.items() if new.get(k) is not r]
            for r in stopped:
                r.stop.set()
            self.runners = new
            if self._started:
                for r in new.values():
                    if not r.thread.is_alive() and not r.stop.is_set():
                        r.start()
        for r in stopped:
            if r.thread.is_alive():
                r.thread.join(timeout=5)
            if r.group.key not in new and r.leader:
                self._write_stale(r.group)
        self.status = ReloadStatus(self.clock(), "", tuple(files))
        return self.status

    def _write_stale(self, group: Group) -> None:
        samples = group.stale_all(self.clock())
        if samples:
            w = _Writer(self.store)
            w.add(samples)
            with contextlib.suppress(StorageError):
                w.flush()

    # ---- running -----------------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        self.notifier.start()
        with self._lock:
            for r in self.runners.values():
                r.start()

    def shutdown(self) -> None:
        if not self._started:
            return
        self._started = False
        with self._lock:
            runners = list(self.runners.values())
        for r in runners:
            r.stop.set()
        for r in runners:
            if r.thread.is_alive():
                r.thread.join(timeout=10)
            if self.lease is not None and r.leader:
                with contextlib.suppress(StorageError):
                    self.lease.release(r.group.key)
        self.notifier.shutdown()

    @property
    def groups(self) -> list[Group]:
        with self._lock:
            return [r.group for r in self.runners.values()]

    def leader_of(self, key: str) -> bool:
        r = self.runners.get(key)
        return r is not None and r.leader

    def tick(self, key: str, ts: int) -> None:
        """Evaluate one group at ``ts`` now (tests and benchmarks, without waiting for the slot)."""
        self.runners[key].tick(ts)

    # ---- state and notification -------------------------------------------------------------

    def restore(self, group: Group, ts_ms: int) -> None:
        """Read back ALERTS_FOR_STATE so alerts keep their active time across a restart or a hand-over."""
        storage = self.store.storage()
        for rule in group.rules:
            if not isinstance(rule, AlertingRule):
                continue
            matchers = [Matcher("__name__", "=", "ALERTS_FOR_STATE"), Matcher("alertname", "=", rule.name)]
            try:
                series = storage.select(matchers, ts_ms - OUTAGE_TOLERANCE_MS, ts_ms)
            except Exception:  # restoring is best effort: a fresh start is what Prometheus does then
                continue
            for s in series:
                if len(s.values) == 0:
                    continue
                last = float(s.values[-1])
                if is_stale_value(last) or np.isnan(last):
                    continue
                key = tuple((k, v) for k, v in s.labels if k != "__name__")
                rule.restored[key] = RestoredState(last, int(s.timestamps[-1]))

    def notify(self, rule: AlertingRule, ts_ms: int, interval_ms: int) -> None:
        """Queue the alerts of ``rule`` that are due (fired, resolved, or not sent for the resend delay)."""
        alerts = rule.alerts_to_send(ts_ms, self.resend_delay_ms, interval_ms)
        if alerts:
            self.notifier.send(
                [alert_payload(a, rule.spec.expr, self.external_url, self.external_labels) for a in alerts]
            )

    def describe(self) -> dict[str, Any]:
        """Counters for logs and the API: groups, rules, notifier figures."""
        groups = self.groups
        return {
            "groups": len(groups),
            "rules": sum(len(g.rules) for g in groups),
            "sent": dict(self.notifier.stats.sent),
            "dropped": self.notifier.stats.dropped,
        }


def _default_external_url(args: argparse.Namespace) -> str:
    """``http(s)://HOST:PORT`` as users reach the collector: the machine's name when it binds every address."""
    import socket

    host = socket.getfqdn() if args.host in ("0.0.0.0", "::", "") else args.host
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if getattr(args, "tls_cert", None) else "http"
    return f"{scheme}://{host}:{args.port}"


def rule_manager_for(
    store: Store,
    args: argparse.Namespace,
    before_reload: Callable[[RuleManager | None], None] | None = None,
) -> RuleManager | None:
    """The manager ``ki collector --rules`` asks for, loaded (raises ValueError on a bad rule file),
    with a lease when the store is a ClickHouse server other collectors may share, and SIGHUP
    wired to a reload. None without ``--rules``.

    ``before_reload`` (``ki collector --config``: the settings file read again) runs first on
    every SIGHUP, with the manager or None; with it SIGHUP is handled even without rules, where
    its default action would end the collector."""
    from kernel_insight.collector.clickhouse.store import ServerStore

    if not args.rules:
        if before_reload is not None:
            _on_sighup(lambda: before_reload(None))
        return None
    manager = RuleManager(
        store,
        args.rules,
        alertmanagers=args.alertmanager,
        external_url=args.external_url or _default_external_url(args),
        resend_delay_ms=int(args.rules_resend_delay * 1000),
        lease=Lease(store) if isinstance(store, ServerStore) else None,
    )
    try:
        manager.load()
    except RuleFileError as exc:
        raise ValueError(f"rule files do not load:\n{exc}") from None
    files = manager.status.files
    print(
        f"ki: rules: {len(manager.groups)} groups from {len(files)} files; see /api/v1/rules and /api/v1/alerts",
        file=sys.stderr,
        flush=True,
    )

    def work() -> None:
        if before_reload is not None:
            before_reload(manager)
        status = manager.reload()
        if status.error:
            print(
                f"ki: rules: reload failed, keeping the old rules:\n{status.error}",
                file=sys.stderr,
                flush=True,
            )
        else:
            print(f"ki: rules: reloaded {len(manager.groups)} groups", file=sys.stderr, flush=True)

    _on_sighup(work)
    return manager


def _on_sighup(work: Callable[[], None]) -> None:
    """Run ``work`` on a thread at each SIGHUP (a reload reads files and may wait on a lock: not
    in a signal handler). Only the main thread may set a handler; elsewhere (tests) nothing is set."""

    def on_hup(_signum: int, _frame: object) -> None:
        threading.Thread(target=work, name="ki-reload", daemon=True).start()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, on_hup)
