"""C unit tests per module, built with ASan + UBSan from the current sources and run here."""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import numpy as np
from agent_harness import build, self_signed
from support.wire_corpus import random_records, zero_reserved

from kernel_insight.agent.records import RECORD_DTYPE
from kernel_insight.collector import wire
from kernel_insight.collector.keys import RESERVED_LABELS, KeyStoreError, check_instance_labels

HERE = Path(__file__).resolve().parent / "c"


def run_unit(tmp_path: Path, name: str, *args: str) -> str:
    """Build the unit test ``name`` (once per test: the build dir is the test's) and run it."""
    binary = tmp_path / "build" / name
    if not binary.exists():
        build(tmp_path / "build", "unit", TEST=str(HERE / f"{name}.c"), SAN="1")
    r = subprocess.run(
        [str(binary), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"ASAN_OPTIONS": "detect_leaks=1"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok")
    assert "runtime error" not in r.stderr
    return r.stdout


def test_c_names(tmp_path):
    out = run_unit(tmp_path, "test_names", str(tmp_path / "names"))
    # Names once (docs/wire.md): the agent's name hash is the collector's, bit for bit.
    assert f"hash(1,5,gemm)={wire.name_hash(1, 5, b'gemm'):016x}" in out


def test_c_status(tmp_path):
    """One classifier of the collector's answers: each batch's status (stored, auth, names,
    retryable, permanent) and a request's answer as a whole (none, one status per batch, a refusal
    of several batches, an answer that does not settle each)."""
    run_unit(tmp_path, "test_status")


def test_c_compress_reserves_its_workspace_once(tmp_path):
    """compress.c: zstd's context is sized at creation for the largest batch body, so a catch-up's
    full batches, and the small ones after them, allocate nothing (the agent's memory stays flat
    across outages); frames round-trip and say their content size; over-size input is refused."""
    run_unit(tmp_path, "test_compress")


def test_c_batch_builder(tmp_path):
    """batch.c on a real ring and spool: batches of at most batch_records, a backlog gathering for
    a second, heartbeats, strictly increasing batch times, the names batch, kernels folded."""
    run_unit(tmp_path, "test_batch", str(tmp_path / "scratch"))


def test_c_sender_settles_each_status(tmp_path):
    """send.c against a loopback socket answered by hand: 503/429 with Retry-After, 200, 409, 422,
    401 and SIGHUP, 424 and the names batch, per-batch statuses, a refusal of several batches."""
    run_unit(tmp_path, "test_send", str(tmp_path / "scratch"))


def test_c_loop_without_a_collector(tmp_path):
    """loop.c: early drains paced by the producers' rate (drops counted), a tick, stop, shutdown."""
    run_unit(tmp_path, "test_loop", str(tmp_path / "scratch"))


def test_c_labels_encode_as_the_collector_decodes_and_obey_its_enrolment_rule(tmp_path):
    """The agent's ``labels`` setting: its LABELS section is byte for byte what wire.py encodes for
    the same labels, and it accepts exactly the names the collector's enrolment rule accepts."""
    candidates = [*sorted(RESERVED_LABELS), "__x", "model", "rack_2", "_a", "A", "9x", "a-b", "é", "gpu0"]
    out = run_unit(tmp_path, "test_labels", *candidates)
    sections = dict(
        line[len("section ") :].rsplit(" ", 1) for line in out.splitlines() if line.startswith("section ")
    )
    assert len(sections) == 3
    for text, hexed in sections.items():
        pairs = [tuple(item.strip().split("=", 1)) for item in text.split(",") if item.strip()]
        assert bytes.fromhex(hexed) == wire._section(wire.SECTION_LABELS, wire._encode_labels(pairs))
    named = dict(line.split()[1:] for line in out.splitlines() if line.startswith("name "))
    assert set(named) == set(candidates)
    for name, said in named.items():
        try:
            check_instance_labels({name: "v"})
            python = "yes"
        except KeyStoreError:
            python = "no"
        assert said == python, name


def test_c_histogram_increments(tmp_path):
    """histinc.c alone: an increment holds exactly the buckets that grew and by how much, over
    random growing histograms; bases are kept only when worth it, lost on a schema change or a
    forget; a small arena refuses and compacts without overflowing (the wire side is
    test_agent_hist_increments.py)."""
    run_unit(tmp_path, "test_histinc")


def test_c_tls_client_verifies_the_server_and_carries_bytes(tmp_path):
    """tls.c against a real TLS server on loopback (Python's ssl): the handshake verifies against
    the CA file and the host name, bytes go there and back, the end of the stream reads as 0; a
    wrong host name or another CA is refused with a reason."""
    cert, ctx = self_signed(tmp_path)
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other_ca, _ = self_signed(other_dir)
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    errors: list[BaseException] = []

    def serve(n: int) -> None:
        for _ in range(n):
            conn, _addr = server.accept()
            conn.settimeout(30)
            try:
                with ctx.wrap_socket(conn, server_side=True) as tls:
                    data = tls.recv(64)
                    tls.sendall(data)
                    with contextlib.suppress(ssl.SSLEOFError):  # the client may close without its own
                        tls.unwrap()  # close_notify: the client reads the end of the stream
            except (ssl.SSLError, OSError) as exc:  # the refused handshakes end here
                errors.append(exc)

    thread = threading.Thread(target=serve, args=(3,), daemon=True)
    thread.start()
    try:
        assert "ok echo" in run_unit(tmp_path, "test_tls", str(port), str(cert), "localhost", "echo")
        refused = run_unit(tmp_path, "test_tls", str(port), str(cert), "wrong.example", "refused")
        assert "ok refused" in refused
        assert "ok refused" in run_unit(
            tmp_path, "test_tls", str(port), str(other_ca), "localhost", "refused"
        )
        thread.join(30)
        assert not thread.is_alive()
        assert len(errors) == 2  # the two refused handshakes, the server side of them
    finally:
        server.close()


def test_c_spool(tmp_path):
    run_unit(tmp_path, "test_spool", str(tmp_path / "spool"))


def test_c_config(tmp_path):
    run_unit(tmp_path, "test_config", str(tmp_path / "agent.conf"))


def test_c_encoder_and_seal_agree_with_python_decoder(tmp_path):
    """The C side of the property: a mixed batch encoded and sealed in C decodes identically in Python."""
    rng = np.random.default_rng(7)
    recs = random_records(rng, 2000)
    recs["producer"] = rng.integers(1, 4, len(recs))
    # Add names (as STRING chunks) and garbage, as the ring would hand them out.
    extra = np.zeros(4, dtype=RECORD_DTYPE)
    extra["type"] = [9, 9, 0, 200]
    extra["producer"] = [2, 2, 1, 1]
    extra["id"] = [42, 42, 0, 0]
    extra["device"] = [0, 1, 0, 0]
    extra["flags"] = [0, 0x80, 0, 0]
    text = np.zeros(4, dtype="V32")
    text[0] = b"k" * 32
    text[1] = b"ernel\0\0".ljust(32, b"\0")
    extra["payload"] = text
    extra["pos"] = [1 << 41, (1 << 41) + 1, (1 << 41) + 2, (1 << 41) + 3]
    recs[0]["type"] = 1
    recs[0]["producer"] = 2
    recs[0]["id"] = 42
    recs = zero_reserved(recs)
    (tmp_path / "in.bin").write_bytes(np.concatenate([recs, extra]).tobytes())
    out = run_unit(tmp_path, "test_encode_seal", str(tmp_path / "in.bin"), str(tmp_path / "out.kib"))
    assert "shipped=2000 garbage=2 strings=2" in out
    frame = (tmp_path / "out.kib").read_bytes()
    batch = wire.decode_batch(frame, bytes(range(100, 132)))
    assert batch.header.batch_id == wire.BatchId(bytes(range(16)), 77, 5)
    assert batch.header.key_id == 3
    assert batch.to_array().tobytes() == recs.tobytes()
    assert batch.strings[(2, 42)] == "k" * 32 + "ernel"
    assert batch.counter(wire.Counter.RECORDS_READ) == 2004
    assert batch.counter(wire.Counter.GARBAGE_SKIPPED) == 2


def test_c_http_client_survives_random_and_mutated_responses(tmp_path):
    out = run_unit(tmp_path, "test_http_fuzz")
    assert "answered=" in out


def test_c_capture_windows_report_what_the_collector_decodes(tmp_path):
    out = tmp_path / "sections.bin"
    run_unit(tmp_path, "test_capture", str(out))
    raw, sections = out.read_bytes(), []
    while raw:
        n = int.from_bytes(raw[:8], "little")
        sections.append(raw[8 : 8 + n])
        raw = raw[8 + n :]
    empty = np.zeros(0, RECORD_DTYPE)
    header = wire.parse_header(
        wire.encode_batch(empty, agent_id=bytes(16), key_id=1, key=bytes(32), epoch=1, seq=0)
    )
    t0, s = 1_700_000_000 * 10**9, 10**9
    reports = [wire.decode_body(bytes([wire.BODY_VERSION]) + sec, header).captures for sec in sections]
    assert reports == [
        (
            wire.CaptureReport("0000000000abcdef", 1, t0, t0 + 10 * s, spans=2, final=False),
            wire.CaptureReport("0000000000000042", 0, t0 + s, t0 + 3 * s, spans=2, final=True),
        ),
        (wire.CaptureReport("0000000000abcdef", 1, t0, t0 + 10 * s, spans=2, final=True),),
    ]
