"""Every command in the deploy READMEs runs. Commands that need what CI lacks (a Kubernetes
cluster, a container engine, a running systemd) go to the stand-ins in deployshim.py, which do
their offline part for real; everything else (openssl, install, useradd, ki ...) runs as written.
The systemd layout runs whole, in a private mount and network namespace: the collector host is
set up, ki-collector started from its unit, then a GPU host enrols its agent through it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from deployutil import DEPLOY, ROOT

from kernel_insight.api import TokenStore
from kernel_insight.collector.keys import KeyStore, read_key_file

SHIMMED = ["kubectl", "docker", "systemctl", "runuser", "clickhouse-client"]


def _blocks(readme: Path) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", readme.read_text(), re.MULTILINE | re.DOTALL)


def _shims(tmp_path: Path) -> dict[str, str]:
    folder = tmp_path / "shims"
    folder.mkdir()
    here = Path(__file__).parent
    for tool in SHIMMED:
        script = folder / tool
        script.write_text(
            f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(here)!r})\n"
            f"import deployshim\ndeployshim.main({tool!r})\n"
        )
        script.chmod(0o755)
    real = os.environ["PATH"]
    return {
        "PATH": f"{folder}:{Path(sys.executable).parent}:{real}:/usr/sbin:/sbin",
        "KI_REAL_PATH": f"{real}:/usr/sbin:/sbin",
        "KI_SHIM_LOG": str(tmp_path / "calls.jsonl"),
        "KI_SHIM_STORE": str(tmp_path / "store" / "tokens.json"),
        "KI_SHIM_CREDENTIALS": str(tmp_path / "credentials"),
        "KI_SHIM_COLLECTOR_LOG": str(tmp_path / "collector.log"),
        "KI_SHIM_PIDS": str(tmp_path / "collector.pid"),
    }


def _run(
    script: str, cwd: Path, env: dict[str, str], *, namespace: bool = False
) -> subprocess.CompletedProcess[str]:
    argv = ["bash", "-euo", "pipefail", "-c", script]
    if namespace:
        argv = ["unshare", "--mount", "--net", "--propagation", "private", *argv]
    return subprocess.run(
        argv, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=600
    )


def _calls(env: dict[str, str]) -> list[list[str]]:
    return [json.loads(line) for line in Path(env["KI_SHIM_LOG"]).read_text().splitlines()]


def test_the_readmes_have_commands():
    for readme in ["kubernetes/README.md", "compose/README.md", "systemd/README.md", "clickhouse/README.md"]:
        assert _blocks(DEPLOY / readme), readme


def test_kubernetes_readme(tmp_path: Path):
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: `kubectl create --dry-run=client` cannot run")
    env = _shims(tmp_path)
    (tmp_path / "store").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    (work / "deploy").symlink_to(DEPLOY)
    done = _run("\n".join(_blocks(DEPLOY / "kubernetes" / "README.md")), work, env)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = _calls(env)
    assert ["kubectl", "apply", "-k", "deploy/"] in calls
    assert (
        sum(1 for c in calls if c[:2] == ["kubectl", "apply"]) == 5
    )  # 4 secrets/namespace + the kustomization
    (enrol,) = TokenStore(Path(env["KI_SHIM_STORE"])).list()
    assert [str(s) for s in enrol.scopes] == ["ingest-admin"]


def test_compose_readme(tmp_path: Path):
    env = _shims(tmp_path)
    (tmp_path / "store").mkdir()
    work = tmp_path / "work"
    shutil.copytree(DEPLOY, work / "deploy")
    done = _run("\n".join(_blocks(DEPLOY / "compose" / "README.md")), work, env)
    assert done.returncode == 0, done.stdout + done.stderr
    secrets = work / "deploy" / "compose" / "secrets"
    assert secrets.stat().st_mode & 0o777 == 0o700
    assert (secrets / "grafana.token").read_text().startswith("ki_")
    assert ["docker", "compose", "up", "-d", "--wait"] in _calls(env)


def test_clickhouse_readme(tmp_path: Path):
    env = _shims(tmp_path)
    (tmp_path / "store").mkdir()
    work = tmp_path / "work"
    shutil.copytree(DEPLOY, work / "deploy")
    done = _run("\n".join(_blocks(DEPLOY / "clickhouse" / "README.md")), work, env)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("schema-single.sql", "schema-cluster.sql"):
        assert (work / "deploy" / "clickhouse" / name).read_text() == (
            DEPLOY / "clickhouse" / name
        ).read_text()


def test_systemd_readme_collector_host_then_gpu_host(tmp_path: Path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare: users, units and files go into a private namespace")
    env = _shims(tmp_path)
    (tmp_path / "store").mkdir()
    collector_host, gpu_host = _blocks(DEPLOY / "systemd" / "README.md")
    overlays = []
    for d in ("etc", "var", "root"):
        for sub in ("upper", "work"):
            (tmp_path / sub / d).mkdir(parents=True)
        overlays.append(
            f"mount -t overlay overlay -o lowerdir=/{d},upperdir={tmp_path}/upper/{d},workdir={tmp_path}/work/{d} /{d}"
        )
    tokens = tmp_path / "collector-host.out"
    script = "\n".join(
        [
            "ip link set lo up",
            *overlays,
            "echo '127.0.0.1 collector.example' >> /etc/hosts",
            f"{{\n{collector_host}\n}} | tee {tokens}",
            # What the operator copies by hand: the enrolment token (printed first) to the GPU host.
            f"grep -o 'ki_[0-9a-f]*\\.[A-Za-z0-9_-]*' {tokens} | head -1 > /root/enrol.token",
            "chmod 600 /root/enrol.token",
            gpu_host,
        ]
    )
    try:
        done = _run(script, ROOT, env, namespace=True)
    finally:
        pid_file = Path(env["KI_SHIM_PIDS"])
        if pid_file.exists():
            os.killpg(int(pid_file.read_text()), signal.SIGTERM)
    log = Path(env["KI_SHIM_COLLECTOR_LOG"])
    assert done.returncode == 0, done.stdout + done.stderr + (log.read_text() if log.exists() else "")
    upper = tmp_path / "upper"
    key = read_key_file(upper / "etc" / "kernel-insight" / "agent-0.key")
    store = KeyStore(upper / "var" / "lib" / "kernel-insight" / "collector" / "keys.json")
    (agent,) = store.agents()
    assert agent.name.endswith("/gpu0")
    assert store.key_for(key.agent_id, key.key_id) == key.key
    calls = _calls(env)
    assert ["systemctl", "enable", "--now", "ki-collector.service"] in calls
    assert any(c[:3] == ["systemctl", "enable", "--now"] and "ki-agent@0.service" in c for c in calls)
