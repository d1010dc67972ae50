"""agent/include/ki_wire.h is generated from collector/wire.py and agent/records.py (the wire's
constants and the column tables the agent encodes with) and must be current; every section tag
and body version the decoder knows is in it, and the C encoder has no copy of its own."""

from __future__ import annotations

import re
from pathlib import Path

from kernel_insight.agent import codegen
from kernel_insight.collector import wire, wire_header

ROOT = Path(__file__).resolve().parents[2]


def test_the_header_is_current():
    assert codegen.stale(wire_header.generated_files, ROOT) == [], (
        "agent/include/ki_wire.h is stale: run python -m kernel_insight.collector.wire_header --write"
    )


def test_every_section_tag_and_body_version_of_the_decoder_is_in_the_header():
    wanted = {n for n in vars(wire) if re.fullmatch(r"(SECTION_[A-Z_]+|BODY_VERSION(_[A-Z_]+)?)", n)}
    assert wanted, "wire.py names no section or body version"
    assert wanted <= {py for py, _c, _s in wire_header._CONSTANTS}


def test_every_encoding_the_decoder_reads_is_in_the_c_enum():
    used = {e for cols in (wire._COMMON, wire._KERNEL_V3, *wire._PAYLOAD.values()) for _n, e, _w in cols}
    assert used <= set(wire_header.ENCODINGS)


def test_the_agent_defines_no_wire_constant_or_column_table_of_its_own():
    """The names the header defines are defined nowhere else in the agent's C, and no C file
    writes the magic or a section tag as a literal."""
    header = (ROOT / wire_header.HEADER).read_text()
    names = set(re.findall(r"^#define (KI_\w+)", header, re.M))
    sources = [
        p
        for d in ("agent/src", "agent/include", "agent/probe", "agent/cupti", "tests/agent/c")
        for p in (ROOT / d).rglob("*.[ch]")
        if p.name != "ki_wire.h"
    ]
    assert sources
    for path in sources:
        text = path.read_text()
        for name in names:
            assert not re.search(rf"^\s*#define {name}\b", text, re.M), f"{path} defines {name} again"
        assert '"KIWB"' not in text, f"{path} spells the magic out"
        assert not re.search(r"\benum col_enc\b|\bstruct col\s*\{", text), f"{path} has its own column table"
