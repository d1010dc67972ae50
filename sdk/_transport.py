"""httpx transports that route every request to a selected instance: existing clients get
failure-aware routing by passing ``transport=``.

The request's URL keeps its path and query; scheme, host and port become the chosen
instance's endpoint, by default its ``endpoint`` label (``http://10.0.0.7:8000``, set at
enrolment with ``--label endpoint=...``). The request body is read once so a retry can send
it again; a failed response's body is read so the classifier can look at it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from kernel_insight.sdk._models import Instance
from kernel_insight.sdk._route import Attempt, Classifier, RoutePolicy, aroute, classify, route

__all__ = ["AsyncRoutingTransport", "RoutingTransport", "endpoint_label"]


def endpoint_label(instance: Instance) -> str:
    """The instance's ``endpoint`` label: where its inference server listens."""
    endpoint = instance.labels.get("endpoint")
    if not endpoint:
        raise ValueError(
            f"instance {instance.id} has no 'endpoint' label (enrol it with --label endpoint=URL)"
        )
    return endpoint


@dataclass(frozen=True, slots=True)
class _RouteSettings:
    """What both routing transports route by: the health client, the request's needs, the policy."""

    health: Any
    model: str | None
    required_free_bytes: int | Callable[[httpx.Request], int]
    endpoint: Callable[[Instance], str]
    classifier: Classifier
    policy: RoutePolicy | None
    observe: Callable[[Attempt], None] | None
    prefix_key: Callable[[httpx.Request], str | None] | None = None

    def options(self, request: httpx.Request) -> dict[str, Any]:
        """The keyword arguments of :func:`route` / :func:`aroute` for ``request``."""
        need = self.required_free_bytes
        return {
            "required_free_bytes": need(request) if callable(need) else need,
            "model": self.model,
            "prefix_key": None if self.prefix_key is None else self.prefix_key(request),
            "classifier": self.classifier,
            "policy": self.policy,
            "observe": self.observe,
        }


def _retarget(request: httpx.Request, base: str) -> httpx.Request:
    url = httpx.URL(base)
    target = request.url.copy_with(scheme=url.scheme, host=url.host, port=url.port)
    headers = request.headers.copy()
    headers["host"] = target.netloc.decode("ascii")
    return httpx.Request(
        request.method, target, headers=headers, content=request.content, extensions=request.extensions
    )


class RoutingTransport(httpx.BaseTransport):
    """Send each request to an instance :func:`~kernel_insight.sdk.route` picks, retried by cause.

    >>> health = HealthClient("http://collector:8470", token="ki_...")          # doctest: +SKIP
    >>> client = httpx.Client(transport=RoutingTransport(health, model="llama-70b",
    ...                                                  required_free_bytes=12 << 30))  # doctest: +SKIP
    >>> client.post("http://llm/v1/completions", json={...})                  # doctest: +SKIP

    ``required_free_bytes`` may be a function of the request (e.g. from its ``max_tokens``);
    ``prefix_key`` one giving the request's prefix key (:func:`~kernel_insight.sdk.prefix_key`
    of its prompt) for prefix-cache affinity, or None.
    """

    def __init__(
        self,
        health: Any,
        *,
        model: str | None = None,
        required_free_bytes: int | Callable[[httpx.Request], int] = 0,
        endpoint: Callable[[Instance], str] = endpoint_label,
        inner: httpx.BaseTransport | None = None,
        classifier: Classifier = classify,
        policy: RoutePolicy | None = None,
        observe: Callable[[Attempt], None] | None = None,
        prefix_key: Callable[[httpx.Request], str | None] | None = None,
    ) -> None:
        self.settings = _RouteSettings(
            health, model, required_free_bytes, endpoint, classifier, policy, observe, prefix_key
        )
        self.inner = inner if inner is not None else httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()

        def send(inst: Instance) -> httpx.Response:
            response = self.inner.handle_request(_retarget(request, self.settings.endpoint(inst)))
            if not 200 <= response.status_code < 300:
                response.read()
            return response

        return route(self.settings.health, send, **self.settings.options(request))

    def close(self) -> None:
        self.inner.close()


class AsyncRoutingTransport(httpx.AsyncBaseTransport):
    """:class:`RoutingTransport` for ``httpx.AsyncClient`` over an :class:`~kernel_insight.sdk.AsyncHealthClient`."""

    def __init__(
        self,
        health: Any,
        *,
        model: str | None = None,
        required_free_bytes: int | Callable[[httpx.Request], int] = 0,
        endpoint: Callable[[Instance], str] = endpoint_label,
        inner: httpx.AsyncBaseTransport | None = None,
        classifier: Classifier = classify,
        policy: RoutePolicy | None = None,
        observe: Callable[[Attempt], None] | None = None,
        prefix_key: Callable[[httpx.Request], str | None] | None = None,
    ) -> None:
        self.settings = _RouteSettings(
            health, model, required_free_bytes, endpoint, classifier, policy, observe, prefix_key
        )
        self.inner = inner if inner is not None else httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()

        async def send(inst: Instance) -> httpx.Response:
            response = await self.inner.handle_async_request(_retarget(request, self.settings.endpoint(inst)))
            if not 200 <= response.status_code < 300:
                await response.aread()
            return response

        return await aroute(self.settings.health, send, **self.settings.options(request))

    async def aclose(self) -> None:
        await self.inner.aclose()
