"""Helpers for the deploy tests: the repository's deploy folder, a kustomization renderer, flag checks."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import yaml

from kernel_insight.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
AGENT_BIN = ROOT / "agent" / "bin" / "ki-agent"
K8S_VERSION = "1.37.0"

__all__ = [
    "AGENT_BIN",
    "DEPLOY",
    "K8S_VERSION",
    "ROOT",
    "agent_settings",
    "collector_flags",
    "make_tls",
    "render",
    "unit_command",
    "unknown_flags",
]


def _objects(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def render(folder: Path) -> list[dict[str, Any]]:
    """What ``kubectl kustomize folder`` gives for the kustomization features deploy/ uses:
    resources (files or folders), a namespace, configMapGenerator from files without hash suffixes."""
    k = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert set(k) <= {
        "apiVersion",
        "kind",
        "namespace",
        "resources",
        "generatorOptions",
        "configMapGenerator",
    }, "the renderer here knows only these kustomization fields: extend it with the new one"
    out: list[dict[str, Any]] = []
    for res in k.get("resources", []):
        path = folder / res
        out.extend(render(path) if path.is_dir() else _objects(path))
    assert k.get("generatorOptions", {}).get("disableNameSuffixHash", False) or not k.get(
        "configMapGenerator"
    )
    for gen in k.get("configMapGenerator", []):
        data = {}
        for spec in gen.get("files", []):
            key, _, rel = spec.rpartition("=") if "=" in spec else (Path(spec).name, "", spec)
            data[key] = (folder / rel).read_text()
        meta = {"name": gen["name"], **({"labels": gen["options"]["labels"]} if "options" in gen else {})}
        out.append(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, **({"data": data} if data else {})}
        )
    for obj in out:
        if "namespace" in k and obj["kind"] != "Namespace":
            obj["metadata"]["namespace"] = k["namespace"]
    return out


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise KeyError(name)


def collector_flags() -> set[str]:
    """Every option ``ki collector`` accepts."""
    sub = _subparser(build_parser(), "collector")
    sub.format_help()  # a DeferredParser adds its arguments when used (collector/flags.py)
    return {opt for a in sub._actions for opt in a.option_strings}


def agent_settings() -> set[str]:
    """Every ``--setting`` the native agent accepts (from its own --help)."""
    text = subprocess.run([str(AGENT_BIN), "--help"], capture_output=True, text=True, timeout=30).stdout
    # The help spells settings with dashes; the agent takes the config file's underscores as well.
    flags = set(re.findall(r"^\s+(--[a-z][a-z_-]*)", text, re.MULTILINE))
    return flags | {"--" + f[2:].replace("-", "_") for f in flags} | {"--config", "--help", "--version"}


def unknown_flags(args: list[str], known: set[str]) -> list[str]:
    """The ``--flag`` words of ``args`` (also ``--flag=value``) that ``known`` lacks."""
    return [a for a in args if a.startswith("--") and a.split("=", 1)[0] not in known]


def make_tls(folder: Path, host: str) -> None:
    """``ca.crt``/``ca.key`` and ``server.crt``/``server.key`` for ``host`` (and 127.0.0.1) in
    ``folder``, made with the openssl commands the deploy READMEs give."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=120)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=Kernel Insight CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    )
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        f"/CN={host}",
        "-addext",
        f"subjectAltName=DNS:{host},IP:127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    )
    openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-copy_extensions",
        "copy",
        "-out",
        "server.crt",
    )


def unit_command(
    unit: Path, extra: dict[str, str], env_file: Path | None = None
) -> tuple[list[str], dict[str, str]]:
    """A unit's ExecStart as systemd runs it: its EnvironmentFile (or ``env_file``) read, ``${VAR}``
    expanded from that and ``extra`` (STATE_DIRECTORY, CREDENTIALS_DIRECTORY, overrides); returns
    argv and the environment."""
    text = unit.read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("EnvironmentFile="):
            path = env_file or Path(line.removeprefix("EnvironmentFile=").lstrip("-"))
            for entry in path.read_text().splitlines():
                if entry.strip() and not entry.startswith("#"):
                    key, _, value = entry.partition("=")
                    env[key] = value
    env.update(extra)
    (start,) = [ln for ln in text.splitlines() if ln.startswith("ExecStart=")]
    argv = [
        re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], a)
        for a in shlex.split(start.removeprefix("ExecStart="))
    ]
    return argv, env
