"""The real ki-agent against a real ring and an HTTP receiver that decodes like the collector.

Records written into the ring come out of the agent and the Python decoder
identical; the agent reacts to every collector answer as docs/wire.md says.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from agent_harness import self_signed, setup, wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.wire_corpus import SHIPPED, random_records

from kernel_insight.agent.ring import Ring
from kernel_insight.collector import wire
from kernel_insight.collector.keys import AgentCredentials, KeyStore

C = wire.Counter


def write(s, arr) -> np.ndarray:
    """Write RECORD_DTYPE rows' 48-byte records; returns what the agent must ship (pos, producer set)."""
    head = s.ring.stats()["head"]
    raw = arr.tobytes()
    for i in range(len(arr)):
        assert s.ring.write_raw(raw[i * 64 + 16 : i * 64 + 64]) == 0
    out = arr.copy()
    out["pos"] = np.arange(head, head + len(arr), dtype=np.uint64)
    out["producer"] = s.ring.producer_id
    out["check"] = 0
    return out


def shipped(s) -> dict[int, bytes]:
    """Every record received so far, by ring position."""
    got = {}
    for rec in s.receiver.got.all_array_bytes():
        got[int.from_bytes(rec[:8], "little")] = rec
    return got


def wait_records(s, positions, timeout=10.0):
    wait_for(lambda: set(positions) <= shipped(s).keys(), timeout, f"{len(positions)} records")


@pytest.fixture
def env(tmp_path, agent_bin, ring_name):
    with setup(tmp_path, agent_bin, ring_name) as s:
        yield s


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 300),
    types=st.lists(st.sampled_from(SHIPPED), min_size=1, max_size=8, unique=True),
    names=st.dictionaries(st.integers(1, 2**32 - 1), st.text(min_size=0, max_size=100), max_size=4),
)
def test_records_written_into_the_ring_arrive_identical(env, seed, n, types, names):
    if not env.agents:
        env.start()
    for sid, name in names.items():
        assert env.ring.string(sid, name) == 0
    expected = write(env, random_records(np.random.default_rng(seed), n, types))
    wait_records(env, expected["pos"].tolist())
    got = shipped(env)
    for row in expected:
        assert got[int(row["pos"])] == row.tobytes()
    received = env.receiver.got.names()
    for sid, name in names.items():
        assert received[(env.ring.producer_id, sid)] == name
    assert env.receiver.got.duplicates == 0


NUL_NAMES = {
    1: "\x00",
    2: "\x00" * 32,  # a full last chunk: written sized, with an empty last chunk
    3: "k" * 31 + "\x00",
    4: "k" * 40 + "\x00\x00",
    5: "a\x00b",  # inside a name a NUL was never stripped
    6: "é" * 20 + "\x00",
    7: "",
}


def test_names_ending_in_nul_arrive_whole(env):
    """Ring STRING chunks -> agent name table -> wire -> decoder, byte for byte (docs/ring.md, STRING_SIZED)."""
    env.start()
    for sid, name in NUL_NAMES.items():
        assert env.ring.string(sid, name) == 0
    write(
        env, random_records(np.random.default_rng(11), 1, [1])
    )  # names ship with the batch they complete in
    wait_for(lambda: len(env.receiver.got.names()) >= len(NUL_NAMES), what="every name")
    received = env.receiver.got.names()
    for sid, name in NUL_NAMES.items():
        assert received[(env.ring.producer_id, sid)] == name


def test_kernel_names_travel_with_the_batches_that_use_them(env):
    env.start()
    gid = env.ring.intern("flash_attn_fwd_" + "x" * 70)
    env.ring.kernel(gid, 0, 1000, 2000, 7, 1)
    wait_for(lambda: len(shipped(env)) == 1)
    env.receiver.got.batches.clear()
    env.receiver.got.order.clear()
    env.ring.kernel(gid, 0, 3000, 4000, 7, 2)
    wait_for(lambda: len(shipped(env)) == 1)
    assert env.receiver.got.names() == {(env.ring.producer_id, gid): "flash_attn_fwd_" + "x" * 70}


