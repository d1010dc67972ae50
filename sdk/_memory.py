"""The free GPU memory a request needs, from the model's shape and the request's size.

The weights are already resident on an instance that serves the model (its free memory is
what is left beside them), so what a new request needs is what it adds:

* **KV cache**: ``2 (K and V) x layers x kv_heads x head_dim x dtype_bytes`` per token, for
  ``prompt_tokens + max_tokens`` tokens of each of ``batch_size`` sequences. With grouped-query
  attention ``kv_heads`` is smaller than the attention heads, and so is the cache.
* **Activations**: the transient buffers of one layer's forward pass over the prompt (prefill),
  the widest point of the request: about ``ACTIVATION_FACTOR (4) x hidden_size x dtype_bytes``
  per prompt token and sequence (the MLP's intermediate is ~4x the hidden size), at least one
  token's worth for decoding.

Model metadata comes from a JSON file or URL (:class:`ModelCatalog`), in this module's field
names or Hugging Face ``config.json``'s, cached on disk and revalidated with its ETag.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from kernel_insight.sdk._exceptions import KernelInsightError

__all__ = ["ACTIVATION_FACTOR", "ModelCatalog", "ModelMetadataError", "ModelSpec", "request_memory"]

ACTIVATION_FACTOR = 4
_DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float8": 1,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
}


def _first(d: Mapping[str, Any], *names: str) -> Any:
    for n in names:
        if d.get(n) is not None:
            return d[n]
    return None


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What the memory estimate needs to know about a model (``dtype`` of the KV cache and activations)."""

    name: str
    parameters: int
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    dtype: str = "bfloat16"

    @property
    def dtype_bytes(self) -> float:
        return _DTYPE_BYTES[self.dtype.lower()]

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.attention_heads

    @classmethod
    def from_json(cls, d: Mapping[str, Any], name: str = "") -> ModelSpec:
        """From ``{"parameters", "layers", "hidden_size", "attention_heads", "kv_heads", "dtype"}``
        or a Hugging Face config (``num_hidden_layers``, ``num_attention_heads``,
        ``num_key_value_heads``, ``torch_dtype``); ValueError names what is missing."""
        layers = _first(d, "layers", "num_hidden_layers", "n_layer")
        hidden = _first(d, "hidden_size", "n_embd", "d_model")
        heads = _first(d, "attention_heads", "num_attention_heads", "n_head")
        kv = _first(d, "kv_heads", "num_key_value_heads") or heads
        missing = [
            k for k, v in (("layers", layers), ("hidden_size", hidden), ("attention_heads", heads)) if not v
        ]
        if missing:
            raise ValueError(f"model metadata lacks {', '.join(missing)}")
        dtype = str(_first(d, "dtype", "torch_dtype") or "bfloat16")
        if dtype.lower() not in _DTYPE_BYTES:
            raise ValueError(f"unknown dtype {dtype!r}: one of {', '.join(sorted(_DTYPE_BYTES))}")
        return cls(
            name=str(_first(d, "name", "_name_or_path", "model_type") or name),
            parameters=int(_first(d, "parameters", "num_parameters") or 0),
            layers=int(layers),
            hidden_size=int(hidden),
            attention_heads=int(heads),
            kv_heads=int(kv),
            dtype=dtype,
        )

    def kv_cache_bytes(self, tokens: int, batch_size: int = 1) -> int:
        per_token = 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes
        return int(per_token * tokens * batch_size)

    def activation_bytes(self, prompt_tokens: int, batch_size: int = 1) -> int:
        return int(
            ACTIVATION_FACTOR * self.hidden_size * self.dtype_bytes * max(1, prompt_tokens) * batch_size
        )

    def required_free_bytes(self, max_tokens: int, batch_size: int = 1, prompt_tokens: int = 0) -> int:
        """KV cache for ``prompt_tokens + max_tokens`` tokens plus the prefill's activations, per batch."""
        if max_tokens < 0 or batch_size < 1 or prompt_tokens < 0:
            raise ValueError("need max_tokens >= 0, batch_size >= 1, prompt_tokens >= 0")
        return self.kv_cache_bytes(prompt_tokens + max_tokens, batch_size) + self.activation_bytes(
            prompt_tokens, batch_size
        )


