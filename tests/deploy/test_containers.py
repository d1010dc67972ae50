"""deploy/containers: the Containerfiles pass hadolint, and the agent image's recipe (the binary and
exactly the libraries it loads) makes a root file system in which the agent runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from deployutil import DEPLOY, ROOT

CONTAINERS = DEPLOY / "containers"
HADOLINT = Path(sys.executable).with_name("hadolint")


@pytest.mark.parametrize("name", ["Containerfile.collector", "Containerfile.agent"])
def test_containerfiles_pass_hadolint(name: str):
    done = subprocess.run(
        [str(HADOLINT), "-c", str(CONTAINERS / ".hadolint.yaml"), str(CONTAINERS / name)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_catches_a_mistake(tmp_path: Path):
    (tmp_path / "Containerfile").write_text("FROM debian\nRUN cd /tmp && make\n")
    done = subprocess.run(
        [str(HADOLINT), "-c", str(CONTAINERS / ".hadolint.yaml"), str(tmp_path / "Containerfile")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0


def test_the_agent_image_recipe_gives_a_root_in_which_the_agent_runs(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("chroot needs root")
    text = (CONTAINERS / "Containerfile.agent").read_text().replace("\\\n", " ")
    runs = re.findall(r"^RUN (.*)$", text, re.MULTILINE)
    make = next(r for r in runs if "make -C agent/src" in r)
    copy = next(r for r in runs if "ldd" in r)
    out = tmp_path / "out"
    subprocess.run(
        make.replace("agent/src", str(ROOT / "agent" / "src")).replace("/out", str(out)),
        shell=True,
        check=True,
        capture_output=True,
        timeout=300,
    )
    subprocess.run(
        ["bash", "-o", "pipefail", "-c", copy.replace("/out", str(out))],
        check=True,
        capture_output=True,
        timeout=120,
    )
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert size < 16 << 20
    done = subprocess.run(
        ["chroot", str(out), "/usr/local/bin/ki-agent", "--version"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert "ki-agent" in done.stdout
    tls = subprocess.run(
        [
            "chroot",
            str(out),
            "/usr/local/bin/ki-agent",
            "--collector",
            "https://127.0.0.1:1",
            "--print-config",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert tls.returncode == 0, tls.stderr