def test_garbage_in_the_ring_is_skipped_and_counted_never_shipped(env):
    agent = env.start()
    good = write(env, random_records(np.random.default_rng(1), 3, [1]))
    for t in (0, 10, 77, 255):
        assert env.ring.write_raw(bytes([t]) + bytes(47)) == 0
    wait_records(env, good["pos"].tolist())
    assert agent.stop() == 0
    assert len(shipped(env)) == 3
    counters = env.receiver.got.last_counters()
    assert counters[C.GARBAGE_SKIPPED] == 4
    assert counters[C.RECORDS_READ] == 7
    assert counters[C.RECORDS_SHIPPED] == 3


def test_sigterm_flushes_the_ring_before_exit(env):
    agent = env.start("--drain-interval-ms", "60000", "--heartbeat-s", "3600")
    wait_for(lambda: "started:" in agent.log(), what="agent start")  # a slow start is not a lost flush
    time.sleep(0.3)  # the first tick has run; the next would be a minute away
    expected = write(env, random_records(np.random.default_rng(2), 500))
    assert agent.stop() == 0
    assert set(expected["pos"].tolist()) <= shipped(env).keys()
    assert "0 left in the spool" in agent.log()


def test_collector_stopped_batches_are_spooled_and_replayed_in_order(env):
    env.receiver.stop()
    agent = env.start()
    expected = []
    first = time.monotonic()
    for i in range(5):
        expected.append(write(env, random_records(np.random.default_rng(i), 50)))
        time.sleep(0.06)  # a few drain ticks: one batch per round while the collector answers
    span_s = time.monotonic() - first  # 0.3 s, more where this process was not scheduled

    def spooled():  # the spool's batches; pathlib's glob also yields the agent's ".tmp-" files mid-rename
        return [p for p in env.spool.glob("*.kib") if not p.name.startswith(".")]

    def spooled_records():
        total = 0
        for p in spooled():
            with contextlib.suppress(FileNotFoundError):  # replayed and removed meanwhile
                total += wire.parse_header(p.read_bytes()[:-24]).record_count
        return total

    wait_for(lambda: spooled_records() == 250, what="every record in the spool")
    # While the collector is away, batches gather records for up to a second: fewer, larger batches
    # than the five rounds (one per second the writes took, beside the first, sealed before the
    # agent knew the collector was away, and one where a second's window ended).
    assert len(spooled()) <= max(4, int(span_s) + 3)
    env.receiver.restart()
    for e in expected:
        wait_records(env, e["pos"].tolist())
    order = env.receiver.got.order
    assert order == sorted(order, key=lambda b: (b.epoch, b.seq))
    assert env.receiver.got.duplicates == 0
    wait_for(lambda: not spooled(), what="empty spool")
    assert "unreachable" in agent.log()
    assert "accepts batches again" in agent.log()


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_honoured(env, status):
    env.receiver.script = lambda n, body: (status, {"Retry-After": "1"}) if n == 1 else None
    env.start("--backoff-max-ms", "5000")
    expected = write(env, random_records(np.random.default_rng(3), 10))
    wait_records(env, expected["pos"].tolist())
    times = env.receiver.got.times
    assert times[1] - times[0] >= 0.95
    later = write(env, random_records(np.random.default_rng(4), 1))
    wait_records(env, later["pos"].tolist())
    assert env.receiver.got.last_counters()[C.BATCHES_RETRIED] == 1


@pytest.mark.parametrize(
    ("value", "logged"),
    [
        ("3600", "retry after 3600s"),  # trusted only up to backoff_max_ms
        ("99999999999999999999999", "retry after 86400s"),  # past 64 bits: clamped, never wrapped negative
        ("-1", "no Retry-After"),  # invalid: the agent's own backoff
        ("Wed, 21 Oct 2015 07:28:00 GMT", "no Retry-After"),
    ],
)
def test_retry_after_is_validated_and_clamped_to_the_longest_backoff(env, value, logged):
    env.receiver.script = lambda n, body: (503, {"Retry-After": value}) if n == 1 else None
    agent = env.start("--backoff-max-ms", "300")
    expected = write(env, random_records(np.random.default_rng(3), 10))
    wait_records(env, expected["pos"].tolist(), timeout=5)
    times = env.receiver.got.times
    assert times[1] - times[0] < 2.0
    assert logged in agent.log()
    assert "-1s" not in agent.log()


