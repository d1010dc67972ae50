"""The SDK's health, selection and routing examples of docs/api.md and docs/routing.md run as written, against a collector on loopback
(real uvicorn, real embedded store) and a stand-in inference server named by the instances'
``endpoint`` label. Only the collector URL and the token are substituted."""

from __future__ import annotations

import contextlib
import io
import time

import pytest
from docs_examples import sdk_examples
from fastapi import FastAPI
from loopback import running_server

from kernel_insight.api import TokenStore, create_api_app
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import InstanceInfo, SampleBuilder

GiB = 1 << 30


_examples = sdk_examples


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    llm = FastAPI()

    @llm.post("/v1/completions")
    async def complete(body: dict) -> dict:
        return {"text": "hello", "max_tokens": body.get("max_tokens")}

    now = int(time.time() * 1000)
    store = EmbeddedStore(tmp_path_factory.mktemp("docs-store"))
    tokens = TokenStore(tmp_path_factory.mktemp("docs-tokens") / "tokens.json")
    token = tokens.create("docs", ["read"]).token
    with running_server(llm) as llm_url:
        b = SampleBuilder()
        for inst, free in (("node-1", 60), ("node-2", 30)):
            for name, v in (("gpu_memory_free_bytes", free), ("gpu_memory_total_bytes", 80)):
                b.add({"__name__": name, "instance": inst, "gpu": "0"}, now - 1000, v * GiB)
        store.insert_samples(b.build())
        store.upsert_instances(
            [
                InstanceInfo(
                    id=i,
                    last_seen_ms=now - 1000,
                    labels={"model": "llama-70b", "rack": r, "endpoint": llm_url},
                )
                for i, r in (("node-1", "r1"), ("node-2", "r2"))
            ]
        )
        with running_server(create_api_app(store, tokens=tokens, interval_s=1.0)) as url:
            yield url, token
    store.close()


def test_the_docs_have_sdk_examples():
    assert [name for name, _ in _examples() if name.startswith("api.md")]


@pytest.mark.parametrize(("name", "code"), _examples(), ids=[n for n, _ in _examples()])
def test_sdk_example_runs(world, name, code):
    url, token = world
    assert "http://collector:8470" in code, f"{name}: the example must use the collector's port 8470"
    code = code.replace("http://collector:8470", url).replace("ki_...", token)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, name, "exec"), {"__name__": "__docs__"})
    assert "hello" in out.getvalue() or "node-" in out.getvalue(), out.getvalue()
