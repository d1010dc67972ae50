"""Golden wire frames (tests/fixtures/wire/): their fixed input, key and decoded form (a helper, not a test file).

The frame was sealed by the C agent's encoder (tests/agent/c/test_encode_seal.c: agent id
00..0f, key 100..131, key id 3, epoch 77, seq 5) from ``records.bin``; ``frame.json`` is what
the decoder made of it. ``frame_v2.kib`` / ``frame_v2.json``: the same records as a version 2
body (kernels and NCCL operations aggregated into a HISTOGRAMS section, no kernel span kept);
``frame_v3.*``: version 3, the same with both kernel spans kept, their correlation column as the
delta of (correlation - pos); ``frame_v4.*``: version 4, as v2 after an earlier export of 4,096
more kernels of the first one, whose histogram goes as an increment. Regenerate only when the wire format changes on purpose, and say why
in the commit: ``.venv/bin/python tests/agent/golden_wire.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kernel_insight.agent.records import PAYLOAD_DTYPES, RECORD_DTYPE, RecordFlag, RecordType
from kernel_insight.collector import wire

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "wire"
KEY = bytes(range(100, 132))
T0 = 1_764_547_200_000_000_000  # 2025-12-01T00:00:00Z in ns

#: Per shipped type, two payloads (field -> value) as a producer writes them.
PAYLOADS: dict[RecordType, list[dict[str, Any]]] = {
    RecordType.KERNEL: [
        {"end_ns": T0 + 1_500, "stream": 7, "correlation": 1001, "pid": 4242},
        {"end_ns": T0 + 9_000_000, "stream": 0, "correlation": 1002, "pid": 4242},
    ],
    RecordType.LAUNCH: [
        {"pid": 4242, "tid": 4243, "grid": [128, 1, 1], "block": [256, 1, 1]},
        {"pid": 4242, "tid": 4244, "grid": [65535, 2, 3], "block": [32, 32, 1]},
    ],
    RecordType.MEMOP: [
        {"address": 0x7F00_0000_1000, "bytes": 1 << 30, "pid": 4242, "tid": 4243, "status": 0},
        {"address": 0x7F00_4000_0000, "bytes": 4096, "pid": 4242, "tid": 4243, "status": -2},
    ],
    RecordType.COLLECTIVE: [
        {"bytes": 1 << 26, "duration_ns": 350_000, "comm": 0xABCDEF, "rank": 0, "nranks": 8},
        {"bytes": 1 << 20, "duration_ns": 12_000, "comm": 0xABCDEF, "rank": 3, "nranks": 8},
    ],
    RecordType.SYNC: [
        {"duration_ns": 2_000_000, "handle": 0xBEEF, "pid": 4242, "tid": 4243},
        {"duration_ns": 15, "handle": 0, "pid": 4242, "tid": 4244},
    ],
    RecordType.GPU_SAMPLE: [{"value": 612.25, "aux": 0}, {"value": -1.5e-3, "aux": 2}],
    RecordType.FINGERPRINT: [{"value": 80 * (1 << 30)}, {"value": 132}],
    RecordType.ERROR: [
        {"code": 79, "aux": 0, "pid": 4242, "detail_id": 43},
        {"code": -1, "aux": 3, "pid": 0, "detail_id": 0},
    ],
}


def golden_records() -> npt.NDArray[np.void]:
    """Two records of every shipped type and one name in two STRING chunks, as the ring hands them out."""
    rows = []
    for rtype, payloads in PAYLOADS.items():
        for i, fields in enumerate(payloads):
            rec = np.zeros(1, dtype=RECORD_DTYPE)
            rec["type"], rec["producer"], rec["device"] = int(rtype), 2, i
            rec["id"] = 42 if rtype == RecordType.KERNEL else 3 + i
            rec["flags"] = int(RecordFlag.SIMULATED) if i else 0
            rec["ts_ns"] = T0 + 1_000 * (len(rows) + 1)
            payload = np.zeros(1, dtype=PAYLOAD_DTYPES[rtype])
            for name, value in fields.items():
                payload[name] = value
            rec["payload"] = payload.view("V32")
            rows.append(rec)
    for i, text in enumerate([b"k" * 32, b"ernel_gemm".ljust(32, b"\0")]):
        rec = np.zeros(1, dtype=RECORD_DTYPE)
        rec["type"], rec["producer"], rec["id"], rec["device"] = int(RecordType.STRING), 2, 42, i
        rec["flags"] = int(RecordFlag.STRING_LAST) if i else 0
        rec["payload"] = np.frombuffer(text, dtype="V32")
        rows.append(rec)
    out = np.concatenate(rows)
    out["pos"] = np.arange(100, 100 + len(out), dtype=np.uint64)
    return out


def _payload_json(rtype: int, payload: np.void) -> dict[str, Any]:
    view = np.frombuffer(payload.tobytes(), dtype=PAYLOAD_DTYPES[RecordType(rtype)])[0]
    out: dict[str, Any] = {}
    for name in view.dtype.names or ():
        if name == "reserved":
            continue
        value = view[name]
        out[name] = value.tolist() if isinstance(value, np.ndarray) else value.item()
    return out


def batch_json(batch: wire.DecodedBatch) -> dict[str, Any]:
    """A decoded batch as plain JSON: header, counters, names, every record field by name (and,
    for a version 2 or 3 body, its version and histograms)."""
    h = batch.header
    out = _batch_json(batch, h)
    if batch.body_version != 1:
        out["body_version"] = batch.body_version
        hist = batch.histograms
        # the increment fields exist from body version 4 on: the older frames' JSON stays as committed
        skip = () if batch.body_version >= wire.BODY_VERSION_INCREMENTS else ("increment", "count_inc")
        out["histograms"] = (
            None
            if hist is None
            else {
                "ts_ns": hist.ts_ns,
                "rows": [
                    {
                        **{k: v for k, v in vars_of(r).items() if k != "kind" and k not in skip},
                        "kind": r.kind.name,
                    }
                    for r in hist.rows()
                ],
            }
        )
    return out


def vars_of(row: Any) -> dict[str, Any]:
    """A HistRow's fields as JSON values (tuples as lists)."""
    out = {}
    for name in row.__dataclass_fields__:
        v = getattr(row, name)
        out[name] = [list(x) if isinstance(x, tuple) else x for x in v] if isinstance(v, tuple) else v
    return out