def test_wrong_key_stops_sending_without_spinning_and_sighup_recovers(env):
    right = env.creds
    AgentCredentials(right.agent_id, right.key_id, bytes(32)).write_key_file(env.key_file)
    agent = env.start()
    expected = write(env, random_records(np.random.default_rng(4), 20))
    # The first refusal is awaited (on a loaded host the agent's first send can take over a
    # second), then a second in which a spinning agent would have retried ten times (100 ms backoff).
    wait_for(lambda: "authentication failed" in agent.log(), what="the refusal in the agent's log")
    time.sleep(1.0)
    assert env.receiver.got.requests == 1
    right.write_key_file(env.key_file)
    agent.proc.send_signal(signal.SIGHUP)
    wait_records(env, expected["pos"].tolist())
    assert "re-sealed" in agent.log()
    later = write(env, random_records(np.random.default_rng(5), 1))
    wait_records(env, later["pos"].tolist())
    # The first refusal paused sending; after SIGHUP the old batch was refused once more, then re-sealed.
    assert env.receiver.got.last_counters()[C.AUTH_FAILURES] == 2


def test_revoked_agent_stops_sending_with_a_clear_error(env):
    env.keys.revoke(env.creds.agent_id)
    agent = env.start()
    write(env, random_records(np.random.default_rng(5), 5))
    wait_for(lambda: "unknown or revoked" in agent.log(), what="the refusal in the agent's log")
    time.sleep(1.0)  # a spinning agent would retry within its 100 ms backoff
    assert env.receiver.got.requests == 1
    assert agent.stop() == 0
    assert list(env.spool.glob("*.kib"))  # kept, not thrown away


def read_dead_letters(path):
    """The whole entries of a dead-letter file (docs/agent.md): (status, unix ns, frame). The agent
    creates the file, then writes an entry's head and its frame: a reader may see the file before
    the entry is whole, so an incomplete tail is not returned (nor is a missing file)."""
    data = path.read_bytes() if path.exists() else b""
    out, pos = [], 0
    while pos + 24 <= len(data):
        assert data[pos : pos + 4] == b"KIDL"
        status = int.from_bytes(data[pos + 4 : pos + 6], "little")
        ns = int.from_bytes(data[pos + 8 : pos + 16], "little")
        n = int.from_bytes(data[pos + 16 : pos + 20], "little")
        if pos + 24 + n > len(data):
            break
        out.append((status, ns, data[pos + 24 : pos + 24 + n]))
        pos += 24 + n
    return out


def test_other_4xx_goes_to_the_dead_letter_file_and_the_agent_goes_on(env):
    env.receiver.script = lambda n, body: (400, {}) if n == 1 else None
    agent = env.start()
    first = write(env, random_records(np.random.default_rng(6), 5))
    wait_for(lambda: env.receiver.got.requests >= 1)
    time.sleep(0.1)
    second = write(env, random_records(np.random.default_rng(7), 5))
    wait_records(env, second["pos"].tolist())
    assert not set(first["pos"].tolist()) & shipped(env).keys()
    wait_for(lambda: read_dead_letters(env.spool / "dead-letter"), what="an entry in the dead-letter file")
    third = write(env, random_records(np.random.default_rng(8), 1))  # sealed after the refusal: counts it
    wait_records(env, third["pos"].tolist())
    counters = env.receiver.got.last_counters()
    assert counters[C.BATCHES_FAILED] == 1
    assert counters[C.BATCHES_DEAD_LETTERED] == 1
    assert "moved to" in agent.log()
    ((status, ns, frame),) = read_dead_letters(env.spool / "dead-letter")
    assert status == 400
    assert abs(ns - time.time_ns()) < 60e9
    # The frame is kept as sent: it still opens, with the first records in it.
    batch = wire.decode_batch(frame, env.creds.key)
    assert sorted(batch.to_array()["pos"].tolist()) == first["pos"].tolist()
    assert env.receiver.got.requests == 3  # refused once, never retried


