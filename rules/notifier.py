"""Sending alerts to Alertmanager (API v2), as Prometheus' notifier does.

Alerts go into one bounded queue (the oldest are dropped when it is full, as in
Prometheus); a sender thread posts them in batches to every configured Alertmanager
(``POST <url>/api/v2/alerts``). A batch counts as delivered when at least one
Alertmanager took it; there is no retry of a failed batch, because the rule manager
re-sends every firing alert each ``resend_delay`` and Alertmanager deduplicates.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from kernel_insight.rules.evaluation import Alert

__all__ = [
    "DEFAULT_QUEUE_CAPACITY",
    "MAX_BATCH",
    "Notifier",
    "NotifierStats",
    "alert_payload",
    "generator_url",
    "rfc3339",
]

#: Alerts waiting for delivery at most (Prometheus' ``--alertmanager.notification-queue-capacity``).
DEFAULT_QUEUE_CAPACITY = 10_000
#: Alerts per POST (Prometheus' ``maxBatchSize``).
MAX_BATCH = 256


def rfc3339(ms: int) -> str:
    """``2026-12-01T04:47:24.123Z`` (what Go's time.Time marshals to, at millisecond precision)."""
    t = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    text = t.strftime("%Y-%m-%dT%H:%M:%S")
    if ms % 1000:
        text += f".{ms % 1000:03d}".rstrip("0")
    return text + "Z"


def generator_url(external_url: str, expr: str) -> str:
    """Where the alert came from: the rule's query on the collector's query API (Prometheus links
    its ``/graph`` page, which the collector does not serve; Grafana's Explore takes the same query)."""
    return f"{external_url.rstrip('/')}/api/v1/query?query={urllib.parse.quote(expr, safe='')}"


def alert_payload(
    alert: Alert, expr: str, external_url: str, external_labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """One element of the v2 ``postableAlerts`` body: ``startsAt`` is when it fired, ``endsAt``
    when it resolved or, while firing, how long it stays valid without a resend."""
    labels = dict(alert.labels)
    for k, v in (external_labels or {}).items():
        labels.setdefault(k, v)
    ends = alert.resolved_at_ms or alert.valid_until_ms
    return {
        "labels": labels,
        "annotations": dict(alert.annotations),
        "startsAt": rfc3339(alert.fired_at_ms or alert.active_at_ms),
        "endsAt": rfc3339(ends),
        "generatorURL": generator_url(external_url, expr),
    }


@dataclass
class NotifierStats:
    """Counters per Alertmanager URL (sent alerts, failed posts) and alerts dropped by the queue."""

    sent: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    dropped: int = 0
    last_error: str = ""


class Notifier:
    """A queue of alert payloads and the thread that posts them; ``start``/``shutdown`` (safe twice).

    >>> n = Notifier([])        # no Alertmanager: alerts are counted as dropped
    >>> n.send([{"labels": {"alertname": "X"}}])
    >>> n.stats.dropped
    1
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        capacity: int = DEFAULT_QUEUE_CAPACITY,
        timeout_s: float = 10.0,
        client: httpx.Client | None = None,
    ) -> None:
        self.urls = self._endpoints(urls)
        self.capacity = capacity
        self.timeout_s = timeout_s
        self.stats = NotifierStats()
        self._queue: deque[dict[str, Any]] = deque()
        self._cond = threading.Condition()
        self._client = client
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._started = False

    @staticmethod
    def _endpoints(urls: Sequence[str]) -> list[str]:
        return [u.rstrip("/") + "/api/v2/alerts" for u in urls]

    def set_urls(self, urls: Sequence[str]) -> None:
        """Send to these Alertmanagers from now on (a SIGHUP with ``ki collector --config``); the
        alerts queued go to the new ones. Starts the sender when the first is added to a started notifier."""
        self.urls = self._endpoints(urls)
        if self._started and self.urls:
            self.start()

    def send(self, payloads: Sequence[dict[str, Any]]) -> None:
        """Queue alerts for delivery (never blocks); the oldest are dropped past the capacity."""
        if not payloads:
            return
        if not self.urls:
            self.stats.dropped += len(payloads)
            return
        with self._cond:
            self._queue.extend(payloads)
            over = len(self._queue) - self.capacity
            for _ in range(max(0, over)):
                self._queue.popleft()
            self.stats.dropped += max(0, over)
            self._cond.notify()

    def start(self) -> None:
        self._started = True
        if self._thread is not None or not self.urls:
            return
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout_s)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="ki-notifier", daemon=True)
        self._thread.start()

    def shutdown(self, drain_s: float = 2.0) -> None:
        """Deliver what is queued (up to ``drain_s``), then stop."""
        deadline = time.monotonic() + drain_s
        with self._cond:
            while self._queue and self._thread is not None and time.monotonic() < deadline:
                self._cond.wait(0.05)
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 1)
            self._thread = None
        self._started = False
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def queued(self) -> int:
        return len(self._queue)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if self._stopping and not self._queue:
                    return
                batch = [self._queue.popleft() for _ in range(min(MAX_BATCH, len(self._queue)))]
            self._post(batch)
            with self._cond:
                self._cond.notify_all()

    def _post(self, batch: list[dict[str, Any]]) -> None:
        assert self._client is not None
        for url in self.urls:
            try:
                r = self._client.post(url, json=batch)
                ok = 200 <= r.status_code < 300
                error = "" if ok else f"{url}: HTTP {r.status_code}: {r.text[:200]}"
            except httpx.HTTPError as exc:
                ok, error = False, f"{url}: {type(exc).__name__}: {exc}"
            if ok:
                self.stats.sent[url] = self.stats.sent.get(url, 0) + len(batch)
            else:
                self.stats.errors[url] = self.stats.errors.get(url, 0) + 1
                self.stats.last_error = error
