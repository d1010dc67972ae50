"""The agent's self-metrics (docs/wire.md, COUNTERS): the one definition of every counter.

The ids are wire ids: never renumber one, only add. ``Counter`` and ``SPECS`` are the source;
generated from them, and checked current by tests/agent/test_counters_generated.py:

- ``agent/include/ki_counters.h``, the C enum the agent counts in;
- the counter tables of docs/wire.md (id, name, meaning) and docs/metrics.md (metric, type);
- the collector's metric names (``collector/derive.py``'s ``AGENT_COUNTERS`` reads ``SPECS``).

``python -m kernel_insight.agent.counters --write`` rewrites the generated files after a change.
"""

from __future__ import annotations

import enum
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from kernel_insight.agent import codegen

__all__ = ["ALWAYS_SENT_LAST", "SPECS", "Counter", "Spec", "generated_files", "main"]


class Counter(enum.IntEnum):
    """Agent self-metrics carried in every batch's COUNTERS section (docs/wire.md)."""

    RECORDS_READ = 1
    RECORDS_SHIPPED = 2
    GARBAGE_SKIPPED = 3
    RING_DROPPED = 4
    RING_TORN = 5
    RING_ABANDONED = 6
    RING_LOST = 7
    SPOOL_DROPPED_BATCHES = 8
    SPOOL_DROPPED_RECORDS = 9
    BATCHES_SEALED = 10
    BATCHES_SENT = 11
    BATCHES_RETRIED = 12
    BATCHES_FAILED = 13
    BYTES_RAW = 14
    BYTES_COMPRESSED = 15
    DRAIN_LAG_NS = 16
    RING_BACKLOG = 17
    NAMES_RESET = 18
    AUTH_FAILURES = 19
    SPOOL_BYTES = 20
    SPOOL_BATCHES = 21
    RSS_KB = 22
    NAMES_TRUNCATED = 23
    BATCHES_DEAD_LETTERED = 24
    SPOOL_WRITE_ERRORS = 25
    REQUESTS_SENT = 26
    REQUESTS_FAILED = 27
    KERNELS_AGGREGATED = 28
    SPANS_TAIL = 29
    SPANS_SAMPLED = 30
    SPANS_CAPTURED = 31
    HISTOGRAMS_SHIPPED = 32
    HISTOGRAM_KEYS = 33
    HISTOGRAM_REFUSED = 34
    HISTOGRAM_INCREMENTS = 35
    HISTOGRAM_EVICTED = 36
    BUSY_DRAINS = 37
    CUPTI_DROPPED = 38
    CUPTI_REFUSED = 39


#: Ids up to this one are in every batch; later ones only when not zero (an agent with histograms
#: off and a ring that keeps up sends exactly the set the first agents sent).
ALWAYS_SENT_LAST = Counter.REQUESTS_FAILED


@dataclass(frozen=True, slots=True)
class Spec:
    """What the collector stores a counter as, and what the docs say it means."""

    metric: str  #: the stored metric's name
    kind: str  #: "counter" (cumulative within an agent epoch) or "gauge"
    scale: float  #: stored value = counter value x scale (the metric's unit)
    meaning: str  #: docs/wire.md's description
    metric_note: str = ""  #: what docs/metrics.md adds after the counter's name
    c_comment: str = ""  #: the comment beside the C enum member


