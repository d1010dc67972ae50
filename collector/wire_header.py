"""agent/include/ki_wire.h, generated from collector/wire.py: the wire's constants (magic, versions,
section tags, sizes, the names-unknown status) and the column tables the agent encodes records
with, so the encoder (agent/src/encode.c) and the decoder (collector/wire.py) cannot disagree;
and the instance-label rules of collector/keys.py, which the agent's ``labels`` setting obeys.

The column offsets come from the one record layout (agent/records.py's ``RECORD_DTYPE`` and
``PAYLOAD_DTYPES``, which tests/agent/test_record_layout.py checks against the compiler's
``offsetof``); the columns, their order, widths and encodings from wire.py's tables.

    python -m kernel_insight.collector.wire_header           # lists the file if it is stale
    python -m kernel_insight.collector.wire_header --write   # rewrites it
"""

from __future__ import annotations

import sys
from pathlib import Path

from kernel_insight.agent import codegen
from kernel_insight.agent.records import RECORD_DTYPE, RecordType
from kernel_insight.collector import keys, wire

__all__ = ["ENCODINGS", "HEADER", "c_header", "generated_files", "main"]

#: Where the header goes.
HEADER = Path("agent/include/ki_wire.h")
#: The column encodings wire.py names, in the C enum's order (its values never reach the wire).
ENCODINGS = ("delta", "uv", "sv", "rel", "u8", "f64", "pdelta")

#: wire.py's constant -> the C macro, and the C suffix of its value.
_CONSTANTS: tuple[tuple[str, str, str], ...] = (
    ("WIRE_VERSION", "KI_WIRE_VERSION", "u"),
    ("HEADER_SIZE", "KI_HEADER_BYTES", "u"),
    ("TAG_SIZE", "KI_TAG_BYTES", "u"),
    ("KEY_SIZE", "KI_KEY_BYTES", "u"),
    ("AEAD_CHACHA20_POLY1305", "KI_AEAD_CHACHA20_POLY1305", "u"),
    ("COMPRESSION_NONE", "KI_COMPRESSION_NONE", "u"),
    ("COMPRESSION_ZSTD", "KI_COMPRESSION_ZSTD", "u"),
    ("BODY_VERSION", "KI_BODY_VERSION", "u"),
    ("BODY_VERSION_HISTOGRAMS", "KI_BODY_VERSION_HISTOGRAMS", "u"),
    ("BODY_VERSION_PDELTA", "KI_BODY_VERSION_PDELTA", "u"),
    ("BODY_VERSION_INCREMENTS", "KI_BODY_VERSION_INCREMENTS", "u"),
    ("BODY_VERSION_NAMES_ONCE", "KI_BODY_VERSION_NAMES_ONCE", "u"),
    ("SECTION_COUNTERS", "KI_SECTION_COUNTERS", "u"),
    ("SECTION_STRINGS", "KI_SECTION_STRINGS", "u"),
    ("SECTION_CAPTURES", "KI_SECTION_CAPTURES", "u"),
    ("SECTION_HISTOGRAMS", "KI_SECTION_HISTOGRAMS", "u"),
    ("SECTION_LABELS", "KI_SECTION_LABELS", "u"),
    ("SECTION_NAMES_USED", "KI_SECTION_NAMES_USED", "u"),
    ("SECTION_RECORDS", "KI_SECTION_RECORDS", "u"),
    ("STATUS_NAMES_UNKNOWN", "KI_STATUS_NAMES_UNKNOWN", ""),
)


def _value(name: str, suffix: str) -> str:
    v = getattr(wire, name)
    return f"0x{v:02x}u" if name.startswith("SECTION_") else f"{v}{suffix}"


def _col(offset: int, width: int, enc: str) -> str:
    return f"{{{offset}, {width}, KI_ENC_{enc.upper()}}}"


def _payload_offset(rtype: RecordType, field: str) -> int:
    base = RECORD_DTYPE.fields["payload"][1]  # type: ignore[index]
    return int(base + wire._PAYLOAD_DTYPE[rtype].fields[field][1])  # type: ignore[index]


