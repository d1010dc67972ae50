"""The memory a request needs (KV cache + activations) from model metadata, the metadata cache, and
selection on the result."""

from __future__ import annotations

import json
import random

import httpx
import pytest
from sdk_helpers import FakeServer, GiB, instance

from kernel_insight.sdk import (
    HealthClient,
    ModelCatalog,
    ModelMetadataError,
    ModelSpec,
    RoutingTransport,
    request_memory,
)

#: Llama-2-70B's shape (grouped-query attention: 8 KV heads for 64 attention heads).
LLAMA_70B = {"name": "llama-70b", "parameters": 70_000_000_000, "layers": 80, "hidden_size": 8192,
             "attention_heads": 64, "kv_heads": 8, "dtype": "bfloat16"}  # fmt: skip


def test_kv_cache_and_activations_follow_the_model_shape():
    spec = ModelSpec.from_json(LLAMA_70B)
    assert spec.head_dim == 128
    # 2 (K, V) x 80 layers x 8 heads x 128 x 2 bytes = 320 KiB per token.
    assert spec.kv_cache_bytes(1) == 327_680
    assert spec.kv_cache_bytes(4096, batch_size=2) == 327_680 * 4096 * 2
    assert spec.activation_bytes(1000) == 4 * 8192 * 2 * 1000
    need = spec.required_free_bytes(max_tokens=3096, batch_size=2, prompt_tokens=1000)
    assert need == 327_680 * 4096 * 2 + 4 * 8192 * 2 * 1000 * 2
    # Without grouped-query attention the cache is 8x larger.
    mha = ModelSpec.from_json({**LLAMA_70B, "kv_heads": 64})
    assert mha.kv_cache_bytes(100) == 8 * spec.kv_cache_bytes(100)
    with pytest.raises(ValueError, match="batch_size"):
        spec.required_free_bytes(10, batch_size=0)


def test_hugging_face_configs_are_understood():
    hf = {"_name_or_path": "meta-llama/Llama-2-70b-hf", "num_hidden_layers": 80, "hidden_size": 8192,
          "num_attention_heads": 64, "num_key_value_heads": 8, "torch_dtype": "float16"}  # fmt: skip
    spec = ModelSpec.from_json(hf)
    assert (spec.name, spec.layers, spec.kv_heads, spec.dtype_bytes) == (
        "meta-llama/Llama-2-70b-hf",
        80,
        8,
        2,
    )
    with pytest.raises(ValueError, match="lacks layers"):
        ModelSpec.from_json({"hidden_size": 1, "num_attention_heads": 1})
    with pytest.raises(ValueError, match="unknown dtype"):
        ModelSpec.from_json({**LLAMA_70B, "dtype": "float13"})


class MetadataServer:
    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.down = False
        self.body = LLAMA_70B

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.down:
            raise httpx.ConnectError("refused")
        etag = '"v1"' if self.body is LLAMA_70B else '"v2"'
        if request.headers.get("if-none-match") == etag:
            return httpx.Response(304, headers={"ETag": etag})
        return httpx.Response(200, json=self.body, headers={"ETag": etag})


def test_metadata_is_cached_on_disk_and_revalidated_with_its_etag(tmp_path, clock):
    server = MetadataServer()
    url = "http://models.test/llama-70b.json"

    def catalog():
        return ModelCatalog(
            tmp_path / "cache",
            ttl=60,
            client=httpx.Client(transport=httpx.MockTransport(server)),
            clock=clock,
        )

    first = catalog()
    assert first.get(url).layers == 80
    assert first.get(url).layers == 80  # within ttl: no request
    assert len(server.requests) == 1
    assert list((tmp_path / "cache").glob("*.json"))
    # A new process (fresh catalog): revalidates with the cached ETag, 304, no body needed.
    second = catalog()
    assert second.get(url).kv_heads == 8
    assert server.requests[-1].headers["if-none-match"] == '"v1"'
    # The server changes the model: the new body replaces the cache.
    server.body = {**LLAMA_70B, "kv_heads": 16}
    clock.t += 61
    assert second.get(url).kv_heads == 16
    # Unreachable: the cached copy serves.
    server.down = True
    assert catalog().get(url).kv_heads == 16
    with pytest.raises(ModelMetadataError, match="cannot fetch"):
        catalog().get("http://models.test/other.json")
    path = tmp_path / "m.json"
    path.write_text(json.dumps(LLAMA_70B))
    assert catalog().get(str(path)).parameters == 70_000_000_000
    with pytest.raises(ModelMetadataError):
        catalog().get(str(tmp_path / "missing.json"))


def test_selection_on_the_memory_a_request_needs(clock):
    spec = ModelSpec.from_json(LLAMA_70B)
    facts = [instance("small", 4), instance("big", 40)]
    for f in facts:
        f.labels = {**f.labels, "endpoint": f"http://{f.id}.test"}
    health = HealthClient("http://ki", "t", transport=httpx.MockTransport(FakeServer(facts)), clock=clock,
                          random=random.Random(2).random)  # fmt: skip
    short = spec.required_free_bytes(max_tokens=256)
    long = spec.required_free_bytes(max_tokens=32_000, batch_size=2)
    assert short < 4 * GiB < long < 40 * GiB
    assert {health.select_instance(short, "llama-70b").id for _ in range(200)} == {"small", "big"}
    assert {health.select_instance(long, "llama-70b").id for _ in range(50)} == {"big"}
    # Through the transport: the request body says how much it needs.
    hosts = []
    backend = httpx.MockTransport(lambda r: hosts.append(r.url.host) or httpx.Response(200))
    transport = RoutingTransport(
        health, model="llama-70b", required_free_bytes=request_memory(spec), inner=backend
    )
    with httpx.Client(transport=transport) as client:
        for _ in range(20):
            client.post("http://llm/v1/completions", json={"prompt": "hi", "max_tokens": 32_000, "n": 2})
    assert set(hosts) == {"big.test"}
