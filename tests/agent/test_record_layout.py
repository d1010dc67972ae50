"""The record layout, checked against the compiler: ki_ring.h's structs as ``offsetof``/``sizeof`` see them.

The payload structs and their fields are read from the header itself, so a field added there
without its Python counterpart fails here. Python defines the layout in records.py
(``RECORD_DTYPE``, ``PAYLOAD_DTYPES``, the ``*_PAYLOAD`` struct formats) and the wire decoder
views payloads through its own dtypes (unsigned words it varint-codes): all are compared.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from kernel_insight.agent import records
from kernel_insight.agent.records import PAYLOAD_DTYPES, RECORD_DTYPE, RecordType
from kernel_insight.collector import derive, wire

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "agent" / "include" / "ki_ring.h"

#: ki_rec's union member -> the record type whose payload it is.
MEMBERS = {
    "kernel": RecordType.KERNEL,
    "launch": RecordType.LAUNCH,
    "memop": RecordType.MEMOP,
    "collective": RecordType.COLLECTIVE,
    "sync": RecordType.SYNC,
    "sample": RecordType.GPU_SAMPLE,
    "fingerprint": RecordType.FINGERPRINT,
    "error": RecordType.ERROR,
    "string": RecordType.STRING,
}
#: ki_record's fields (ki_rec's header flattened) -> RECORD_DTYPE's names.
RECORD_FIELDS = {
    "pos": "pos",
    "producer": "producer",
    "check": "check",
    "rec.type": "type",
    "rec.flags": "flags",
    "rec.device": "device",
    "rec.id": "id",
    "rec.ts_ns": "ts_ns",
    "rec.u": "payload",
}


@dataclass(frozen=True)
class CField:
    name: str
    offset: int
    size: int
    kind: str  # numpy kind: u, i, f, S (char), V (a union or struct)
    count: int  # array length, 1 for a scalar


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)


def _payload_structs() -> dict[str, tuple[str, list[tuple[str, int]]]]:
    """union member -> (struct name, [(field, array length)]) as written in ki_ring.h."""
    text = _strip_comments(HEADER.read_text())
    union = re.search(r"struct ki_rec \{.*?union \{(.*?)\} u;", text, re.DOTALL)
    assert union is not None, "ki_rec's union not found in ki_ring.h"
    out: dict[str, tuple[str, list[tuple[str, int]]]] = {}
    for struct_name, member in re.findall(r"struct (ki_\w+) (\w+);", union.group(1)):
        body = re.search(rf"struct {struct_name} \{{([^{{}}]*)\}};", text)
        assert body is not None, struct_name
        fields = []
        for decl in filter(None, (d.strip() for d in body.group(1).split(";"))):
            m = re.fullmatch(r"[\w ]+?\s+(\w+)(?:\[(\d+)\])?", decl)
            assert m is not None, f"cannot read {decl!r} in struct {struct_name}"
            fields.append((m.group(1), int(m.group(2) or 1)))
        out[member] = (struct_name, fields)
    return out


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, list[CField]]:
    """struct (or "record") -> its fields as the compiler lays them out."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc is not None, "no C compiler: the agent itself needs one"
    lines = []
    structs = _payload_structs()
    for struct_name, fields in structs.values():
        lines.append(f'    printf("{struct_name} - %zu 0 V 1\\n", sizeof(struct {struct_name}));')
        for name, count in fields:
            elem = f"((struct {struct_name} *)0)->{name}" + ("[0]" if count > 1 else "")
            lines.append(
                f'    printf("{struct_name} {name} %zu %zu %c {count}\\n", offsetof(struct {struct_name}, {name}), '
                f"sizeof(((struct {struct_name} *)0)->{name}), KIND({elem}));"
            )
    lines.append('    printf("ki_record - %zu 0 V 1\\n", sizeof(struct ki_record));')
    for name in RECORD_FIELDS:
        kind = "'V'" if name == "rec.u" else f"KIND(((struct ki_record *)0)->{name})"
        lines.append(
            f'    printf("ki_record {name} %zu %zu %c 1\\n", offsetof(struct ki_record, {name}), '
            f"sizeof(((struct ki_record *)0)->{name}), {kind});"
        )
    program = "\n".join(
        [
            '#include "ki_ring.h"',  # first: it sets the feature macros it needs
            "#include <stddef.h>",
            "#include <stdint.h>",
            "#include <stdio.h>",
            "#define KIND(x) _Generic((x), double: 'f', float: 'f', char: 'S', int8_t: 'i', int16_t: 'i', \\",
            "    int32_t: 'i', int64_t: 'i', default: 'u')",
            "int main(void) {",
            *lines,
            "    return 0;",
            "}",
        ]
    )
    out = tmp_path_factory.mktemp("layout")
    (out / "layout.c").write_text(program + "\n")
    subprocess.run(
        [
            cc,
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-I",
            str(HEADER.parent),
            "-o",
            str(out / "layout"),
            str(out / "layout.c"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    run = subprocess.run([str(out / "layout")], check=True, capture_output=True, text=True, timeout=10)
    table: dict[str, list[CField]] = {}
    for line in run.stdout.splitlines():
        struct_name, name, offset, size, kind, count = line.split()
        table.setdefault(struct_name, []).append(CField(name, int(offset), int(size), kind, int(count)))
    return table


def _fields(dt: np.dtype) -> list[tuple[str, int, int, str, int]]:
    """(name, offset, size, kind, count) of each field of ``dt``, in offset order."""
    out = []
    for name in dt.names or ():
        fdt, offset = dt.fields[name][:2]
        base, count = (fdt.base, int(np.prod(fdt.shape))) if fdt.shape else (fdt, 1)
        if base.kind == "S":
            count = fdt.itemsize  # char text[32] is numpy's S32: one string of 32 chars
        out.append((name, offset, fdt.itemsize, base.kind, count))
    return sorted(out, key=lambda f: f[1])


def _payload(compiled: dict[str, list[CField]], member: str) -> tuple[CField, list[CField]]:
    struct_name = _payload_structs()[member][0]
    size, *fields = compiled[struct_name]
    return size, fields


def test_every_payload_struct_is_known_and_32_bytes(compiled):
    assert set(_payload_structs()) == set(MEMBERS), "a payload struct was added to ki_rec: map it in MEMBERS"
    assert set(PAYLOAD_DTYPES) == set(MEMBERS.values())
    for member in MEMBERS:
        size, fields = _payload(compiled, member)
        assert size.offset == 32, member  # sizeof, printed in the offset column
        # The fields tile the struct: no padding the Python side would not know of.
        assert sum(f.size for f in fields) == 32, member


@pytest.mark.parametrize("member", sorted(MEMBERS))
def test_payload_dtype_matches_the_compiler_field_for_field(compiled, member):
    _, fields = _payload(compiled, member)
    want = [(f.name, f.offset, f.size, f.kind, f.count) for f in fields]
    assert _fields(PAYLOAD_DTYPES[MEMBERS[member]]) == want


def test_record_dtype_matches_struct_ki_record(compiled):
    size, *fields = compiled["ki_record"]
    assert size.offset == RECORD_DTYPE.itemsize == 64
    got = {name: (offset, fsize) for name, offset, fsize, _, _ in _fields(RECORD_DTYPE)}
    want = {RECORD_FIELDS[f.name]: (f.offset, f.size) for f in fields}
    assert got == want
    kinds = {name: kind for name, _, _, kind, _ in _fields(RECORD_DTYPE)}
    for f in fields:
        if f.kind != "V":
            assert kinds[RECORD_FIELDS[f.name]] == f.kind, f.name


def test_record_header_struct_format_matches(compiled):
    _, *fields = compiled["ki_record"]
    header = [f for f in fields if f.name.startswith("rec.") and f.name != "rec.u"]
    base = header[0].offset
    assert records.REC_HEAD.size == sum(f.size for f in header) == 16
    values = tuple(range(1, len(header) + 1))
    raw = records.REC_HEAD.pack(*values)
    for f, v in zip(header, values, strict=True):
        assert int.from_bytes(raw[f.offset - base : f.offset - base + f.size], "little") == v, f.name


STRUCT_FORMATS = {
    RecordType.KERNEL: records.KERNEL_PAYLOAD,
    RecordType.LAUNCH: records.LAUNCH_PAYLOAD,
    RecordType.MEMOP: records.MEMOP_PAYLOAD,
    RecordType.COLLECTIVE: records.COLLECTIVE_PAYLOAD,
    RecordType.SYNC: records.SYNC_PAYLOAD,
    RecordType.GPU_SAMPLE: records.SAMPLE_PAYLOAD,
    RecordType.FINGERPRINT: records.FINGERPRINT_PAYLOAD,
    RecordType.ERROR: records.ERROR_PAYLOAD,
}


@pytest.mark.parametrize("rtype", sorted(STRUCT_FORMATS), ids=lambda t: RecordType(t).name)
def test_struct_formats_read_what_the_dtype_wrote(rtype):
    """Distinct values in every named field, written through the dtype, read back by the struct format."""
    dt = PAYLOAD_DTYPES[rtype]
    arr = np.zeros(1, dtype=dt)
    expected = []
    n = 1
    for name, *_ in _fields(dt):
        if name == "reserved":
            continue
        shape = dt.fields[name][0].shape
        vals = np.arange(n, n + (int(np.prod(shape)) if shape else 1))
        arr[name] = vals.reshape(shape) if shape else vals[0]
        expected.extend(vals.tolist())
        n += len(vals)
    got = STRUCT_FORMATS[rtype].unpack(arr.tobytes())
    assert STRUCT_FORMATS[rtype].size == 32
    assert [float(v) for v in got] == [float(v) for v in expected]


@pytest.mark.parametrize("member", sorted(MEMBERS))
def test_wire_decoder_payload_views_line_up_with_the_compiler(compiled, member):
    """The wire codec's unsigned views: each field starts and ends on C field (or array element)
    boundaries, and each named one covers exactly one C field or element."""
    rtype = MEMBERS[member]
    if rtype not in wire._PAYLOAD_DTYPE:
        assert rtype == RecordType.STRING  # strings travel in the batch's string table, not as payloads
        return
    _, fields = _payload(compiled, member)
    elements = [
        (f.offset + i * (f.size // f.count), f.size // f.count) for f in fields for i in range(f.count)
    ]
    whole = {(f.offset, f.size) for f in fields}
    starts = {o for o, _ in elements}
    ends = {o + s for o, s in elements}
    for name, offset, size, _, _ in _fields(wire._PAYLOAD_DTYPE[rtype]):
        assert offset in starts, (member, name)
        assert offset + size in ends, (member, name)
        if not name.startswith("_"):
            assert (offset, size) in whole or (offset, size) in elements, (member, name)
    assert wire._PAYLOAD_DTYPE[rtype].itemsize == 32


def test_derive_reads_payloads_through_the_one_table():
    assert derive._KERNEL_DTYPE is PAYLOAD_DTYPES[RecordType.KERNEL]
    assert derive._SAMPLE_DTYPE is PAYLOAD_DTYPES[RecordType.GPU_SAMPLE]
    assert derive._ERROR_DTYPE is PAYLOAD_DTYPES[RecordType.ERROR]