SPECS: dict[Counter, Spec] = {
    Counter.RECORDS_READ: Spec(
        "ki_agent_records_read_total",
        "counter",
        1.0,
        "records consumed from the ring (all types, garbage included)",
    ),
    Counter.RECORDS_SHIPPED: Spec(
        "ki_agent_records_shipped_total",
        "counter",
        1.0,
        "records sealed into batches (STRING chunks excluded)",
    ),
    Counter.GARBAGE_SKIPPED: Spec(
        "ki_agent_garbage_skipped_total",
        "counter",
        1.0,
        "records of an unknown type: skipped, never shipped",
    ),
    Counter.RING_DROPPED: Spec(
        "ki_agent_ring_dropped_total",
        "counter",
        1.0,
        "the ring header's `dropped` (producers found the ring full), since the ring was created",
    ),
    Counter.RING_TORN: Spec(
        "ki_agent_ring_torn_total",
        "counter",
        1.0,
        "the ring header's `torn`",
    ),
    Counter.RING_ABANDONED: Spec(
        "ki_agent_ring_abandoned_total",
        "counter",
        1.0,
        "the ring header's `abandoned`",
    ),
    Counter.RING_LOST: Spec(
        "ki_agent_ring_lost_total",
        "counter",
        1.0,
        "the ring header's `lost`",
    ),
    Counter.SPOOL_DROPPED_BATCHES: Spec(
        "ki_agent_spool_dropped_batches_total",
        "counter",
        1.0,
        "batches dropped because the spool was full",
    ),
    Counter.SPOOL_DROPPED_RECORDS: Spec(
        "ki_agent_spool_dropped_records_total",
        "counter",
        1.0,
        "records in those batches",
    ),
    Counter.BATCHES_SEALED: Spec(
        "ki_agent_batches_sealed_total",
        "counter",
        1.0,
        "batches sealed",
    ),
    Counter.BATCHES_SENT: Spec(
        "ki_agent_batches_sent_total",
        "counter",
        1.0,
        "batches the collector settled (2xx or 409)",
    ),
    Counter.BATCHES_RETRIED: Spec(
        "ki_agent_batches_retried_total",
        "counter",
        1.0,
        "attempts that failed and will be retried (network, 429, 5xx)",
    ),
    Counter.BATCHES_FAILED: Spec(
        "ki_agent_batches_failed_total",
        "counter",
        1.0,
        "batches the collector refused for good (4xx other than 401/403/409): dropped",
    ),
    Counter.BYTES_RAW: Spec(
        "ki_agent_bytes_raw_total",
        "counter",
        1.0,
        "body bytes before compression",
    ),
    Counter.BYTES_COMPRESSED: Spec(
        "ki_agent_bytes_compressed_total",
        "counter",
        1.0,
        "body bytes after compression",
    ),
    Counter.DRAIN_LAG_NS: Spec(
        "ki_agent_drain_lag_seconds",
        "gauge",
        1e-9,
        "gauge: age of the oldest record of this batch when it was sealed",
        metric_note='/ 1e9 (a division, not x 1e-9: whole ns give an exact 9-place decimal, docs/storage.md "Values as decimals")',
    ),
    Counter.RING_BACKLOG: Spec(
        "ki_agent_ring_backlog_records",
        "gauge",
        1.0,
        "gauge: records left in the ring after the last drain",
    ),
    Counter.NAMES_RESET: Spec(
        "ki_agent_names_reset_total",
        "counter",
        1.0,
        "times the agent's name table filled up and was cleared",
    ),
    Counter.AUTH_FAILURES: Spec(
        "ki_agent_auth_failures_total",
        "counter",
        1.0,
        "401/403 answers",
    ),
    Counter.SPOOL_BYTES: Spec(
        "ki_agent_spool_bytes",
        "gauge",
        1.0,
        "gauge: bytes in the spool when this batch was sealed",
    ),
    Counter.SPOOL_BATCHES: Spec(
        "ki_agent_spool_batches",
        "gauge",
        1.0,
        "gauge: batches in the spool when this batch was sealed",
    ),
    Counter.RSS_KB: Spec(
        "ki_agent_resident_memory_bytes",
        "gauge",
        1024.0,
        "gauge: the agent's resident memory (VmRSS; the ring's pages included while the agent keeps them mapped, docs/agent.md \"Memory\")",
        metric_note="x 1024",
    ),
    Counter.NAMES_TRUNCATED: Spec(
        "ki_agent_names_truncated_total",
        "counter",
        1.0,
        "names cut to the agent's name length limit",
    ),
    Counter.BATCHES_DEAD_LETTERED: Spec(
        "ki_agent_batches_dead_lettered_total",
        "counter",
        1.0,
        "batches refused for good that were moved to the agent's dead-letter file (a subset of batches_failed)",
    ),
    Counter.SPOOL_WRITE_ERRORS: Spec(
        "ki_agent_spool_write_errors_total",
        "counter",
        1.0,
        "failed attempts to write a sealed batch to the spool (disk full, read-only, ...); the records stayed in the ring",
    ),
    Counter.REQUESTS_SENT: Spec(
        "ki_agent_requests_sent_total",
        "counter",
        1.0,
        "HTTP requests sent (batches_sent / requests_sent = batches per request)",
    ),
    Counter.REQUESTS_FAILED: Spec(
        "ki_agent_requests_failed_total",
        "counter",
        1.0,
        "requests that got no answer (connection refused or reset, timeout, unusable answer)",
    ),
    Counter.KERNELS_AGGREGATED: Spec(
        "ki_agent_kernels_aggregated_total",
        "counter",
        1.0,
        "records folded into histograms (kernels, NCCL operations, memcpys)",
        metric_note="(histogram agents, as the ones below it)",
        c_comment="records folded into histograms (kernels, NCCL ops, memcpys)",
    ),
    Counter.SPANS_TAIL: Spec(
        "ki_agent_spans_tail_total",
        "counter",
        1.0,
        "kernel spans kept because slower than their kernel's tail quantile",
        c_comment="kernel spans kept because slower than their kernel's tail quantile",
    ),
    Counter.SPANS_SAMPLED: Spec(
        "ki_agent_spans_sampled_total",
        "counter",
        1.0,
        "kernel spans kept by the uniform sample",
        c_comment="kernel spans kept by the uniform sample",
    ),
    Counter.SPANS_CAPTURED: Spec(
        "ki_agent_spans_captured_total",
        "counter",
        1.0,
        "kernel spans kept by a capture window, or because FAILED",
        c_comment="kernel spans kept by a capture window or because FAILED",
    ),
    Counter.HISTOGRAMS_SHIPPED: Spec(
        "ki_agent_histograms_shipped_total",
        "counter",
        1.0,
        "histogram samples sealed into HISTOGRAMS sections",
        c_comment="histogram samples sealed into HISTOGRAMS sections",
    ),
    Counter.HISTOGRAM_KEYS: Spec(
        "ki_agent_histogram_keys",
        "gauge",
        1.0,
        "gauge: histograms in the agent's table",
        c_comment="gauge: histograms in the agent's table",
    ),
    Counter.HISTOGRAM_REFUSED: Spec(
        "ki_agent_histogram_refused_total",
        "counter",
        1.0,
        "observations lost: table full (new key), bucket limit at schema -4, bucket pool spent",
        c_comment="observations refused: table full, bucket limit at schema -4, pool spent",
    ),
    Counter.HISTOGRAM_INCREMENTS: Spec(
        "ki_agent_histogram_increments_total",
        "counter",
        1.0,
        "of histograms_shipped, those sent as increments (body version 4)",
        metric_note="(of `histograms_shipped`, those sent as increments: wire body version 4)",
        c_comment="of histograms_shipped, increments (wire body version 4)",
    ),
    Counter.HISTOGRAM_EVICTED: Spec(
        "ki_agent_histogram_evicted_total",
        "counter",
        1.0,
        "histogram keys evicted after `histogram_idle_s` without a shipped change (docs/agent.md); a key seen again is a new series, its first export flagged 0x01",
        metric_note="(keys evicted after `histogram_idle_s` without a shipped change: docs/agent.md)",
        c_comment="histogram keys evicted after histogram_idle_s without a change",
    ),
    Counter.BUSY_DRAINS: Spec(
        "ki_agent_busy_drains_total",
        "counter",
        1.0,
        'drains before their tick: producers, at the rate they wrote since the last drain, would fill half the ring first (docs/agent.md, "The loop"); any agent, histograms or not',
        metric_note="(drains before their tick: producers would fill half the ring first; a rate that stays up says the GPU writes faster than the ring and `drain_interval_ms` were sized for: docs/agent.md)",
        c_comment="drains before their tick: producers would fill half the ring first",
    ),
    Counter.CUPTI_DROPPED: Spec(
        "ki_agent_cupti_dropped_records_total",
        "counter",
        1.0,
        "the ring header's `cupti_dropped`: activity records CUPTI dropped in the processes the CUPTI probe is in (`cuptiActivityGetNumDroppedRecords`; its buffer pool was empty, or CUPTI's queue was full), since the ring was created",
        metric_note="(activity records CUPTI dropped in the processes writing to the GPU's ring through the CUPTI probe: kernels, copies and syncs no span shows; docs/probes.md)",
        c_comment="the ring header's cupti_dropped: records CUPTI dropped (CUPTI probe)",
    ),
    Counter.CUPTI_REFUSED: Spec(
        "ki_agent_cupti_refused_records_total",
        "counter",
        1.0,
        "the ring header's `cupti_refused`: records the CUPTI probe could not write, the ring being full (those are in `ring_dropped` too) or its process having no ring for their device, since the ring was created",
        metric_note="(records the CUPTI probe could not write: the ring was full, or there was no ring for their GPU; docs/probes.md)",
        c_comment="the ring header's cupti_refused: records the CUPTI probe could not write",
    ),
}

