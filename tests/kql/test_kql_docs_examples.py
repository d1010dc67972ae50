"""Every example query in docs/kql.md runs against what ``make run`` produces and gives a sensible answer.

The data: the simulator (as ``ki run`` starts it, on a synthetic clock and 2 GPUs so that
per-GPU comparisons have peers) writes into real rings; the records are drained and derived
batch by batch as the collector does (``Deriver``, ``insert_batch``) into an embedded store.
The queries: every line of the plain code blocks, the strings of the Python block, and the
inline code that is an expression (not a bare name), wherever they select a metric; each
metric must be one docs/metrics.md lists, and each answer must be non-empty and finite.
"""

from __future__ import annotations

import ast
import contextlib
import math
import os
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from simulated_store import store_simulated

from kernel_insight.agent import Ring, RingError, RingReader, ring_name
from kernel_insight.agent.probe.simulate import SimConfig, Simulator
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.derive import Deriver
from kernel_insight.kql import Engine, KqlError, KqlParseError, Matrix, Scalar, Vector, parse
from kernel_insight.kql.ast import Expr, MatrixSelector, SubqueryExpr, VectorSelector, walk

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "kql.md").read_text()
METRICS_DOC = (ROOT / "docs" / "metrics.md").read_text()

S = 1_000_000_000
MINUTES = 8  # simulated; windows up to 1 h just hold less
BATCH_S = 20  # seconds of records per derived batch (the agent ships every 100 ms; fewer inserts here)


def _selectors(expr: Expr) -> list[VectorSelector]:
    return [node for node in walk(expr) if isinstance(node, VectorSelector)]


def _names(expr: Expr) -> list[str]:
    return [m.value for sel in _selectors(expr) for m in sel.all_matchers() if m.name == "__name__"]


def _is_example(text: str, inline: bool) -> bool:
    """A query over real-looking metrics: it parses, names metrics, and none is a placeholder (x, a, b)."""
    try:
        expr = parse(text)
    except KqlParseError:
        return False
    if inline and isinstance(expr, VectorSelector):
        return False  # a bare name in prose is a setting or a constant, not an example
    names = _names(expr)
    return bool(names) and all(len(name) > 2 and "_" in name for name in names)


def doc_examples() -> list[str]:
    found: list[str] = []
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", DOC, re.S):
        if lang == "python":
            try:
                tree = ast.parse(body)
            except SyntaxError:
                continue  # the storage protocol's sketch (fields one per line), not code to run
            found += [
                node.value
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and isinstance(node.value, str)
            ]
        elif not lang:
            # A query, then (after two spaces or " #") what it means.
            found += [re.split(r"\s{2,}|\s#", line.strip())[0] for line in body.splitlines()]
    examples = [q for q in found if _is_example(q, inline=False)]
    examples += [q for q in re.findall(r"`([^`\n]+)`", DOC) if _is_example(q, inline=True)]
    return list(dict.fromkeys(examples))


EXAMPLES = doc_examples()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Engine, int]]:
    """(engine over the simulated fleet's store, time of the last sample in ms)."""
    prefix = f"kqldocs-{os.getpid()}-{uuid.uuid4().hex[:8]}-"
    names = [ring_name(f"{prefix}{i}") for i in range(2)]
    # Kernels 25x longer than the defaults: ~25x fewer records to generate, same shape of data.
    config = SimConfig(gpus=2, seed=7, time_scale=25.0)
    start = (math.floor(time.time()) - (MINUTES + 1) * 60) * S
    try:
        rings = [Ring.create(n, capacity=1 << 18) for n in names]
        readers = [RingReader.open(n) for n in names]
        sim = Simulator(config, rings, start_ns=start)
        deriver = Deriver("sim-node-0")
        store = EmbeddedStore(tmp_path_factory.mktemp("kql-docs") / "store")
        store_simulated(sim, readers, deriver, store, MINUTES * 60, BATCH_S)
        assert [r.stats()["dropped"] for r in rings] == [0, 0]
        for x in [*rings, *readers]:
            x.close()
        try:
            yield Engine(store.storage()), (start + MINUTES * 60 * S) // 1_000_000
        finally:
            store.close()
    finally:
        for n in names:
            with contextlib.suppress(RingError):
                Ring.unlink(n)


def test_the_docs_hold_the_examples_this_test_runs() -> None:
    # A guard on the extraction itself: the headline alert, a selector line, an extension, an inline one.
    assert any(q.startswith("count_over_time(kernel_execution_time_seconds") for q in EXAMPLES)
    assert 'kernel_launches_total{gpu="0", kernel=~"flash_.*"}' in EXAMPLES
    assert any(q.startswith("time_weighted_avg_over_time(") for q in EXAMPLES)
    assert "gpu_temperature_celsius > 70" in EXAMPLES
    assert len(EXAMPLES) >= 15


@pytest.mark.parametrize("query", EXAMPLES)
def test_example_names_metrics_the_collector_writes(query: str) -> None:
    for name in _names(parse(query)):
        if name.startswith("^") or not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name):
            continue  # a regex over names ({__name__=~"gpu_.+_celsius"}) is checked by its answer
        assert f"`{name}`" in METRICS_DOC, f"{name} is not a metric docs/metrics.md lists"


@pytest.mark.parametrize("query", EXAMPLES)
def test_example_answers_on_the_simulated_fleet(fleet: tuple[Engine, int], query: str) -> None:
    engine, last = fleet
    value = engine.instant_query(query, last).value
    assert isinstance(value, Vector | Matrix | Scalar)
    if isinstance(value, Vector):
        assert len(value) > 0, f"{query} is empty on the simulated fleet"
        values = [s.value for s in value.samples]
        assert all(math.isfinite(v) for v in values), values
        for s in value.samples:
            labels = dict(s.labels)
            # Per-GPU series keep their instance and GPU (aggregations keep what they group by).
            assert labels.get("instance", "sim-node-0") == "sim-node-0", labels
            assert labels.get("simulated", "true") == "true", labels
    elif isinstance(value, Matrix):
        assert len(value) > 0
        assert all(len(s.timestamps) > 0 for s in value.series)
        assert all(np.isfinite(s.values).all() for s in value.series)
    # The same query as a dashboard asks it: over the last 5 minutes at 30 s (a range vector cannot be).
    if isinstance(value, Matrix) and isinstance(parse(query), MatrixSelector | SubqueryExpr):
        with pytest.raises(KqlError, match="range query"):
            engine.range_query(query, last - 300_000, last, 30_000)
        return
    matrix = engine.range_query(query, last - 300_000, last, 30_000).value
    assert isinstance(matrix, Matrix)
    assert len(matrix) > 0, f"{query} is empty over the last 5 minutes"


@pytest.mark.parametrize("query", ["sum(rate(x[5m])", "rate(kernel_launches_total)"])
def test_error_examples_print_as_documented(query: str) -> None:
    with pytest.raises(KqlParseError) as err:
        parse(query)
    assert str(err.value) in DOC
