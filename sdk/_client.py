"""The clients: :class:`HealthClient` (snapshot cache + instance selection) and :class:`KqlClient` (queries).

Each client's logic lives in a sans-I/O core (``_HealthCore``, ``_KqlCore``) that builds
requests and interprets responses; the sync classes and the async ones only move bytes
with ``httpx.Client`` or ``httpx.AsyncClient`` and sleep the way their world sleeps.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random as _random
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

import httpx

from kernel_insight.sdk._exceptions import (
    ApiError,
    NoEligibleInstance,
    ServerError,
    SnapshotUnavailable,
    TransportError,
    error_for,
)
from kernel_insight.sdk._models import HealthSnapshot, Instance, QueryResult
from kernel_insight.sdk._select import LoadPolicy, SelectionIndex

__all__ = [
    "DEFAULT_MAX_STALE_S",
    "DEFAULT_TTL_S",
    "AsyncHealthClient",
    "AsyncKqlClient",
    "HealthClient",
    "KqlClient",
]

log = logging.getLogger("kernel_insight.sdk")

#: How long a snapshot is used without asking the server (the server says max-age=30).
DEFAULT_TTL_S = 30.0
#: How old the last good snapshot may grow while the server is unreachable before selection fails.
DEFAULT_MAX_STALE_S = 300.0
#: The first wait before asking an unreachable server again; doubles up to the TTL.
_FIRST_RETRY_S = 1.0
SNAPSHOT_PATH = "/v1/health/snapshot"
#: How long each of the watch thread's long-polls asks the server to hold (``?wait=``).
WATCH_WAIT_S = 10.0

TimeLike = float | int | dt.datetime
StepLike = float | int | dt.timedelta | str


def _headers(token: str | None) -> dict[str, str]:
    headers = {"Accept": "application/json", "User-Agent": "kernel-insight-sdk/0.1"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _api_error(response: httpx.Response) -> ApiError:
    """The server's error body (Prometheus shape, or FastAPI's ``detail``) as an exception."""
    error_type, message = "unknown", response.text[:500] or response.reason_phrase
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        if "errorType" in body or "error" in body:
            error_type = str(body.get("errorType", error_type))
            message = str(body.get("error", message))
        elif "detail" in body:
            error_type = "bad_data" if response.status_code in (400, 422) else error_type
            message = str(body["detail"])
    return error_for(response.status_code, error_type, message)


# ------------------------------------------------------------------------------ health


# ------------------------------------------------------------------------------ shared I/O

_T = TypeVar("_T")


class _Closing:
    """``close()`` and the with-block of a sync client over ``self._http`` (an ``httpx.Client``)."""

    _http: httpx.Client

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _AsyncClosing:
    """``aclose()`` and the async with-block of an async client over ``self._http``."""

    _http: httpx.AsyncClient

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class _Retries(Protocol):
    def transport_failure(self, exc: httpx.TransportError, attempt: int, url: httpx.URL) -> float: ...


def _retried(
    send: Callable[[], httpx.Response],
    outcome: Callable[[httpx.Response, int], _T | float],
    retries: _Retries,
    url: httpx.URL,
    sleep: Callable[[float], Any],
) -> _T:
    """Send until ``outcome`` gives a result (not a delay) or raises: the retry loop of the kql and
    timeline clients. A connection error waits as ``retries`` says, or raises TransportError."""
    attempt = 0
    while True:
        try:
            response = send()
        except httpx.TransportError as exc:
            wait = retries.transport_failure(exc, attempt, url)
        else:
            result = outcome(response, attempt)
            if not isinstance(result, int | float):  # a delay: retry after it
                return result
            wait = result
        sleep(wait)
        attempt += 1


async def _aretried(
    send: Callable[[], Awaitable[httpx.Response]],
    outcome: Callable[[httpx.Response, int], _T | float],
    retries: _Retries,
    url: httpx.URL,
    sleep: Callable[[float], Any],
) -> _T:
    """:func:`_retried` for the async clients (``sleep`` is awaited)."""
    attempt = 0
    while True:
        try:
            response = await send()
        except httpx.TransportError as exc:
            wait = retries.transport_failure(exc, attempt, url)
        else:
            result = outcome(response, attempt)
            if not isinstance(result, int | float):  # a delay: retry after it
                return result
            wait = result
        await sleep(wait)
        attempt += 1


class _HealthCore:
    """The cache, the selection index and the exclusions that both health clients share."""

    def __init__(
        self,
        ttl: float,
        max_stale: float,
        clock: Callable[[], float],
        random: Callable[[], float],
        load_policy: LoadPolicy | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if ttl < 0 or max_stale < 0:
            raise ValueError("ttl and max_stale must not be negative")
        self.ttl = ttl
        self.max_stale = max_stale
        self.clock = clock
        self.wall_clock = wall_clock
        self.random = random
        self.load_policy = load_policy or LoadPolicy()
        #: This client's requests in flight: instance id -> {ticket: wall_clock() when sent}.
        self.flying: dict[str, dict[int, float]] = {}
        self._ticket = 0
        self.watching = False
        self.snapshot: HealthSnapshot | None = None
        self.index: SelectionIndex | None = None
        self.fetched_at = -float("inf")  # clock() of the last answer (200 or 304)
        self.next_attempt = -float("inf")  # no request before this after a failure
        self.retry_s = _FIRST_RETRY_S
        self.excluded: dict[str, float] = {}  # id -> clock() until which it is excluded
        self.reasons: dict[str, str] = {}

    def due(self, now: float) -> bool:
        if self.watching and self.snapshot is not None and now - self.fetched_at < WATCH_WAIT_S + 5.0:
            return False  # the watch thread's long-poll keeps it current
        return self.snapshot is None or (now - self.fetched_at >= self.ttl and now >= self.next_attempt)

    def request_headers(self) -> dict[str, str]:
        if self.snapshot is not None and self.snapshot.etag:
            return {"If-None-Match": self.snapshot.etag}
        return {}

    def accept(self, response: httpx.Response, now: float) -> HealthSnapshot:
        if response.status_code == 304 and self.snapshot is not None:
            self._contact(now)
            return self.snapshot
        if response.status_code != 200:
            raise _api_error(response)
        snap = HealthSnapshot.from_json(response.json(), response.headers.get("etag"))
        self.snapshot, self.index = snap, SelectionIndex(snap.instances)
        self._contact(now)
        return snap

    def begin(self, instance_id: str) -> int:
        """Count a request sent to ``instance_id`` (its serving figures do not show it yet)."""
        self._ticket += 1
        self.flying.setdefault(instance_id, {})[self._ticket] = self.wall_clock()
        return self._ticket

    def end(self, instance_id: str, ticket: int) -> None:
        mine = self.flying.get(instance_id)
        if mine is not None:
            mine.pop(ticket, None)

    def own(self, instance: Instance) -> int:
        """This client's requests in flight on ``instance`` sent after its serving figures were
        sampled (all of them in flight when it has none): what the figures cannot show yet."""
        mine = self.flying.get(instance.id)
        if not mine:
            return 0
        since = -float("inf") if instance.serving is None else instance.serving.sample_ms / 1000.0
        return sum(1 for t in list(mine.values()) if t >= since)

    def _contact(self, now: float) -> None:
        self.fetched_at = now
        self.next_attempt = -float("inf")
        self.retry_s = _FIRST_RETRY_S

    def fallback(self, exc: Exception, now: float) -> HealthSnapshot:
        """The last snapshot while it is younger than max_stale; else SnapshotUnavailable."""
        self.next_attempt = now + self.retry_s
        self.retry_s = min(self.retry_s * 2, max(self.ttl, _FIRST_RETRY_S))
        age = now - self.fetched_at
        if self.snapshot is not None and age <= self.max_stale:
            log.warning("health snapshot refresh failed (%s); serving the last one, %.0f s old", exc, age)
            return self.snapshot
        if self.snapshot is None:
            raise SnapshotUnavailable(f"no health snapshot: {exc}") from exc
        raise SnapshotUnavailable(
            f"health snapshot is {age:.0f} s old, more than max_stale={self.max_stale:g} s, "
            f"and the server does not answer: {exc}"
        ) from exc

    def select(
        self,
        snapshot: HealthSnapshot,
        required_free_bytes: int,
        model: str | None,
        avoid: Collection[str] = (),
        prefer: Mapping[str, str] | None = None,
        prefix_key: str | None = None,
    ) -> Instance:
        if required_free_bytes < 0:
            raise ValueError("required_free_bytes must not be negative")
        index = self.index
        assert index is not None
        excluded: Mapping[str, float] = self.excluded
        if avoid:
            excluded = {**excluded, **dict.fromkeys(avoid, float("inf"))}
        if prefer:
            near = index.pick_preferring(
                required_free_bytes, model, prefer, self.random, excluded, self.clock()
            )
            if near is not None:
                return near
        if index.loaded(model):
            chosen = index.pick_loaded(
                required_free_bytes,
                model,
                self.random,
                excluded,
                self.clock(),
                self.own,
                self.load_policy,
                prefix_key,
                self.wall_clock(),
            )
        else:
            chosen = index.pick(required_free_bytes, model, self.random, excluded, self.clock())
        if chosen is not None:
            return chosen
        raise NoEligibleInstance(self.why_none(snapshot, required_free_bytes, model, excluded))

    def why_none(
        self,
        snapshot: HealthSnapshot,
        required_free_bytes: int,
        model: str | None,
        excluded: Mapping[str, float] | None = None,
    ) -> str:
        """Why no instance qualifies, naming the condition that failed first (model, room, exclusions)."""
        index = self.index
        assert index is not None
        now = self.clock()
        what = f"model {model!r}" if model is not None else "any model"
        head = f"no instance for {what} with {_size(required_free_bytes)} free: "
        if model is not None and not index.serves(model):
            served = ", ".join(repr(m) for m in index.models()[:10]) or "none (no instance has a model label)"
            return (
                head + f"none of the {index.size} healthy instances serves model {model!r} "
                f"({len(snapshot.instances)} in the snapshot; models served: {served})"
            )
        room = index.candidates(required_free_bytes, model)
        out = self.excluded if excluded is None else excluded
        n_out = sum(1 for i in room if out.get(i.id, 0.0) > now)
        most = index.most_free(model)
        serving = "" if model is None else f"{index.count(model)} of them serve it, "
        return head + (
            f"{len(snapshot.instances)} in the snapshot, {index.size} healthy, {serving}"
            f"{len(room)} with the room (most free: {_size(most)}), "
            f"{n_out} of those excluded"
        )

    def exclude(self, instance_id: str, seconds: float, reason: str) -> None:
        # Copy on write: selecting threads read the old dicts while this builds new ones.
        now = self.clock()
        excluded = {k: until for k, until in self.excluded.items() if until > now}
        excluded[instance_id] = now + seconds
        self.reasons = {**{k: r for k, r in self.reasons.items() if k in excluded}, instance_id: reason}
        self.excluded = excluded


class HealthClient(_Closing):
    """The fleet's health snapshot, cached and revalidated with its ETag, and instance selection over it.

    >>> client = HealthClient("http://collector:8470", token="ki_...")    # doctest: +SKIP
    >>> inst = client.select_instance(20 << 30, model="llama-70b")       # doctest: +SKIP
    >>> client.exclude(inst.id, seconds=300, reason="kernel_oom")        # doctest: +SKIP

    The snapshot is reused for ``ttl`` seconds, then revalidated (a 304 costs nothing).
    While the server is unreachable the last snapshot keeps serving until it is
    ``max_stale`` seconds old; then :class:`SnapshotUnavailable` is raised. Failed
    refreshes back off (1 s, doubling up to ``ttl``) so selection stays fast meanwhile.
    Thread-safe: one thread refreshes while the others use the cached snapshot.

    ``watch=True`` keeps the snapshot current instead: a background thread long-polls the
    server (``?wait=``, docs/api.md "Caching") on its kept-alive connection, so a change is seen
    one server rebuild after its data arrives, with no request per ``ttl``; selection never waits
    for the network. Routing by the serving engines' queues wants that (docs/routing.md).
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        ttl: float = DEFAULT_TTL_S,
        *,
        max_stale: float = DEFAULT_MAX_STALE_S,
        timeout: float = 2.0,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
        random: Callable[[], float] | None = None,
        load_policy: LoadPolicy | None = None,
        wall_clock: Callable[[], float] = time.time,
        watch: bool = False,
    ) -> None:
        self._core = _HealthCore(ttl, max_stale, clock, random or _random.random, load_policy, wall_clock)
        self._http = httpx.Client(base_url=url, headers=_headers(token), timeout=timeout, transport=transport)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        if watch:
            self._core.watching = True
            self._watcher = threading.Thread(target=self._watch, name="ki-health-watch", daemon=True)
            self._watcher.start()

    def _watch(self) -> None:
        """Long-poll the snapshot (``?wait=``, If-None-Match) in a loop: each change arrives one
        rebuild after its data; on failure back off as :meth:`snapshot` does, then poll again."""
        core = self._core
        timeout = httpx.Timeout(self._http.timeout.connect, read=WATCH_WAIT_S + 10.0)
        while not self._stop.is_set():
            try:
                response = self._http.get(
                    SNAPSHOT_PATH,
                    params={"wait": WATCH_WAIT_S},
                    headers=core.request_headers(),
                    timeout=timeout,
                )
                with self._lock:
                    core.accept(response, core.clock())
                continue
            except (httpx.TransportError, ServerError) as exc:
                if self._stop.is_set():
                    return
                log.warning("health snapshot long-poll failed (%s); retrying in %.0f s", exc, core.retry_s)
                wait = core.retry_s
                core.retry_s = min(core.retry_s * 2, max(core.ttl, _FIRST_RETRY_S))
            except (ApiError, RuntimeError) as exc:  # 401/403, or the client was closed
                if not self._stop.is_set():
                    log.warning("health snapshot long-poll stopped: %s", exc)
                core.watching = False
                return
            self._stop.wait(wait)

    def close(self) -> None:
        self._stop.set()
        self._core.watching = False
        self._http.close()
        if self._watcher is not None:
            self._watcher.join(timeout=1.0)

    def snapshot(self) -> HealthSnapshot:
        """The current snapshot, fetched or revalidated when the TTL has passed."""
        core = self._core
        now = core.clock()
        if not core.due(now):
            assert core.snapshot is not None
            return core.snapshot
        if not self._lock.acquire(blocking=core.snapshot is None):
            assert core.snapshot is not None  # another thread is refreshing
            return core.snapshot
        try:
            now = core.clock()
            if not core.due(now):
                assert core.snapshot is not None
                return core.snapshot
            try:
                response = self._http.get(SNAPSHOT_PATH, headers=core.request_headers())
            except httpx.TransportError as exc:
                return core.fallback(TransportError(f"cannot reach {self._http.base_url}: {exc}"), now)
            try:
                return core.accept(response, now)
            except ServerError as exc:
                return core.fallback(exc, now)
        finally:
            self._lock.release()

    def select_instance(
        self,
        required_free_bytes: int,
        model: str | None = None,
        *,
        avoid: Collection[str] = (),
        prefer: Mapping[str, str] | None = None,
        prefix_key: str | None = None,
    ) -> Instance:
        """A healthy instance serving ``model`` with ``required_free_bytes`` free, drawn by weight.

        Eligible: healthy, not stale, serving ``model`` (any when None), at least
        ``required_free_bytes`` of GPU memory free, not excluded. Among them the draw is
        weighted by ``free_bytes / (1 + p99 / p99_ref) / (1 + errors_5m)`` (see
        :func:`kernel_insight.sdk.weight` for why). ``avoid``: ids left out of this one pick
        (those a request already failed on). ``prefer``: labels such as ``{"rack": "r4"}`` (the
        caller's own place); an eligible instance carrying them is drawn if there is one, any
        eligible instance otherwise. Raises :class:`NoEligibleInstance`.

        When the eligible instances report their serving engine's load (``Instance.serving``),
        two such draws are made and the less loaded one wins (:func:`kernel_insight.sdk.load_cost`,
        this client's own requests in flight included); ``prefix_key``
        (:func:`kernel_insight.sdk.prefix_key` of the prompt) sends requests sharing a prefix to
        the same instance while it is not much more loaded (docs/routing.md).
        """
        snap = self.snapshot()
        return self._core.select(snap, required_free_bytes, model, avoid, prefer, prefix_key)

    def begin(self, instance_id: str) -> int:
        """Count a request sent to ``instance_id`` until :meth:`end` (``route`` does both)."""
        return self._core.begin(instance_id)

    def end(self, instance_id: str, ticket: int) -> None:
        self._core.end(instance_id, ticket)

    def exclude(self, instance_id: str, seconds: float = 300, reason: str = "") -> None:
        """Leave ``instance_id`` out of selection for ``seconds`` (after a kernel_oom, an nccl_timeout, ...)."""
        self._core.exclude(instance_id, seconds, reason)

    def excluded(self) -> dict[str, str]:
        """Instances excluded now, with the reason given."""
        now = self._core.clock()
        return {k: self._core.reasons.get(k, "") for k, until in self._core.excluded.items() if until > now}