_BEGIN = "<!-- generated by kernel_insight.agent.counters ({what}): edit agent/counters.py -->"
_END = "<!-- end of generated ({what}) -->"


def c_header() -> str:
    """agent/include/ki_counters.h."""
    lines = [
        "/*",
        " * ki_counters.h - the agent's self-metrics, shipped in every batch (docs/wire.md, COUNTERS).",
        " *",
        " * Generated from agent/counters.py (python -m kernel_insight.agent.counters --write): edit that.",
        " * The ids are wire ids: never renumber one, only add.",
        " */",
        "#ifndef KI_COUNTERS_H",
        "#define KI_COUNTERS_H",
        "",
        "#include <stdint.h>",
        "",
        "enum ki_counter {",
    ]
    for c in Counter:
        if c == ALWAYS_SENT_LAST + 1:
            lines.append(
                "    /* From here on sent only when not zero (an agent without histograms sends the v1 set). */"
            )
        comment = SPECS[c].c_comment
        lines.append(f"    KI_CTR_{c.name} = {c.value},{f' /* {comment} */' if comment else ''}")
    lines += [
        f"    KI_CTR_MAX = {max(Counter)}",
        "};",
        "",
        "/* Ids up to this one are in every batch; later ones only when not zero. */",
        f"#define KI_CTR_ALWAYS_SENT_LAST {ALWAYS_SENT_LAST.value}",
        "",
        "struct ki_counters {",
        "    uint64_t v[KI_CTR_MAX + 1]; /* indexed by enum ki_counter; v[0] unused */",
        "};",
        "",
        "#endif /* KI_COUNTERS_H */",
        "",
    ]
    return "\n".join(lines)


