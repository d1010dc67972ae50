"""``ki collector --config FILE``: every flag a YAML key, checked as the command line checks it,
the command line winning, ``--print-config`` reading back to the same settings, and SIGHUP
applying the live settings to a running collector (collector/flag_file.py, docs/configuration.md)."""

from __future__ import annotations

import http.server
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.support.collector import running_collector

KI = [sys.executable, "-m", "kernel_insight.cli", "collector"]


def _ki(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KI, *argv], capture_output=True, text=True, timeout=120)


def _settings(text: str) -> dict[str, str]:
    """``--print-config``'s lines as key -> YAML value text (comments left out)."""
    pairs = (line.split(": ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return dict(pairs)  # type: ignore[arg-type]


def test_print_config_reads_back_to_the_same_settings(tmp_path: Path) -> None:
    """Every key ``--print-config`` writes is one the file takes, with the value it had: the printed
    defaults, and then a file that changes one key of each kind, read back unchanged."""
    defaults = _ki("--print-config")
    assert defaults.returncode == 0, defaults.stderr
    first = tmp_path / "defaults.yml"
    first.write_text(defaults.stdout)
    again = _ki("--config", str(first), "--print-config")
    assert again.returncode == 0, again.stderr
    assert again.stdout == defaults.stdout
    keys = _settings(defaults.stdout)
    assert {"store", "head-mb", "keep-alive", "rules", "local-dev", "auth-store", "max-labels"} <= keys.keys()
    assert "config" not in keys
    assert "print-config" not in keys

    changed = tmp_path / "changed.yml"
    changed.write_text(
        "head-mb: 512\nkeep-alive: 120\nrules: [a.yml, 'b*.yml']\nlocal-dev: true\nauth-store: file\n"
        "query-max-samples: 1000\nhead_minutes: 10\n"
    )
    out = _ki("--config", str(changed), "--print-config")
    assert out.returncode == 0, out.stderr
    got = _settings(out.stdout)
    assert got["head-mb"] == "512.0"
    assert got["keep-alive"] == "120.0"
    assert got["rules"] == "[a.yml, b*.yml]"
    assert got["local-dev"] == "true"
    assert got["auth-store"] == "file"
    assert got["query-max-samples"] == "1000"
    assert got["head-minutes"] == "10.0"  # a key spelled with underscores is the same flag
    set_here = {
        "head-mb",
        "keep-alive",
        "rules",
        "local-dev",
        "auth-store",
        "query-max-samples",
        "head-minutes",
    }
    assert {k: v for k, v in got.items() if k not in set_here} == {
        k: v for k, v in keys.items() if k not in set_here
    }
    roundtrip = tmp_path / "roundtrip.yml"
    roundtrip.write_text(out.stdout)
    assert _ki("--config", str(roundtrip), "--print-config").stdout == out.stdout


def test_the_command_line_wins_over_the_file(tmp_path: Path) -> None:
    config = tmp_path / "c.yml"
    config.write_text("head-mb: 512\nrules: [from-file.yml]\nlocal-dev: true\n")
    got = _settings(
        _ki("--head-mb", "64", "--config", str(config), "--rules", "cli.yml", "--print-config").stdout
    )
    assert got["head-mb"] == "64.0"  # before or after --config: the command line wins
    assert got["rules"] == "[from-file.yml, cli.yml]"  # a repeatable flag adds to the file's list
    assert got["local-dev"] == "true"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hed-mb: 5\n", "unknown key 'hed-mb' (did you mean 'head-mb'?)"),
        ("head-mb: lots\n", "head-mb: expected a number of MiB >= 0, got 'lots'"),
        ("head-mb: -1\n", "head-mb: expected a number of MiB >= 0, got '-1'"),
        ("port: 70000\n", "port: expected a port from 0 to 65535, got '70000'"),
        ("local-dev: 1\n", "local-dev: expected true or false, got 1"),
        ("auth-store: nope\n", "auth-store: expected one of auto, file, table, got 'nope'"),
        ("rules: {a: 1}\n", "rules: expected a single value, got {'a': 1}"),
        ("- head-mb\n", "expected a mapping of flag names to values, got list"),
        ("config: other.yml\n", "unknown key 'config'"),
        ("head-mb: [\n", "not YAML"),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "bad.yml"
    config.write_text(text)
    out = _ki("--config", str(config), "--print-config")
    assert out.returncode == 2
    assert f"{config}: {message}" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    out = _ki("--config", str(tmp_path / "absent.yml"))
    assert out.returncode == 2
    assert f"{tmp_path / 'absent.yml'}: No such file or directory" in out.stderr
    assert "Traceback" not in out.stderr


def _wait(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_sighup_applies_the_live_settings_and_names_the_rest(tmp_path: Path) -> None:
    """A running collector re-reads its file on SIGHUP: new rule files are evaluated, an
    Alertmanager added receives, a bad file changes nothing, and a key that needs a restart
    (keep-alive) is named as such. The Alertmanager is a plain HTTP receiver: what is checked is
    that the notifier sends to the URL the file added."""
    first = tmp_path / "first.yml"
    first.write_text("groups: [{name: first, interval: 1s, rules: [{record: one, expr: vector(1)}]}]\n")
    second = tmp_path / "second.yml"
    second.write_text("groups: [{name: second, interval: 1s, rules: [{alert: Always, expr: vector(2)}]}]\n")
    config = tmp_path / "collector.yml"
    config.write_text(f"rules: [{first}]\nkeep-alive: 300\n")
    received: list[str] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(f"{self.path} {body.decode()}")
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    alertmanager = f"http://127.0.0.1:{receiver.server_address[1]}"
    with receiver, running_collector(tmp_path, "--config", str(config)) as c:
        headers = {"Authorization": f"Bearer {c.read_token}"}

        def groups() -> list[str]:
            body = httpx.get(c.url + "/api/v1/rules", headers=headers, timeout=10).json()
            return sorted(g["name"] for g in body["data"]["groups"])

        assert groups() == ["first"]
        config.write_text(f"rules: [{first}, {second}]\nkeep-alive: 60\nalertmanager: [{alertmanager}]\n")
        c.proc.send_signal(signal.SIGHUP)
        _wait(lambda: groups() == ["first", "second"], 30, "the second rule file was not loaded")
        _wait(lambda: any("Always" in r for r in received), 60, "the Alertmanager added got no alert")
        assert received[0].startswith("/api/v2/alerts ")
        _wait(lambda: "keep-alive changed in" in c.stderr.read_text(), 30, "keep-alive not reported")
        assert "it takes effect at the next start" in c.stderr.read_text()

        config.write_text("rules: {broken\n")
        c.proc.send_signal(signal.SIGHUP)
        _wait(lambda: "keeping the settings in use" in c.stderr.read_text(), 30, "bad file not reported")
        assert groups() == ["first", "second"]
        assert c.proc.poll() is None
        receiver.shutdown()


def test_sighup_without_rules_does_not_end_the_collector(tmp_path: Path) -> None:
    """SIGHUP's default action ends a process: with --config the collector handles it even when no
    rules are loaded, and says what changed."""
    config = tmp_path / "collector.yml"
    config.write_text("stale-after: 60\n")
    with running_collector(tmp_path, "--config", str(config)) as c:
        config.write_text("stale-after: 30\n")
        c.proc.send_signal(signal.SIGHUP)
        _wait(lambda: "stale-after changed in" in c.stderr.read_text(), 30, "stale-after not reported")
        assert c.proc.poll() is None
        assert httpx.get(c.url + "/healthz", timeout=10).status_code == 200