def request_memory(
    spec: ModelSpec, default_max_tokens: int = 256, chars_per_token: float = 4.0
) -> Callable[[httpx.Request], int]:
    """For :class:`~kernel_insight.sdk.RoutingTransport`: the memory an OpenAI-style JSON request
    needs, from its ``max_tokens``, its ``n`` (or ``batch_size``) and its prompt's length
    (``chars_per_token`` characters a token)."""

    def need(request: httpx.Request) -> int:
        try:
            body = json.loads(request.content or b"{}")
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        prompt = body.get("prompt") or ""
        if not isinstance(prompt, str):
            prompt = json.dumps(prompt)
        messages = body.get("messages")
        if isinstance(messages, list):
            prompt += json.dumps(messages)
        return spec.required_free_bytes(
            max_tokens=int(body.get("max_tokens") or default_max_tokens),
            batch_size=int(body.get("n") or body.get("batch_size") or 1),
            prompt_tokens=int(len(prompt) / chars_per_token),
        )

    return need


class ModelMetadataError(KernelInsightError):
    """The model's metadata could not be read (and nothing was cached)."""


class ModelCatalog:
    """Model metadata from files or URLs, cached on disk and revalidated with the ETag.

    A URL is fetched once, stored in ``cache_dir`` with its ETag, and asked again (with
    ``If-None-Match``; a 304 costs no body) when ``ttl`` seconds have passed; while the
    server is unreachable the cached copy serves. A file is read when its mtime changes.
    """

    def __init__(
        self,
        cache_dir: Path | str,
        *,
        ttl: float = 3600.0,
        client: httpx.Client | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache_dir = Path(cache_dir)
        self.ttl = ttl
        self._client = client or httpx.Client(timeout=10.0)
        self._clock = clock
        self._memo: dict[str, tuple[float, ModelSpec]] = {}

    def _cache_path(self, url: str) -> Path:
        return self.cache_dir / (hashlib.sha256(url.encode()).hexdigest()[:32] + ".json")

    def get(self, source: str) -> ModelSpec:
        """The model at ``source`` (a URL or a file path)."""
        now = self._clock()
        memo = self._memo.get(source)
        if memo is not None and now - memo[0] < self.ttl:
            return memo[1]
        spec = self._fetch(source) if source.startswith(("http://", "https://")) else self._read(source)
        self._memo[source] = (now, spec)
        return spec

    @staticmethod
    def _read(path: str) -> ModelSpec:
        try:
            return ModelSpec.from_json(json.loads(Path(path).read_text()), name=Path(path).stem)
        except (OSError, ValueError) as exc:
            raise ModelMetadataError(f"cannot read model metadata {path}: {exc}") from exc

    def _fetch(self, url: str) -> ModelSpec:
        path = self._cache_path(url)
        cached: dict[str, Any] | None = None
        try:
            cached = json.loads(path.read_text())
        except (OSError, ValueError):
            cached = None
        headers = {"If-None-Match": cached["etag"]} if cached and cached.get("etag") else {}
        try:
            response = self._client.get(url, headers=headers)
        except httpx.HTTPError as exc:
            if cached is not None:
                return ModelSpec.from_json(cached["body"])
            raise ModelMetadataError(f"cannot fetch model metadata {url}: {exc}") from exc
        if response.status_code == 304 and cached is not None:
            return ModelSpec.from_json(cached["body"])
        if response.status_code != 200:
            if cached is not None and response.status_code >= 500:
                return ModelSpec.from_json(cached["body"])
            raise ModelMetadataError(f"model metadata {url}: HTTP {response.status_code}")
        try:
            body = response.json()
            spec = ModelSpec.from_json(body)
        except ValueError as exc:
            raise ModelMetadataError(f"model metadata {url}: {exc}") from exc
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=self.cache_dir, delete=False, suffix=".tmp") as tmp:
            json.dump({"url": url, "etag": response.headers.get("etag"), "body": body}, tmp)
        os.replace(tmp.name, path)
        return spec

    def close(self) -> None:
        self._client.close()
