"""Failure-aware routing: run a request on a selected instance and react to *why* it failed.

The reaction depends on the cause, because each cause says something different about
where the request should go next:

* ``oom`` (the kernel ran out of GPU memory): the instance had less room than the snapshot
  said. Retry **at once** (no backoff: nothing will change by waiting) on an instance with
  more free memory than this one had, never this one again for this request.
* ``deadline`` (the request timed out): usually load, not the instance. Back off 100, 200,
  400 ms and draw again.
* ``nccl_timeout`` (a collective timed out): the instance's interconnect is broken and will
  stay broken for a while. Exclude it for everyone using this client for 5 minutes, retry
  at once elsewhere.
* ``other``: the caller's ``on_other`` policy decides (by default: no retry; the response is
  returned or the exception raised as if ``route`` were not there).

Causes come from a :data:`Classifier`: :func:`classify` reads HTTP statuses and bodies, gRPC
statuses (``grpc-status`` headers, or an exception's ``code()``, duck-typed: no grpc dependency)
and exception types and messages. Pass your own to recognise your server's errors.

The sans-I/O :class:`_Attempts` holds the decisions; :func:`route` and :func:`aroute` only
call, sleep and select in their worlds.
"""

from __future__ import annotations

import asyncio
import enum
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import httpx

from kernel_insight.sdk._exceptions import KernelInsightError, NoEligibleInstance
from kernel_insight.sdk._models import Instance

__all__ = [
    "Attempt",
    "Classifier",
    "Failure",
    "RouteFailed",
    "RoutePolicy",
    "aroute",
    "classify",
    "route",
]

T = TypeVar("T")


class Failure(enum.StrEnum):
    """Why an attempt failed, as far as routing cares."""

    OOM = "oom"
    DEADLINE = "deadline"
    NCCL_TIMEOUT = "nccl_timeout"
    OTHER = "other"


class Classifier(Protocol):
    """``(result, exception) -> Failure | None``: what the call returned (None when it raised) and
    what it raised (None when it returned); None means success. :func:`classify` is the default."""

    def __call__(self, response: Any, exc: BaseException | None, /) -> Failure | None: ...


_OOM = re.compile(
    r"out of memory|CUDA_ERROR_OUT_OF_MEMORY|OutOfMemoryError|cudaErrorMemoryAllocation|\bOOM\b|kernel_oom",
    re.IGNORECASE,
)
#: NCCL and a timeout (or the watchdog) in one line, in either order: PyTorch writes
#: "Watchdog caught collective operation timeout: WorkNCCL(...)".
_NCCL_TIMEOUT = re.compile(
    r"nccl[^\n]{0,200}?(timed? ?out|watchdog)|(timed? ?out|watchdog)[^\n]{0,200}?nccl|nccl_timeout",
    re.IGNORECASE,
)
_DEADLINE = re.compile(r"deadline.exceeded|timed? ?out", re.IGNORECASE)
#: gRPC status codes (https://grpc.github.io/grpc/core/md_doc_statuscodes.html) that mean something here.
_GRPC_DEADLINE_EXCEEDED = 4
_GRPC_RESOURCE_EXHAUSTED = 8


def _from_text(text: str, default: Failure | None) -> Failure | None:
    if _NCCL_TIMEOUT.search(text):
        return Failure.NCCL_TIMEOUT
    if _OOM.search(text):
        return Failure.OOM
    if _DEADLINE.search(text):
        return Failure.DEADLINE
    return default


def _grpc(code: int, message: str) -> Failure:
    if code == _GRPC_DEADLINE_EXCEEDED:
        return _from_text(message, None) or Failure.DEADLINE
    if code == _GRPC_RESOURCE_EXHAUSTED:
        return _from_text(message, None) or Failure.OOM
    return _from_text(message, Failure.OTHER) or Failure.OTHER