def c_header() -> str:
    """The text of agent/include/ki_wire.h."""
    common = [_col(RECORD_DTYPE.fields[n][1], w, e) for n, e, w in wire._COMMON]  # type: ignore[index]
    payload = []
    for t in wire.SHIPPED_TYPES:
        rt = RecordType(t)
        cols = ", ".join(_col(_payload_offset(rt, n), w, e) for n, e, w in wire._PAYLOAD[t])
        payload.append(f"        [KI_REC_{rt.name}] = {{{cols}}}, \\")
    (corr,) = [(n, e, w) for n, e, w in wire._KERNEL_V3 if e == "pdelta"]
    kernel_cols = [c[0] for c in wire._PAYLOAD[RecordType.KERNEL]]
    counts = ", ".join(str(len(wire._PAYLOAD.get(t, ()))) for t in range(max(wire.SHIPPED_TYPES) + 1))
    magic = wire.MAGIC.decode("ascii")
    lines = [
        "/*",
        " * ki_wire.h - the batch wire format's constants and column tables (docs/wire.md).",
        " *",
        " * Generated from collector/wire.py and agent/records.py",
        " * (python -m kernel_insight.collector.wire_header --write): edit those.",
        " */",
        "#ifndef KI_WIRE_H",
        "#define KI_WIRE_H",
        "",
        "#include <stdint.h>",
        "",
        f'#define KI_WIRE_MAGIC "{magic}"',
        f"#define KI_WIRE_MAGIC_BYTES {len(wire.MAGIC)}u",
        *(f"#define {c} {_value(py, suffix)}" for py, c, suffix in _CONSTANTS),
        "",
        '/* How a column\'s values are written (docs/wire.md, "Columns"). */',
        "enum ki_col_enc { " + ", ".join(f"KI_ENC_{e.upper()}" for e in ENCODINGS) + " };",
        "",
        "/* One column: where the value sits in struct ki_record, its width in bytes, its encoding. */",
        "struct ki_wire_col {",
        "    uint8_t off;",
        "    uint8_t width;",
        "    uint8_t enc; /* enum ki_col_enc */",
        "};",
        "",
        f"#define KI_WIRE_SHIPPED_TYPES {len(wire.SHIPPED_TYPES)} /* record types 1 .. this one are shipped */",
        f"#define KI_WIRE_COMMON_COLS {len(wire._COMMON)}",
        f"#define KI_WIRE_MAX_PAYLOAD_COLS {max(len(c) for c in wire._PAYLOAD.values())}",
        "/* Every record's first columns, in wire order. */",
        "#define KI_WIRE_COMMON_COLUMNS {" + ", ".join(common) + "}",
        "/* Each shipped type's payload columns, in wire order, indexed by record type (ki_ring.h). */",
        "#define KI_WIRE_PAYLOAD_COLUMNS \\",
        "    { \\",
        *payload,
        "    }",
        "/* How many payload columns each record type has (index 0 unused). */",
        "#define KI_WIRE_PAYLOAD_NCOLS {" + counts + "}",
        f"/* Body version {wire.BODY_VERSION_PDELTA} and later: KERNEL's {corr[0]} column (payload column",
        f" * {kernel_cols.index(corr[0])}) as the delta of ({corr[0]} - pos). */",
        f"#define KI_WIRE_KERNEL_PDELTA_COL {kernel_cols.index(corr[0])}",
        "#define KI_WIRE_KERNEL_PDELTA_COLUMN "
        + _col(_payload_offset(RecordType.KERNEL, corr[0]), corr[2], corr[1]),
        "",
        "/* Instance labels (the LABELS section): the collector's enrolment rules (collector/keys.py). */",
        f"#define KI_LABELS_MAX {keys.MAX_INSTANCE_LABELS} /* labels per instance */",
        f"#define KI_LABEL_VALUE_MAX {keys.MAX_LABEL_VALUE} /* bytes of one value */",
        "/* Names the collector sets itself (besides every __-prefixed one). */",
        "#define KI_RESERVED_LABELS {"
        + ", ".join(f'"{n}"' for n in sorted(keys.RESERVED_LABELS) if not n.startswith("__"))
        + "}",
        "",
        "#endif /* KI_WIRE_H */",
        "",
    ]
    return "\n".join(lines)


def generated_files(root: Path = codegen.REPO) -> dict[Path, str]:
    """The generated file (relative path) with the text it must hold."""
    del root  # nothing read from the tree: the header is wire.py's and records.py's alone
    return {HEADER: c_header()}


def main(argv: list[str] | None = None) -> int:
    return codegen.main(
        "python -m kernel_insight.collector.wire_header", __doc__.split("\n")[0], generated_files, argv
    )


if __name__ == "__main__":
    sys.exit(main())