class AsyncHealthClient(_AsyncClosing):
    """:class:`HealthClient` for asyncio; the same cache, selection and exclusions."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        ttl: float = DEFAULT_TTL_S,
        *,
        max_stale: float = DEFAULT_MAX_STALE_S,
        timeout: float = 2.0,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
        random: Callable[[], float] | None = None,
        load_policy: LoadPolicy | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._core = _HealthCore(ttl, max_stale, clock, random or _random.random, load_policy, wall_clock)
        self._http = httpx.AsyncClient(
            base_url=url, headers=_headers(token), timeout=timeout, transport=transport
        )
        self._lock = asyncio.Lock()

    async def snapshot(self) -> HealthSnapshot:
        core = self._core
        if not core.due(core.clock()):
            assert core.snapshot is not None
            return core.snapshot
        if self._lock.locked() and core.snapshot is not None:
            return core.snapshot
        async with self._lock:
            now = core.clock()
            if not core.due(now):
                assert core.snapshot is not None
                return core.snapshot
            try:
                response = await self._http.get(SNAPSHOT_PATH, headers=core.request_headers())
            except httpx.TransportError as exc:
                return core.fallback(TransportError(f"cannot reach {self._http.base_url}: {exc}"), now)
            try:
                return core.accept(response, now)
            except ServerError as exc:
                return core.fallback(exc, now)

    async def select_instance(
        self,
        required_free_bytes: int,
        model: str | None = None,
        *,
        avoid: Collection[str] = (),
        prefer: Mapping[str, str] | None = None,
        prefix_key: str | None = None,
    ) -> Instance:
        snap = await self.snapshot()
        return self._core.select(snap, required_free_bytes, model, avoid, prefer, prefix_key)

    def begin(self, instance_id: str) -> int:
        return self._core.begin(instance_id)

    def end(self, instance_id: str, ticket: int) -> None:
        self._core.end(instance_id, ticket)

    def exclude(self, instance_id: str, seconds: float = 300, reason: str = "") -> None:
        self._core.exclude(instance_id, seconds, reason)


# ------------------------------------------------------------------------------ kql


def _time_param(value: TimeLike) -> str:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime: give it a timezone (e.g. datetime.now(timezone.utc))")
        return repr(value.timestamp())
    return repr(float(value))


def _step_param(value: StepLike) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dt.timedelta):
        return repr(value.total_seconds())
    return repr(float(value))


class _KqlCore:
    """Request parameters, response interpretation and the retry schedule of both kql clients."""

    def __init__(self, retries: int, backoff_s: float, max_backoff_s: float) -> None:
        if retries < 0:
            raise ValueError("retries must not be negative")
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s

    @staticmethod
    def instant(query: str, time: TimeLike | None, timeout: float | None) -> dict[str, str]:
        params = {"query": query}
        if time is not None:
            params["time"] = _time_param(time)
        if timeout is not None:
            params["timeout"] = repr(float(timeout))
        return params

    @staticmethod
    def range(
        query: str, start: TimeLike, end: TimeLike, step: StepLike, timeout: float | None
    ) -> dict[str, str]:
        params = {
            "query": query,
            "start": _time_param(start),
            "end": _time_param(end),
            "step": _step_param(step),
        }
        if timeout is not None:
            params["timeout"] = repr(float(timeout))
        return params

    def delay(self, attempt: int, retry_after: str | None) -> float:
        """Exponential backoff with full jitter, or the server's Retry-After when it gives one."""
        if retry_after is not None:
            try:
                return float(min(float(retry_after), self.max_backoff_s))
            except ValueError:
                pass
        return _random.uniform(0, min(self.max_backoff_s, self.backoff_s * 2**attempt))

    def outcome(self, response: httpx.Response, attempt: int) -> QueryResult | float:
        """The result, or the delay before the next attempt; raises a 4xx, or a 5xx when out of attempts."""
        if response.status_code == 200:
            try:
                return QueryResult.from_json(response.json())
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                raise ServerError(200, "bad_response", f"unexpected response body: {exc}") from None
        error = _api_error(response)
        if response.status_code >= 500 and attempt < self.retries:
            return self.delay(attempt, response.headers.get("retry-after"))
        raise error

    def transport_failure(self, exc: httpx.TransportError, attempt: int, url: httpx.URL) -> float:
        if attempt < self.retries:
            return self.delay(attempt, None)
        raise TransportError(f"cannot reach {url} after {attempt + 1} attempts: {exc}") from exc


