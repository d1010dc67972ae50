"""No measurements in the product code's comments and docstrings (docs/benchmarks.md).

A figure measured once (``~7 us``, ``0.2 ms``, ``644k samples/s``, ``29 -> 19.6 ns``, ``15% of
a query``, "at load 9") goes stale the day the code around it changes, and nothing re-runs a
comment. The comment says why the code is as it is and names the benchmark that shows it
(``make bench-X``, docs/benchmarks.md, bench/results/X.md), where the figure lives with its date,
machine and load. Design limits (a budget, a timeout, a resolution) are not measurements: the
few that read like one are in ``ALLOWED``, each with the words that make it a limit.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("agent", "collector", "kql", "api", "rules", "sdk", "kernel_insight")
SUFFIXES = (".py", ".pyi", ".c", ".h", ".js")

_NUM = r"(?<![\w.*^-])~?\d[\d.,]*(?:\s*[-\u2013]\s*\d[\d.,]*)?"
#: What a measured figure looks like in prose (code spans and quoted text taken out first, see
#: :func:`prose`, so kql and Go duration literals such as ``200ms`` in examples are not figures).
MEASUREMENT = re.compile(
    "|".join(
        (
            _NUM + r"\s*(?:ns|us|µs|ms)\b",  # a duration: 0.2 ms, ~7 us, 28-30 ns, 5ms
            _NUM + r"\s*[kKM]?\s*(?:samples|records|requests|req|spans|kernels|rows|series|calls)/s\b",
            _NUM + r"\s*(?:[kKMG]i?B|bytes)/s\b",  # a throughput
            r"(?<![\w.])\d+(?:\.\d+)?\s?%",  # a share: 15% of a query
            r"~\s?\d[\d.,]*\s+s\b",  # an approximate time in seconds: ~0.6 s
            r"\d(?:\.\d+)?x\s+(?:faster|slower)\b",
            r"\bat load\s+\d",
            r"\bmeasured\s+(?:on|at|with|in\s+a|\d)",
        )
    )
)

#: (path, words on the line): design limits and arithmetic that the pattern would take for a
#: measurement. Each entry must still match a comment (``test_allow_list_is_current``).
ALLOWED: tuple[tuple[str, str], ...] = (
    ("agent/cupti/inject.c", "wait (100 ms at most)"),
    ("agent/probe/simulate.py", "the defaults give about 2.5 steps/s and ~700 kernels/s per GPU"),
    ("agent/probe/simulate.py", "over ~450 GB/s of NVLink"),
    ("agent/src/loop.c", "holds 33 ms of records at 1M kernels/s, less than a 100 ms tick"),
    ("api/app.py", "(Python's default is 5 ms)"),
    ("api/app.py", "1 ms instead of Python's 5 ms"),
    ("api/defaults.py", "(16 MiB at 300 kB/s)"),
    ("api/timeline.py", "a 10 ms window"),
    ("api/ui/static/app.js", "under 10% free memory"),
    ("collector/captures.py", "at 100k kernels/s, 60 s is 6M spans"),
    ("collector/defaults.py", "at least this long (50 us)"),
    ("collector/derive.py", "or 1 ms after"),
    ("kql/lexical.py", "-> 5400000 ms"),
    ("kql/promqltest.py", "(the 95 % target)"),
    ("sdk/_route.py", "Back off 100, 200, 400 ms"),
)


def product_files() -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", *PRODUCT],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return sorted(
        f for f in set(out) if f.endswith(SUFFIXES) and "tests" not in f.split("/") and (ROOT / f).is_file()
    )


def python_comments(text: str) -> list[tuple[int, str]]:
    """Comment blocks (consecutive ``#`` lines joined) and docstrings, with their first line."""
    blocks: list[tuple[int, str]] = []
    last_line = -2
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type != tokenize.COMMENT:
            continue
        body = tok.string.lstrip("#:").strip()
        if blocks and tok.start[0] == last_line + 1:
            blocks[-1] = (blocks[-1][0], blocks[-1][1] + " " + body)
        else:
            blocks.append((tok.start[0], body))
        last_line = tok.start[0]
    for node in ast.walk(ast.parse(text)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            lines, in_example = [], False
            for line in node.value.value.splitlines():
                # A doctest example runs to the next blank line: its input and its output.
                in_example = bool(line.strip()) and (in_example or line.strip().startswith(">>>"))
                if not in_example:
                    lines.append(line.strip())
            blocks.append((node.lineno, " ".join(lines)))
    return blocks


def c_comments(text: str) -> list[tuple[int, str]]:
    """``/* */`` and ``//`` comments of C or JavaScript, string literals skipped."""
    blocks: list[tuple[int, str]] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'`":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j
            body = " ".join(line.strip().lstrip("*").strip() for line in text[i + 2 : j].splitlines())
            blocks.append((text.count("\n", 0, i) + 1, body))
            i = j + 2
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            body = text[i + 2 : j].strip()
            line = text.count("\n", 0, i) + 1
            blocks.append((line, body))
            i = j
        else:
            i += 1
    return blocks


def comments(path: str) -> list[tuple[int, str]]:
    text = (ROOT / path).read_text(encoding="utf-8")
    return python_comments(text) if path.endswith((".py", ".pyi")) else c_comments(text)


#: Words right before a figure that make it a limit, not a measurement: ``at least 1 ms``.
LIMIT_WORDS = re.compile(r"(?:at least|at most|after|every|up to|within|default(?: is)?)\s*~?$")


#: Code spans (````x````, ```x```) and quoted text: examples, not prose.
_CODE = re.compile(r"``.*?``|`[^`]*`|\"[^\"\n]*\"")


def prose(body: str) -> str:
    """``body`` with its code spans and double-quoted text blanked out (same length)."""
    return _CODE.sub(lambda m: " " * len(m.group()), body)


def _allowed(path: str, body: str, match: re.Match[str]) -> bool:
    if LIMIT_WORDS.search(body[: match.start()]):
        return True
    for allowed_path, words in ALLOWED:
        if allowed_path != path:
            continue
        at = body.find(words)
        if at >= 0 and at <= match.start() < at + len(words):
            return True
    return False


def measurements() -> list[str]:
    found = []
    for path in product_files():
        for line, body in comments(path):
            for match in MEASUREMENT.finditer(prose(body)):
                if not _allowed(path, body, match):
                    start = max(0, match.start() - 50)
                    found.append(f"{path}:{line}: ...{body[start : match.end() + 30]}...")
    return found


def test_no_measurements_in_product_comments() -> None:
    found = measurements()
    assert not found, (
        "measured figures in comments: say why and name the benchmark (make bench-X, "
        "docs/benchmarks.md, bench/results/X.md) instead:\n" + "\n".join(found)
    )


def test_allow_list_is_current() -> None:
    bodies = {path: [body for _, body in comments(path)] for path, _ in ALLOWED}
    stale = [(path, words) for path, words in ALLOWED if not any(words in body for body in bodies[path])]
    assert not stale, f"ALLOWED entries that match no comment any more: {stale}"


def test_the_pattern_sees_figures_and_passes_limits() -> None:
    for figure in (
        "the token's parsing (~7 us of a 0.2 ms query)",
        "644k samples/s into the collector",
        "29 -> 19.6 ns a kernel",
        "took 5-12% less collector CPU",
        "sorting took 250 ms; the strings",
        "measured on dev-2c",
        "the sort took 5ms",
        "A/B at load 9",
        "1.6 MB/s",
    ):
        assert MEASUREMENT.search(prose(figure)), figure
    for limit in (
        "``SUM(rate(x[5m])) > 200ms``",
        '"3 at 250ms"',
        "``1.5µs``",
        "version 4 -> 5",
        "StorageUnavailable -> 503",
        "every 10 s",
        "2**64 ns is 584 years",
    ):
        assert not MEASUREMENT.search(prose(limit)), limit
