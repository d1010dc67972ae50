"""The soak's ``ki import`` runs: small Prometheus-text files sent to the running collector.

Each run writes :data:`SERIES` series of :data:`POINTS` samples of :data:`METRIC` (label
``run``), every value distinct across the soak (run * 10,000 + series * 100 + point), with
timestamps of the last few seconds, and runs ``ki import --collector URL --token-file F``. A
run that fails (a fault: the collector down, its disk full, ...) is retried at each later
tick and once more after the load; what still fails then is counted with its reason.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from bench.e2e.fleet import REPO

__all__ = ["METRIC", "Importer"]

METRIC, SERIES, POINTS = "soak_import", 10, 5


class Importer:
    def __init__(self, root: Path, url: str, token: str) -> None:
        self.root, self.url = root, url
        self.token_file = root / "import.token"
        self.token_file.write_text(token + "\n")
        self.token_file.chmod(0o600)
        self.runs = 0
        self.pending: dict[int, tuple[Path, set[float]]] = {}  # run -> (its file, its values)
        self.acked: set[float] = set()  # the values of every import that succeeded
        self.succeeded = 0
        self.failures: list[str] = []  # one line per failed attempt: run, exit status, reason

    def write(self) -> None:
        """The next run's file, pending until an import of it succeeds."""
        k = self.runs
        self.runs += 1
        now_ms = int(time.time() * 1000)
        lines, values = [f"# TYPE {METRIC} gauge"], set()
        for s in range(SERIES):
            for p in range(POINTS):
                v = float(k * 10_000 + s * 100 + p)
                values.add(v)
                lines.append(f'{METRIC}{{run="{k}",series="{s}"}} {int(v)} {now_ms - (POINTS - p) * 1000}')
        path = self.root / f"import-{k}.prom"
        path.write_text("\n".join(lines) + "\n")
        self.pending[k] = (path, values)

    def attempt(self) -> None:
        """``ki import`` of every pending file, oldest first."""
        for k, (path, values) in sorted(self.pending.items()):
            done = subprocess.run(
                [sys.executable, "-m", "kernel_insight.cli", "import", "--format", "prometheus",
                 "--collector", self.url, "--token-file", str(self.token_file), str(path)],
                cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
            )  # fmt: skip
            if done.returncode == 0:
                self.acked |= values
                self.succeeded += 1
                del self.pending[k]
            else:
                reason = (done.stderr.strip().splitlines() or ["no message"])[-1][:300]
                self.failures.append(f"import run {k}: exit {done.returncode}: {reason}")

    def step(self) -> None:
        self.write()
        self.attempt()
