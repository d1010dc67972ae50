"""The agent's counters have one definition (agent/counters.py): the C header the agent counts in
and the docs' counter tables are generated from it and must be current, and the collector stores
every counter under the metric the table gives it."""

from __future__ import annotations

from pathlib import Path

from kernel_insight.agent.counters import SPECS, Counter, generated_files
from kernel_insight.collector import wire
from kernel_insight.collector.derive import AGENT_COUNTERS, agent_metric_name

ROOT = Path(__file__).resolve().parents[2]


def test_generated_files_are_current():
    for rel, text in generated_files(ROOT).items():
        assert (ROOT / rel).read_text() == text, (
            f"{rel} is stale: run python -m kernel_insight.agent.counters --write"
        )


def test_every_counter_has_one_spec_and_a_distinct_metric():
    assert set(SPECS) == set(Counter)
    metrics = [s.metric for s in SPECS.values()]
    assert len(set(metrics)) == len(metrics)
    assert [c.value for c in Counter] == list(range(1, len(Counter) + 1)), "ids are dense from 1"


def test_the_collector_reads_the_same_table():
    assert wire.Counter is Counter
    for c, spec in SPECS.items():
        assert AGENT_COUNTERS[c.name.lower()] == (spec.metric, spec.kind, spec.scale)
        assert agent_metric_name(c.name.lower())[0] == spec.metric


def test_the_c_enum_says_what_the_python_one_says():
    header = (ROOT / "agent" / "include" / "ki_counters.h").read_text()
    for c in Counter:
        assert f"KI_CTR_{c.name} = {c.value}," in header
    assert f"KI_CTR_MAX = {max(Counter)}" in header