def test_a_permanently_refused_batch_inside_a_backlog_is_dead_lettered_alone(env):
    """Catch-up requests carry several batches; one refused for good goes to the dead-letter file,
    the others of the same request are stored, and nothing is retried forever."""
    env.receiver.script = lambda n, body: (503, {}) if n <= 3 else None
    refused: list[int] = []

    def frame_script(n, body):
        h = wire.parse_header(body)
        if h.seq == 2:
            refused.append(h.seq)
            return 422
        return None

    env.receiver.frame_script = frame_script
    agent = env.start("--batch-records", "64")
    expected = write(env, random_records(np.random.default_rng(9), 64 * 8))
    wait_for(lambda: len(env.receiver.got.batches) >= 7, what="the backlog")
    wait_for(lambda: read_dead_letters(env.spool / "dead-letter"), what="an entry in the dead-letter file")
    assert max(env.receiver.got.frames_per_request) > 1
    assert refused == [2]
    got = shipped(env).keys()
    lost = set(expected["pos"].tolist()) - got
    assert len(lost) == 64  # exactly the refused batch
    ((status, _, frame),) = read_dead_letters(env.spool / "dead-letter")
    assert status == 422
    assert wire.parse_header(frame).seq == 2
    later = write(env, random_records(np.random.default_rng(10), 3))
    wait_records(env, later["pos"].tolist())
    assert env.receiver.got.last_counters()[C.BATCHES_DEAD_LETTERED] == 1
    assert agent.log().count("moved to") == 1


def test_sigkill_and_restart_lose_nothing_and_duplicate_nothing(env):
    # Phase 1: collector answers 503, so everything sits in the spool when the agent is killed.
    env.receiver.script = lambda n, body: (503, {})
    a1 = env.start()
    first = write(env, random_records(np.random.default_rng(8), 200))
    wait_for(lambda: env.receiver.got.requests >= 2)
    a1.stop(signal.SIGKILL)
    # Phase 2: the collector stores a batch but the answer is lost (agent killed while waiting).
    env.receiver.script = None
    stored_then_killed = {"done": False}

    def slow_ack(n, body):
        if not stored_then_killed["done"]:
            stored_then_killed["done"] = True
            env.receiver.script = None
            env.receiver.handle(wire.INGEST_PATH, body)  # stored...
            time.sleep(3)  # ...and the answer never reaches the agent
            return (200, {})
        return None

    env.receiver.script = slow_ack
    a2 = env.start()
    wait_for(lambda: stored_then_killed["done"])
    time.sleep(0.2)
    a2.stop(signal.SIGKILL)
    second = write(env, random_records(np.random.default_rng(9), 100))
    a3 = env.start()
    wait_records(env, first["pos"].tolist() + second["pos"].tolist())
    assert a3.stop() == 0
    assert env.receiver.got.duplicates >= 1  # the replayed, already stored batch was answered 409
    got = env.receiver.got.all_array_bytes()
    assert len(got) == len({r[:8] for r in got}) == 300
    epochs = {b.epoch for b in env.receiver.got.order}
    assert len(epochs) == 3 or len(epochs) == 2


def test_full_spool_drops_oldest_and_reports_the_loss(env):
    env.receiver.stop()
    agent = env.start("--spool-max-mb", "1", "--batch-records", "1024")
    written = 0
    rng = np.random.default_rng(10)
    for _ in range(12):
        written += len(write(env, random_records(rng, 3000)))
        wait_for(lambda: env.ring.stats()["fill"] == 0)
    time.sleep(0.2)
    assert sum(p.stat().st_size for p in env.spool.glob("*.kib")) <= 1 << 20
    env.receiver.restart()
    wait_for(lambda: not list(env.spool.glob("*.kib")), what="empty spool")
    agent.stop()
    counters = env.receiver.got.last_counters()
    dropped = counters[C.SPOOL_DROPPED_RECORDS]
    assert dropped > 0
    assert counters[C.SPOOL_DROPPED_BATCHES] > 0
    assert len(shipped(env)) + dropped == written


def test_each_start_is_a_new_epoch(env):
    for _ in range(2):
        a = env.start()
        wait_records(env, write(env, random_records(np.random.default_rng(11), 3))["pos"].tolist())
        assert a.stop() == 0
    epochs = sorted({b.epoch for b in env.receiver.got.order})
    assert len(epochs) == 2
    assert int((env.spool / "epoch").read_text()) == epochs[-1]


