"""The previous release built from its git tag, to run beside HEAD (the upgrade tests).

``git archive`` of the tag into a directory, its C extensions and ``ki-agent`` built there with
its own setup.py, and a ``kernel_insight`` namespace of links to its component folders, as the
packaging maps them (pyproject.toml, ``[tool.setuptools.package-dir]``): ``env()`` runs
``python -m kernel_insight.cli`` from that tree ahead of HEAD's editable install.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PREVIOUS_RELEASE", "PREVIOUS_RELEASE_COMMIT", "Release", "build_release", "release_ref"]

#: The release the upgrade tests run against HEAD (CHANGELOG.md; deploy/README.md, "Upgrades").
PREVIOUS_RELEASE = "v0.1.0"
#: The commit that tag names: a checkout made without tags (CI's) still holds the commit.
PREVIOUS_RELEASE_COMMIT = "255d91c1a84d32cb8e5f387941d4232c2b06bbef"

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Release:
    tag: str
    src: Path  # the tag's tree, built in place
    path: Path  # the folder holding its ``kernel_insight`` namespace

    @property
    def agent(self) -> Path:
        return self.src / "agent" / "bin" / "ki-agent"

    def env(self) -> dict[str, str]:
        """The environment that runs this release's Python code (``python -m kernel_insight.cli``)."""
        return {**os.environ, "PYTHONPATH": str(self.path), "PYTHONSAFEPATH": "1"}

    def ki(self) -> list[str]:
        return [sys.executable, "-m", "kernel_insight.cli"]


def _has(ref: str) -> bool:
    probe = ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def release_ref(tag: str = PREVIOUS_RELEASE, commit: str = PREVIOUS_RELEASE_COMMIT) -> str | None:
    """The ref to archive for ``tag``: the tag where the checkout has it, else its commit, else None.

    A clone without tags (as CI makes) still has the commit; a shallow one may have neither, and
    then the caller says so rather than failing on ``git archive``.
    """
    for ref in (tag, commit):
        if _has(ref):
            return ref
    return None


def build_release(tag: str, out: Path) -> Release:
    """Check out ``tag`` into ``out/src`` and build it (a minute or two: four extensions and the agent)."""
    src, path = out / "src", out / "path"
    src.mkdir(parents=True)
    ref = release_ref(tag) if tag == PREVIOUS_RELEASE else tag
    if ref is None:
        raise LookupError(f"this checkout has neither tag {tag} nor its commit {PREVIOUS_RELEASE_COMMIT}")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=src,
        check=True,
        capture_output=True,
    )
    dirs = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    ns = path / "kernel_insight"
    ns.mkdir(parents=True)
    for entry in (src / dirs["kernel_insight"]).iterdir():
        (ns / entry.name).symlink_to(entry)
    for package, folder in dirs.items():
        if package != "kernel_insight":
            (ns / package.rsplit(".", 1)[1]).symlink_to(src / folder)
    release = Release(tag, src, path)
    where = subprocess.run(
        [*release.ki()[:1], "-c", "import kernel_insight.collector as c; print(c.__file__)"],
        env=release.env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(path)), f"{tag}'s code is not the one imported: {where}"
    return release
