"""Stand-ins for the commands of the deploy READMEs that need infrastructure CI lacks (a Kubernetes
cluster, a container engine, a running systemd). Each records its call and does the offline part
of the real thing: validation for ``apply`` and ``compose config``, the inner command for ``exec``,
starting ki-collector from its unit file for ``systemctl enable --now``. Installed on PATH by
test_readme_commands.py as executables named after the tools."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import kubernetes_validate
import yaml
from deployutil import K8S_VERSION, render, unit_command

LOG = Path(os.environ["KI_SHIM_LOG"])


def _real(tool: str) -> str:
    path = shutil.which(tool, path=os.environ["KI_REAL_PATH"])
    if path is None:
        sys.exit(f"{tool}: not installed")
    return path


def _validate(docs: list[dict]) -> None:
    for doc in docs:
        if doc:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _inner(cmd: list[str]) -> int:
    """Run the ki command of ``cmd`` (a ``sh -c 'ki ...'`` as in the READMEs) here, with its
    ``--store`` (a ClickHouse URL inside the cluster) swapped for a local file store."""
    words = shlex.split(cmd[2]) if cmd[:2] == ["sh", "-c"] else cmd
    words = words[words.index("ki") :]
    if "--store" in words:
        words[words.index("--store") + 1] = os.environ["KI_SHIM_STORE"]
    return subprocess.run(words).returncode


def kubectl(args: list[str]) -> int:
    if "--dry-run=client" in args:
        return subprocess.run([_real("kubectl"), *args]).returncode
    if args[0] == "apply":
        if "-k" in args:
            _validate(render(Path(args[args.index("-k") + 1])))
        for i, a in enumerate(args):
            if a == "-f":
                src = args[i + 1]
                _validate(list(yaml.safe_load_all(sys.stdin if src == "-" else Path(src).read_text())))
        return 0
    if "exec" in args:
        return _inner(args[args.index("--") + 1 :])
    if "rollout" in args:
        return 0
    sys.exit(f"kubectl stand-in: no offline equivalent for {args}")


def docker(args: list[str]) -> int:
    assert args[0] == "compose", args
    sub = args[1]
    if sub == "config":
        spec = yaml.safe_load(Path("compose.yaml").read_text())
        missing = [s["file"] for s in spec.get("secrets", {}).values() if not Path(s["file"]).exists()]
        if missing:
            sys.exit(f"secret files missing: {missing}")
        checker = Path(sys.executable).with_name("check-jsonschema")
        return subprocess.run(
            [str(checker), "-q", "--builtin-schema", "vendor.compose-spec", "compose.yaml"]
        ).returncode
    if sub in ("up", "restart"):
        return 0
    if sub == "exec":
        return _inner(args[3:])
    sys.exit(f"docker stand-in: no offline equivalent for {args}")


def systemctl(args: list[str]) -> int:
    if args == ["daemon-reload"]:
        return 0
    assert args[0] == "enable", args
    for unit in (a for a in args[1:] if a.endswith(".service")):
        template = unit.split("@")[0] + "@.service" if "@" in unit else unit
        path = Path("/etc/systemd/system") / template
        if not path.is_file():
            sys.exit(f"systemctl stand-in: {path} is not installed")
        if unit == "ki-collector.service" and "--now" in args:
            _start_collector(path)
    return 0


def _start_collector(unit: Path) -> None:
    """What systemd would do: the unit's ExecStart with its environment file, state directory
    and credentials; returns once the collector answers over TLS."""
    creds = Path(os.environ["KI_SHIM_CREDENTIALS"])
    creds.mkdir(mode=0o700, exist_ok=True)
    text = unit.read_text()
    for line in text.splitlines():
        if line.startswith("LoadCredential="):
            name, _, source = line.removeprefix("LoadCredential=").partition(":")
            shutil.copy(source, creds / name)
    argv, env = unit_command(
        unit, {"STATE_DIRECTORY": "/var/lib/kernel-insight/collector", "CREDENTIALS_DIRECTORY": str(creds)}
    )
    argv[0] = shutil.which("ki") or "ki"
    log = open(os.environ["KI_SHIM_COLLECTOR_LOG"], "w")  # noqa: SIM115 (the collector outlives us)
    proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=log, stderr=log, start_new_session=True)
    Path(os.environ["KI_SHIM_PIDS"]).write_text(str(proc.pid))
    ctx = ssl.create_default_context(cafile="/etc/kernel-insight/tls/ca.crt")
    deadline = time.monotonic() + 90
    while True:
        try:
            if (
                httpx.get(
                    f"https://localhost:{env['KI_COLLECTOR_PORT']}/healthz", verify=ctx, timeout=5
                ).status_code
                == 200
            ):
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(
                f"ki-collector did not start: {Path(os.environ['KI_SHIM_COLLECTOR_LOG']).read_text()[-2000:]}"
            )
        time.sleep(0.2)


def runuser(args: list[str]) -> int:
    # Runs the command as root: a checkout under /root is not readable by the service user.
    return subprocess.run(args[args.index("--") + 1 :]).returncode


def clickhouse_client(args: list[str]) -> int:
    """Every statement through ClickHouse's own parser (no cluster here to run them on)."""
    from kernel_insight.collector.clickhouse.store import EmbeddedStore, quote

    statements = [s for s in sys.stdin.read().split(";\n") if s.strip()]
    assert statements
    with EmbeddedStore(Path(os.environ["KI_SHIM_STORE"]).parent / "chdb") as store:
        for s in statements:
            store.query(f"SELECT formatQuery({quote(s)})")
    return 0


def main(tool: str) -> None:
    args = sys.argv[1:]
    with LOG.open("a") as f:
        f.write(json.dumps([tool, *args]) + "\n")
    sys.exit(
        {
            "kubectl": kubectl,
            "docker": docker,
            "systemctl": systemctl,
            "runuser": runuser,
            "clickhouse-client": clickhouse_client,
        }[tool](args)
    )