def classify(response: Any, exc: BaseException | None) -> Failure | None:
    """The default classifier: HTTP status and body, gRPC status and details, exceptions.

    * An ``httpx.Response`` with a 2xx status (and no ``grpc-status`` other than 0) is a success.
      Otherwise the body (first 64 KiB) and the ``grpc-message`` decide: NCCL and time out ->
      ``nccl_timeout``; out of memory (``CUDA_ERROR_OUT_OF_MEMORY``, ``OutOfMemoryError``, ...)
      -> ``oom``; 408, 504 or a deadline in the text -> ``deadline``; 507 -> ``oom``;
      anything else ``other``.
    * ``grpc-status`` 4 (DEADLINE_EXCEEDED) -> ``deadline``, 8 (RESOURCE_EXHAUSTED) -> ``oom``
      unless the details say otherwise.
    * Exceptions: ``httpx.TimeoutException``, ``TimeoutError`` -> ``deadline``; a gRPC error
      (anything with ``code()`` whose value is ``(int, str)``, as ``grpc.StatusCode``) by its
      code and ``details()``; ``torch.cuda.OutOfMemoryError`` and messages as above; else ``other``.
    * Any other return value of the caller's function is a success.
    """
    if exc is not None:
        code = getattr(exc, "code", None)
        if callable(code):
            try:
                status = code()
                value = getattr(status, "value", status)
                number = value[0] if isinstance(value, tuple) else int(value)
                details = getattr(exc, "details", None)
                return _grpc(int(number), str(details() if callable(details) else exc))
            except (TypeError, ValueError, IndexError):
                pass
        if isinstance(exc, httpx.TimeoutException | TimeoutError | asyncio.TimeoutError):
            return Failure.DEADLINE
        return _from_text(f"{type(exc).__name__}: {exc}", Failure.OTHER)
    if not isinstance(response, httpx.Response):
        return None
    grpc_status = response.headers.get("grpc-status")
    if grpc_status is not None and grpc_status.isdigit() and int(grpc_status) != 0:
        return _grpc(int(grpc_status), response.headers.get("grpc-message", ""))
    status = response.status_code
    if 200 <= status < 300:
        return None
    try:
        text = response.content[:65536].decode("utf-8", "replace")
    except (httpx.ResponseNotRead, httpx.StreamError):
        text = ""
    default = Failure.OTHER
    if status in (408, 504):
        default = Failure.DEADLINE
    elif status == 507:
        default = Failure.OOM
    return _from_text(text, default) or default


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try: on which instance, what came of it (None: success), how long it took."""

    instance_id: str
    failure: Failure | None
    elapsed_s: float
    delay_s: float = 0.0  # waited after it, before the next attempt


class RouteFailed(KernelInsightError):
    """Every attempt failed for a cause routing handles, or no instance was left to try.

    ``attempts`` lists them; ``last`` is the last response (or None) and ``__cause__`` the
    last exception, if any.
    """

    def __init__(self, message: str, attempts: Sequence[Attempt], last: Any = None) -> None:
        super().__init__(message)
        self.attempts = tuple(attempts)
        self.last = last


@dataclass(frozen=True, slots=True)
class RoutePolicy:
    """How :func:`route` reacts; the defaults are the ones the module docstring argues for.

    ``on_other(attempt_number, result_or_exception)`` returns the seconds to wait before
    trying again (on another draw), or None to stop and hand the result over unchanged.
    """

    max_attempts: int = 4
    deadline_backoff_s: tuple[float, ...] = (0.1, 0.2, 0.4)
    nccl_exclude_s: float = 300.0
    on_other: Callable[[int, Any], float | None] = field(default=lambda n, outcome: None)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")


_GIVE_UP = -1.0
_SUCCEEDED = -2.0


class _Attempts:
    """The decisions of one routed request, shared by the sync and async loops."""

    def __init__(self, policy: RoutePolicy, required_free_bytes: int) -> None:
        self.policy = policy
        self.required = required_free_bytes
        self.avoid: set[str] = set()
        self.log: list[Attempt] = []
        self.deadlines = 0

    def decide(
        self, inst: Instance, failure: Failure, outcome: Any, elapsed_s: float, exclude: Callable[..., None]
    ) -> float:
        """Seconds to wait before the next attempt, or ``_GIVE_UP`` (hand the outcome over as it is)."""
        delay = 0.0
        p = self.policy
        if failure is Failure.OOM:
            # More room than this one had; never this one again for this request.
            self.avoid.add(inst.id)
            self.required = max(self.required, (inst.gpu_memory_free_bytes or 0) + 1)
        elif failure is Failure.DEADLINE:
            delay = p.deadline_backoff_s[min(self.deadlines, len(p.deadline_backoff_s) - 1)]
            self.deadlines += 1
        elif failure is Failure.NCCL_TIMEOUT:
            exclude(inst.id, p.nccl_exclude_s, "nccl_timeout")
            self.avoid.add(inst.id)
        else:
            wait = p.on_other(len(self.log) + 1, outcome)
            if wait is None:
                self.log.append(Attempt(inst.id, failure, elapsed_s))
                return _GIVE_UP
            delay = max(0.0, float(wait))
        self.log.append(Attempt(inst.id, failure, elapsed_s, delay))
        return delay

    def exhausted(self) -> bool:
        return len(self.log) >= self.policy.max_attempts

    def failed(self, why: str, last: Any) -> RouteFailed:
        causes = ", ".join(f"{a.instance_id}: {a.failure}" for a in self.log)
        return RouteFailed(f"{why} after {len(self.log)} attempt(s) ({causes})", self.log, last)

    def settle(
        self,
        inst: Instance,
        outcome: Any,
        error: BaseException | None,
        elapsed_s: float,
        classifier: Classifier,
        exclude: Callable[..., None],
        observe: Callable[[Attempt], None] | None,
    ) -> float:
        """After one try: _SUCCEEDED (return the outcome), _GIVE_UP (return or raise the call's own
        result), else the delay before the next try; raises RouteFailed when out of tries."""
        failure = classifier(outcome, error)
        if failure is None:
            self.log.append(Attempt(inst.id, None, elapsed_s))
            delay = _SUCCEEDED
        else:
            delay = self.decide(inst, failure, outcome if error is None else error, elapsed_s, exclude)
        if observe is not None:
            observe(self.log[-1])
        if delay in (_SUCCEEDED, _GIVE_UP):
            return delay
        if self.exhausted():
            raise self.failed("routing gave up", outcome) from error
        return delay

    def select(self, exc: NoEligibleInstance) -> Exception:
        """What a failed selection ends with: itself on the first try, RouteFailed after."""
        if not self.log:
            return exc
        return self.failed(f"no instance left to try: {exc}", None)


def _finish(outcome: Any, exc: BaseException | None) -> Any:
    if exc is not None:
        raise exc
    return outcome


def _close(outcome: Any) -> None:
    if isinstance(outcome, httpx.Response):
        outcome.close()


def route(
    health: Any,
    call: Callable[[Instance], T],
    *,
    required_free_bytes: int = 0,
    model: str | None = None,
    prefer: Mapping[str, str] | None = None,
    prefix_key: str | None = None,
    classifier: Classifier = classify,
    policy: RoutePolicy | None = None,
    observe: Callable[[Attempt], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call(instance)`` on an instance ``health`` selects, retried by the failure's cause.

    ``health`` is a :class:`~kernel_insight.sdk.HealthClient`; ``call`` sends the request
    (returning a response, or anything) and may raise. Returns ``call``'s result once it
    succeeds (or once the ``other`` policy stops: the failed result is returned, or its
    exception raised, unchanged). Raises :class:`RouteFailed` when ``max_attempts`` tries
    failed for causes routing handles, or when a retry finds no eligible instance;
    :class:`NoEligibleInstance` when not even the first could be selected. ``observe`` sees
    every :class:`Attempt` (for metrics). ``prefer`` (e.g. ``{"rack": "r4"}``) is passed to
    ``select_instance``: the caller's rack first while it has room; so is ``prefix_key`` (requests
    sharing a prompt prefix go to the same instance while it is not loaded). Each attempt is
    counted as in flight on its instance (``health.begin``/``end``) while it runs, so this
    client's own requests weigh in the next picks before the snapshot shows them.

    >>> r = route(health, lambda i: http.post(i.labels["endpoint"] + "/v1/generate", json=req),
    ...           required_free_bytes=12 << 30, model="llama-70b")              # doctest: +SKIP
    """
    state = _Attempts(policy or RoutePolicy(), required_free_bytes)
    extra = {} if prefix_key is None else {"prefix_key": prefix_key}
    begin, end = getattr(health, "begin", None), getattr(health, "end", None)
    while True:
        try:
            inst = health.select_instance(state.required, model, avoid=state.avoid, prefer=prefer, **extra)
        except NoEligibleInstance as exc:
            raise state.select(exc) from (exc if state.log else None)
        t0 = time.monotonic()
        outcome: Any = None
        error: BaseException | None = None
        ticket = begin(inst.id) if begin is not None else None
        try:
            outcome = call(inst)
        except Exception as exc:  # classified below; re-raised unchanged when not handled
            error = exc
        finally:
            if ticket is not None and end is not None:
                end(inst.id, ticket)
        delay = state.settle(inst, outcome, error, time.monotonic() - t0, classifier, health.exclude, observe)
        if delay == _SUCCEEDED:
            return outcome  # type: ignore[no-any-return]
        if delay == _GIVE_UP:
            return _finish(outcome, error)  # type: ignore[no-any-return]
        _close(outcome)
        if delay > 0:
            sleep(delay)