def _wire_table(counters: list[Counter]) -> str:
    rows = [f"| {c.value} | {c.name.lower()} | {SPECS[c].meaning} |" for c in counters]
    return "\n".join(["| id | name | meaning |", "|---|---|---|", *rows])


def _metrics_table() -> str:
    rows = []
    for c in Counter:
        s = SPECS[c]
        note = f" {s.metric_note}" if s.metric_note else ""
        rows.append(f"| `{s.metric}` | {s.kind} | `{c.name.lower()}`{note} |")
    return "\n".join(["| metric | type | from counter |", "|---|---|---|", *rows])


def _regions() -> dict[str, tuple[Path, str]]:
    always = [c for c in Counter if c <= ALWAYS_SENT_LAST]
    rest = [c for c in Counter if c > ALWAYS_SENT_LAST]
    return {
        "always sent": (Path("docs/wire.md"), _wire_table(always)),
        "sent when not zero": (Path("docs/wire.md"), _wire_table(rest)),
        "agent metrics": (Path("docs/metrics.md"), _metrics_table()),
    }


def _replace_region(text: str, what: str, body: str, path: Path) -> str:
    begin, end = _BEGIN.format(what=what), _END.format(what=what)
    pattern = re.compile(re.escape(begin) + r"\n.*?\n" + re.escape(end), re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"{path}: no generated region {what!r} ({begin} ... {end})")
    return pattern.sub(lambda _: f"{begin}\n{body}\n{end}", text, count=1)


def generated_files(root: Path = codegen.REPO) -> dict[Path, str]:
    """Every generated file (relative path) with the text it must hold, from the files under ``root``."""
    out: dict[Path, str] = {Path("agent/include/ki_counters.h"): c_header()}
    for what, (path, body) in _regions().items():
        text = out.get(path) or (root / path).read_text()
        out[path] = _replace_region(text, what, body, path)
    return out


def main(argv: list[str] | None = None) -> int:
    return codegen.main(
        "python -m kernel_insight.agent.counters", __doc__.split("\n")[0], generated_files, argv
    )


if __name__ == "__main__":
    sys.exit(main())
