"""The SDK's public surface and its one dependency."""

from __future__ import annotations

import subprocess
import sys

import kernel_insight.sdk as sdk


def test_importing_the_sdk_pulls_in_httpx_but_nothing_heavy():
    code = (
        "import sys, kernel_insight.sdk; "
        "print(sorted(m for m in ('numpy', 'fastapi', 'pydantic', 'chdb', 'pyarrow', 'lark', 'starlette')"
        " if m in sys.modules), 'httpx' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[] True"


def test_public_names_come_from_private_modules_and_nothing_else_leaks():
    assert all(
        getattr(sdk, name).__module__.startswith("kernel_insight.sdk._")
        for name in sdk.__all__
        if name[0].isupper() and not name.startswith("DEFAULT")
    )
    public = {n for n in dir(sdk) if not n.startswith("_")} - {"annotations"}
    assert public == set(sdk.__all__)