def test_real_ingest_router_under_uvicorn(env):
    import threading

    import uvicorn
    from fastapi import FastAPI

    from kernel_insight.collector.ingest import ingest_router

    batches: list[wire.DecodedBatch] = []

    def sink(b: wire.DecodedBatch) -> bool:
        batches.append(b)
        return True

    app = FastAPI()
    app.include_router(ingest_router(env.keys, sink))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started and server.servers)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        agent = env.start(url=f"http://127.0.0.1:{port}")
        expected = write(env, random_records(np.random.default_rng(12), 1000))
        wait_for(lambda: sum(b.record_count for b in batches) >= 1000)
        assert agent.stop() == 0
        got = {bytes(r)[:8]: bytes(r) for b in batches for r in b.to_array()}
        for row in expected:
            assert got[row.tobytes()[:8]] == row.tobytes()
    finally:
        server.should_exit = True
        thread.join(5)


# ---- configuration and start-up errors -----------------------------------------------


def run_agent(agent_bin, *args, env=None):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KI_AGENT_")}
    clean.update(env or {})
    return subprocess.run([str(agent_bin), *args], capture_output=True, text=True, env=clean, timeout=10)


def test_help_lists_every_setting(agent_bin):
    r = run_agent(agent_bin, "--help")
    assert r.returncode == 0
    for key in ("ring", "collector", "key_file", "spool_max_mb", "drain_interval_ms", "KI_AGENT_COLLECTOR"):
        assert key in r.stdout
    # Flags are shown as ki run and the docs spell them (issue 33: --help said --ring_create while
    # ki run passed --ring-create); the config file's key stays beside them.
    assert "  --ring-create " in r.stdout
    assert "--ring_create" not in r.stdout
    assert "env KI_AGENT_RING_CREATE; file ring_create" in r.stdout


def test_precedence_file_then_environment_then_flags(agent_bin, tmp_path):
    cfg = tmp_path / "agent.conf"
    cfg.write_text("# comment\nring = 5\nzstd_level = 7\nspool_max_mb = 9\n")
    r = run_agent(
        agent_bin, "--config", str(cfg), "--zstd-level=2", "--print-config", env={"KI_AGENT_RING": "6"}
    )
    assert r.returncode == 0, r.stderr
    assert "ring = 6" in r.stdout
    assert "zstd_level = 2" in r.stdout
    assert "spool_max_mb = 9" in r.stdout


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--nope", "1"], {}, "unknown option '--nope'"),
        (["--zstd-level", "99"], {}, "zstd_level must be in [1, 19]"),
        (["--drain-interval-ms", "abc"], {}, "must be an integer"),
        ([], {"KI_AGENT_BOGUS": "1"}, "unknown setting"),
        (["--log-level", "loud"], {}, "log_level"),
        (["--collector"], {}, "needs a value"),
    ],
)
def test_bad_configuration_is_a_clear_error(agent_bin, args, env, message):
    r = run_agent(agent_bin, *args, env=env)
    assert r.returncode == 2
    assert message in r.stderr
    assert r.stderr.count("\n") == 1  # one log line


def test_unknown_key_in_config_file_names_file_and_line(agent_bin, tmp_path):
    cfg = tmp_path / "agent.conf"
    cfg.write_text("ring = 1\ncolector = http://x\n")
    r = run_agent(agent_bin, "--config", str(cfg))
    assert r.returncode == 2
    assert f"{cfg}:2: unknown setting 'colector'" in r.stderr


def test_key_file_readable_by_others_is_refused(agent_bin, tmp_path):
    creds = KeyStore(tmp_path / "k.json").add_agent("a")
    creds.write_key_file(tmp_path / "agent.key")
    os.chmod(tmp_path / "agent.key", 0o644)
    r = run_agent(agent_bin, "--key-file", str(tmp_path / "agent.key"), "--spool-dir", str(tmp_path / "s"))
    assert r.returncode == 1
    assert "chmod 600" in r.stderr
    assert creds.key.hex() not in r.stderr


