"""deploy/systemd: the units pass ``systemd-analyze verify`` and its offline security audit, and the
collector starts exactly as its unit starts it (TLS, tokens and keys from files)."""

from __future__ import annotations

import os
import re
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from deployutil import (
    AGENT_BIN,
    DEPLOY,
    ROOT,
    agent_settings,
    collector_flags,
    make_tls,
    unit_command,
    unknown_flags,
)

from kernel_insight.api import TokenStore

UNITS = DEPLOY / "systemd"
KI = Path(sys.executable).with_name("ki")

#: Highest exposure ``systemd-analyze security`` may give each unit (0 safe .. 10 unsafe); the eBPF
#: tracer's capabilities are what tracing costs (deploy/systemd/README.md).
EXPOSURE = {
    "ki-collector.service": 2.0,
    "ki-agent@0.service": 2.0,
    "ki-probe-nvml.service": 5.0,
    "ki-probe-ebpf.service": 5.5,
}


def _instantiated(tmp_path: Path) -> Path:
    """The units with their binaries pointed at this checkout's (verify checks that they exist)."""
    out = tmp_path / "units"
    out.mkdir()
    for unit in UNITS.glob("*.service"):
        text = unit.read_text().replace("/usr/local/bin/ki-agent", str(AGENT_BIN))
        text = text.replace("/usr/local/bin/ki ", f"{KI} ")
        name = unit.name.replace("@.", "@0.")
        (out / name).write_text(text)
    return out


@pytest.fixture
def units(tmp_path: Path) -> Path:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    return _instantiated(tmp_path)


def test_every_unit_passes_systemd_analyze_verify(units: Path):
    names = sorted(p.name for p in units.iterdir())
    assert names == sorted(EXPOSURE)
    done = subprocess.run(
        ["systemd-analyze", "verify", *[f"./{n}" for n in names]],
        cwd=units,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0
    assert done.stdout + done.stderr == ""


def test_verify_reports_a_broken_unit(units: Path):
    (units / "broken.service").write_text("[Service]\nExecStart=/bin/true\nNoSuchSetting=1\n")
    done = subprocess.run(
        ["systemd-analyze", "verify", "./broken.service"],
        cwd=units,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Unknown key" in done.stderr


@pytest.mark.parametrize("unit", sorted(EXPOSURE))
def test_units_are_hardened(units: Path, unit: str):
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", f"./{unit}"],
        cwd=units,
        capture_output=True,
        text=True,
        timeout=60,
    )
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert found, done.stdout + done.stderr
    assert float(found.group(1)) <= EXPOSURE[unit]


def test_agent_unit_passes_only_settings_the_agent_knows():
    argv, _ = unit_command(UNITS / "ki-agent@.service", {}, env_file=Path("/dev/null"))
    assert unknown_flags(argv[1:], agent_settings()) == []
    conf = (UNITS / "agent.conf").read_text()
    keys = {
        f"--{ln.split('=')[0].strip()}" for ln in conf.splitlines() if ln.strip() and not ln.startswith("#")
    }
    assert keys <= agent_settings()


def test_the_collector_starts_as_its_unit_starts_it(tmp_path: Path):
    """ExecStart with the unit's environment file, credentials and state directory, over TLS."""
    state, creds = tmp_path / "state", tmp_path / "creds"
    state.mkdir(mode=0o700)
    creds.mkdir(mode=0o700)
    make_tls(tmp_path, "localhost")
    (tmp_path / "server.crt").rename(creds / "tls.crt")
    (tmp_path / "server.key").rename(creds / "tls.key")
    overrides = {
        "KI_COLLECTOR_HOST": "127.0.0.1",
        "KI_COLLECTOR_PORT": "0",
        "KI_COLLECTOR_STORE": str(state / "data"),
        "KI_COLLECTOR_RULES": str(ROOT / "deploy" / "rules" / "*.yml"),
        "STATE_DIRECTORY": str(state),
        "CREDENTIALS_DIRECTORY": str(creds),
    }
    argv, env = unit_command(UNITS / "ki-collector.service", overrides, env_file=UNITS / "collector.env")
    assert unknown_flags(argv[2:], collector_flags()) == []
    argv[0] = str(KI)
    token = TokenStore(state / "tokens.json").create("grafana", ["read"]).token
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env}
    )
    try:
        line = proc.stdout.readline()
        assert "listening on https://127.0.0.1:" in line, line
        url = line.split()[-1]
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        with httpx.Client(base_url=url, verify=ctx, timeout=30) as client:
            assert client.get("/api/v1/query", params={"query": "1"}).status_code == 401
            ok = client.get(
                "/api/v1/query", params={"query": "1"}, headers={"Authorization": f"Bearer {token}"}
            )
            assert ok.status_code == 200
            assert ok.json()["data"]["result"][1] == "1"
        with pytest.raises(httpx.ConnectError):  # a client without the CA refuses the server
            httpx.get(url + "/healthz", timeout=10)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        proc.stdout.close()
        proc.stderr.close()