async def aroute(
    health: Any,
    call: Callable[[Instance], Awaitable[T]],
    *,
    required_free_bytes: int = 0,
    model: str | None = None,
    prefer: Mapping[str, str] | None = None,
    prefix_key: str | None = None,
    classifier: Classifier = classify,
    policy: RoutePolicy | None = None,
    observe: Callable[[Attempt], None] | None = None,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> T:
    """:func:`route` for asyncio: ``health`` is an :class:`~kernel_insight.sdk.AsyncHealthClient`,
    ``call`` a coroutine function; the same decisions."""
    state = _Attempts(policy or RoutePolicy(), required_free_bytes)
    extra = {} if prefix_key is None else {"prefix_key": prefix_key}
    begin, end = getattr(health, "begin", None), getattr(health, "end", None)
    while True:
        try:
            inst = await health.select_instance(
                state.required, model, avoid=state.avoid, prefer=prefer, **extra
            )
        except NoEligibleInstance as exc:
            raise state.select(exc) from (exc if state.log else None)
        t0 = time.monotonic()
        outcome: Any = None
        error: BaseException | None = None
        ticket = begin(inst.id) if begin is not None else None
        try:
            outcome = await call(inst)
        except Exception as exc:
            error = exc
        finally:
            if ticket is not None and end is not None:
                end(inst.id, ticket)
        delay = state.settle(inst, outcome, error, time.monotonic() - t0, classifier, health.exclude, observe)
        if delay == _SUCCEEDED:
            return outcome  # type: ignore[no-any-return]
        if delay == _GIVE_UP:
            return _finish(outcome, error)  # type: ignore[no-any-return]
        if isinstance(outcome, httpx.Response):
            await outcome.aclose()
        if delay > 0:
            await sleep(delay)