def test_https_with_a_trusted_ca_delivers(tmp_path, agent_bin, ring_name):
    cert, ctx = self_signed(tmp_path)
    with setup(tmp_path, agent_bin, ring_name, tls=ctx) as s:
        agent = s.start("--tls-ca-file", str(cert))
        expected = write(s, random_records(np.random.default_rng(30), 200))
        wait_records(s, expected["pos"].tolist())
        assert agent.stop() == 0
        assert s.receiver.got.duplicates == 0, agent.log()
        assert "unreachable" not in agent.log()  # TLS session tickets and the like are not errors


def test_https_with_an_untrusted_certificate_sends_nothing_and_says_why(tmp_path, agent_bin, ring_name):
    _cert, ctx = self_signed(tmp_path)
    with setup(tmp_path, agent_bin, ring_name, tls=ctx) as s:
        agent = s.start("--shutdown-timeout-s", "0")  # the system trust store does not know this certificate
        write(s, random_records(np.random.default_rng(31), 5))
        wait_for(lambda: "certificate is not trusted" in agent.log(), what="the TLS error in the log")
        assert agent.stop() == 0
        assert s.receiver.got.batches == {}
        assert list(s.spool.glob("*.kib"))  # kept for when the trust is fixed


def test_sanitizer_build_runs_clean_through_outage_names_garbage_and_shutdown(
    tmp_path, agent_asan_bin, ring_name
):
    with setup(tmp_path, agent_asan_bin, ring_name) as s:
        s.receiver.stop()
        agent = s.start("--batch-records", "256")
        gid = s.ring.intern("gemm")
        for i in range(300):
            s.ring.kernel(gid, 0, 1000 + i, 2000 + i, 1, i)
        s.ring.write_raw(bytes([99]) + bytes(47))
        expected = write(s, random_records(np.random.default_rng(13), 700))
        time.sleep(0.5)
        s.receiver.restart()
        wait_records(s, expected["pos"].tolist(), timeout=20)
        assert agent.stop() == 0
        log = agent.log()
        assert "AddressSanitizer" not in log
        assert "runtime error" not in log
        assert len(shipped(s)) == 1000


def test_repeated_sigkill_under_load_loses_nothing_and_duplicates_nothing(env):
    """Kill -9 at random moments while records stream in: every record arrives exactly once."""
    import random
    import threading

    rnd = random.Random(5)
    written: list[int] = []
    done = threading.Event()

    def produce():
        gid = env.ring.intern("k")
        i = 0
        while not done.is_set() and i < 60_000:
            if env.ring.stats()["fill"] > 12_000:
                time.sleep(0.002)
                continue
            for _ in range(200):
                assert env.ring.kernel(gid, 0, 10_000 + i, 20_000 + i, 1, i) == 0
                i += 1
            time.sleep(0.001)
        written.append(i)

    producer = threading.Thread(target=produce)
    producer.start()
    for _ in range(6):
        agent = env.start("--batch-records", "512")
        time.sleep(rnd.uniform(0.1, 0.4))
        agent.stop(signal.SIGKILL)
    producer.join(30)
    done.set()
    last = env.start()
    total = written[0]
    wait_for(lambda: len(shipped(env)) >= total, 30, f"{total} records")
    assert last.stop() == 0
    got = env.receiver.got.all_array_bytes()
    kernels = [r for r in got if r[16] == 1]
    assert len(kernels) == total  # none twice
    assert {int.from_bytes(r[48:56], "little") for r in kernels} == set(range(total))  # none lost


@pytest.mark.parametrize("mode", ["close_each", "idle_timeout"])
def test_connections_closed_by_the_collector_are_reopened_without_errors(env, mode):
    if mode == "close_each":
        env.receiver.close_each = True
    else:
        env.receiver.idle_timeout = 0.2  # the server drops kept-alive connections idle this long
    agent = env.start()
    for i in range(4):
        expected = write(env, random_records(np.random.default_rng(20 + i), 5))
        wait_records(env, expected["pos"].tolist())
        time.sleep(0.4)
    assert agent.stop() == 0
    assert "unreachable" not in agent.log()
    assert env.receiver.got.last_counters()[C.BATCHES_RETRIED] == 0


