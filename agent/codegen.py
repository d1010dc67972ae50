"""Files generated from one Python definition (agent/counters.py, collector/wire_header.py): the
check that they are current and the command that rewrites them, written once.

Each generator module offers ``generated_files(root) -> {relative path: text}`` and calls
:func:`main` from its ``__main__`` block; its test asserts :func:`stale` is empty.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

__all__ = ["REPO", "main", "stale"]

#: The checkout this module is in (the editable install points at it).
REPO = Path(__file__).resolve().parent.parent

Generator = Callable[[Path], dict[Path, str]]


def stale(generated_files: Generator, root: Path = REPO) -> list[Path]:
    """The generated files under ``root`` whose text is not what the definition says now."""
    return [rel for rel, text in generated_files(root).items() if (root / rel).read_text() != text]


def main(prog: str, description: str, generated_files: Generator, argv: list[str] | None = None) -> int:
    """List the stale generated files (exit 1 if any), or rewrite them with ``--write``."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument(
        "--write", action="store_true", help="rewrite the generated files (default: list stale ones)"
    )
    p.add_argument("--root", type=Path, default=REPO, help="the repository (default: this checkout)")
    args = p.parse_args(argv)
    files = generated_files(args.root)
    old = stale(generated_files, args.root)
    for rel in old:
        if args.write:
            (args.root / rel).write_text(files[rel])
        print(f"{'wrote' if args.write else 'stale'}: {rel}")
    return 0 if args.write or not old else 1