class KqlClient(_Closing):
    """kql (PromQL) queries over the Prometheus HTTP API, with retries on 5xx and connection errors.

    >>> kql = KqlClient("http://collector:8470", token="ki_...")               # doctest: +SKIP
    >>> r = kql.query("sum by (instance) (gpu_memory_free_bytes)")             # doctest: +SKIP
    >>> {s.labels["instance"]: s.value for s in r.samples}                      # doctest: +SKIP

    4xx answers raise at once (:class:`BadRequestError` carries ``error_type`` such as
    ``bad_data`` and the server's message); 5xx and connection errors are retried
    ``retries`` times with exponential backoff and jitter (or the server's Retry-After).
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._core = _KqlCore(retries, backoff_s, max_backoff_s)
        self._http = httpx.Client(base_url=url, headers=_headers(token), timeout=timeout, transport=transport)
        self._sleep = sleep

    def _call(self, path: str, params: Mapping[str, str]) -> QueryResult:
        send = lambda: self._http.post(path, data=dict(params))  # noqa: E731
        return _retried(send, self._core.outcome, self._core, self._http.base_url, self._sleep)

    def query(self, query: str, time: TimeLike | None = None, *, timeout: float | None = None) -> QueryResult:
        """Evaluate ``query`` at ``time`` (unix seconds or an aware datetime; default: the server's now)."""
        return self._call("/api/v1/query", self._core.instant(query, time, timeout))

    def query_range(
        self, query: str, start: TimeLike, end: TimeLike, step: StepLike, *, timeout: float | None = None
    ) -> QueryResult:
        """Evaluate ``query`` at ``start, start+step, ... <= end``; ``step`` in seconds, a timedelta or ``"30s"``."""
        return self._call("/api/v1/query_range", self._core.range(query, start, end, step, timeout))


class AsyncKqlClient(_AsyncClosing):
    """:class:`KqlClient` for asyncio."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self._core = _KqlCore(retries, backoff_s, max_backoff_s)
        self._http = httpx.AsyncClient(
            base_url=url, headers=_headers(token), timeout=timeout, transport=transport
        )
        self._sleep = sleep

    async def _call(self, path: str, params: Mapping[str, str]) -> QueryResult:
        send = lambda: self._http.post(path, data=dict(params))  # noqa: E731
        return await _aretried(send, self._core.outcome, self._core, self._http.base_url, self._sleep)

    async def query(
        self, query: str, time: TimeLike | None = None, *, timeout: float | None = None
    ) -> QueryResult:
        return await self._call("/api/v1/query", self._core.instant(query, time, timeout))

    async def query_range(
        self, query: str, start: TimeLike, end: TimeLike, step: StepLike, *, timeout: float | None = None
    ) -> QueryResult:
        return await self._call("/api/v1/query_range", self._core.range(query, start, end, step, timeout))


def _size(nbytes: int) -> str:
    """A memory size as people read it (``45.99 GiB``), not a 11-digit byte count."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} bytes"