def test_ki_agent_launcher_execs_the_binary(agent_bin):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KI_AGENT_")}
    env["KI_AGENT_BINARY"] = str(agent_bin)
    r = subprocess.run(
        [sys.executable, "-m", "kernel_insight.cli", "agent", "--version"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ki-agent ")
    env["KI_AGENT_BINARY"] = "/nonexistent/ki-agent"
    r = subprocess.run(
        [sys.executable, "-m", "kernel_insight.cli", "agent", "--version"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 1
    assert "ki-agent binary not found" in r.stderr


def test_names_survive_an_agent_restart(env):
    gid = env.ring.intern("attention_kernel")
    a1 = env.start()
    env.ring.kernel(gid, 0, 1000, 2000, 1, 1)
    wait_for(lambda: len(shipped(env)) == 1)
    assert a1.stop(signal.SIGKILL) == -signal.SIGKILL
    env.receiver.got.batches.clear()
    env.receiver.got.order.clear()
    a2 = env.start()
    env.ring.kernel(gid, 0, 3000, 4000, 1, 2)
    wait_for(lambda: len(shipped(env)) == 1)
    assert env.receiver.got.names() == {(env.ring.producer_id, gid): "attention_kernel"}
    assert "names of this ring remembered" in a2.log()


def test_agent_started_before_its_ring_waits_for_it(tmp_path, agent_bin, ring_name):
    with setup(tmp_path, agent_bin, ring_name) as s:
        s.ring.close()
        Ring.unlink(ring_name)
        agent = s.start()
        wait_for(lambda: "waiting for a producer" in agent.log(), what="the waiting message")
        assert agent.proc.poll() is None
        s.ring = Ring.create(ring_name, capacity=1 << 12)
        expected = write(s, random_records(np.random.default_rng(40), 50))
        wait_records(s, expected["pos"].tolist())
        assert agent.stop() == 0
        assert "is there now" in agent.log()


@pytest.fixture
def small_fs(tmp_path):
    """A 512 KiB tmpfs of our own, so 'disk full' and 'read-only' are real filesystem states."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path) -> None:
    """Write zeros into path until the filesystem is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 512, 1):
            try:
                while os.write(fd, bytes(size)):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)


@pytest.mark.parametrize("state", ["full", "read-only"])
def test_spool_that_cannot_write_keeps_records_in_the_ring_and_logs_once(
    tmp_path, agent_bin, ring_name, small_fs, state
):
    with setup(tmp_path, agent_bin, ring_name, capacity=1 << 14) as env:
        env.spool = small_fs / "spool"
        agent = env.start("--batch-records", "256")
        first = write(env, random_records(np.random.default_rng(20), 10))
        wait_records(env, first["pos"].tolist())
        if state == "full":
            fill(small_fs / "filler")
        else:
            subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
        before = env.ring.stats()
        # 8,000 records in batches the spool cannot take, many ticks long: the ring (16,384 slots) has room.
        expected = first
        for i in range(8):
            expected = write(env, random_records(np.random.default_rng(21 + i), 1000))
            time.sleep(0.05)
        wait_for(lambda: "cannot write to the spool" in agent.log(), what="the spool error")
        time.sleep(0.5)  # many more ticks, each one trying the spool again
        stats = env.ring.stats()
        assert stats["head"] - stats["tail"] >= 8000 - 256  # still in the ring, not thrown away
        assert stats["dropped"] == before["dropped"] == 0
        assert len(shipped(env)) == 10
        if state == "full":
            (small_fs / "filler").unlink()
        else:
            subprocess.run(["mount", "-o", "remount,rw", str(small_fs)], check=True)
        wait_for(lambda: len(shipped(env)) == 8010, timeout=20, what="every record after the spool recovered")
        assert expected["pos"][-1] in shipped(env)
        log = agent.log()
        assert log.count("cannot write to the spool") == 1
        assert log.count("takes batches again") == 1
        later = write(env, random_records(np.random.default_rng(40), 1))
        wait_records(env, later["pos"].tolist())
        counters = env.receiver.got.last_counters()
        assert counters[C.SPOOL_DROPPED_RECORDS] == 0
        assert counters[C.SPOOL_DROPPED_BATCHES] == 0
        assert counters[C.SPOOL_WRITE_ERRORS] >= 2
        assert env.receiver.got.duplicates == 0