def _batch_json(batch: wire.DecodedBatch, h: wire.BatchHeader) -> dict[str, Any]:
    return {
        "header": {
            "agent_id": h.agent_id.hex(),
            "key_id": h.key_id,
            "epoch": h.epoch,
            "seq": h.seq,
            "t_min_ns": h.t_min_ns,
            "t_max_ns": h.t_max_ns,
            "record_count": h.record_count,
            "compression": h.compression,
        },
        "counters": {wire.Counter(k).name: v for k, v in sorted(batch.counters.items())},
        "strings": [[p, i, s] for (p, i), s in sorted(batch.strings.items())],
        "records": [
            {
                "pos": int(r["pos"]),
                "producer": int(r["producer"]),
                "type": RecordType(int(r["type"])).name,
                "flags": int(r["flags"]),
                "device": int(r["device"]),
                "id": int(r["id"]),
                "ts_ns": int(r["ts_ns"]),
                "payload": _payload_json(int(r["type"]), r["payload"]),
            }
            for r in batch.to_array()
        ],
    }


def seal_in_c(tmp: Path, records: Path, *mode: str) -> bytes:
    """The frame the C encoder seals from ``records`` (built from the current sources); mode
    ``"v2"``: a version 2 body, the kernels in a HISTOGRAMS section; ``"v3"``: version 3, the
    kernel spans kept too; ``"v4"``: version 4, GPU 0's kernel histogram as an increment over an
    earlier export of 4,096 more kernels."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_agent_units import run_unit

    out = tmp / "frame.kib"
    run_unit(tmp, "test_encode_seal", str(records), str(out), *mode)
    return out.read_bytes()


def main() -> int:
    import tempfile

    FIXTURES.mkdir(parents=True, exist_ok=True)
    (FIXTURES / "records.bin").write_bytes(golden_records().tobytes())
    only = set(sys.argv[1:])  # names to write (default all): a new golden leaves the old ones alone
    for name, mode in (("frame", ()), ("frame_v2", ("v2",)), ("frame_v3", ("v3",)), ("frame_v4", ("v4",))):
        if only and name not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            frame = seal_in_c(Path(tmp), FIXTURES / "records.bin", *mode)
        (FIXTURES / f"{name}.kib").write_bytes(frame)
        decoded = batch_json(wire.decode_batch(frame, KEY))
        (FIXTURES / f"{name}.json").write_text(json.dumps(decoded, indent=1) + "\n")
        print(f"wrote {FIXTURES}/{name}: {len(frame)} bytes, {decoded['header']['record_count']} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
