"""``make bench-cli``: how long the light ``ki`` commands take from exec to exit, as a user's
shell runs them (the installed ``ki`` script, a fresh process each time, warm file cache).

Each command runs ``RUNS`` times; the median wall time is reported, with the load average before
and after. Ends with ``BENCH cli <command>_ms=... load=...``; target: each under 300 ms.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = 7
ROOT = Path(__file__).resolve().parents[2]
KI = shutil.which("ki", path=str(Path(sys.executable).parent)) or "ki"


def commands(tmp: Path) -> dict[str, list[str]]:
    ring = f"bench-cli-{os.getpid()}"
    return {
        "help": ["--help"],
        "keys_list": ["keys", "list", "--store", str(tmp / "keys.json")],
        "tokens_list": ["tokens", "list", "--store", str(tmp / "tokens.json")],
        "ring_stat": ["ring", "stat", ring],
        "rules_check": ["rules", "check", str(ROOT / "deploy" / "rules" / "agents.yml")],
        "schema": ["schema"],
        "run_help": ["run", "--help"],
        "timeline_export_help": ["timeline", "export", "--help"],
        "probe_simulate_help": ["probe", "simulate", "--help"],
        "import_help": ["import", "--help"],
        "collector_help": ["collector", "--help"],
    }


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for store, kind in (("keys.json", "keys"), ("tokens.json", "tokens")):
            (tmp / store).write_text('{"version": 1, "%s": []}' % ("agents" if kind == "keys" else "tokens"))
            (tmp / store).chmod(0o600)
        ring = commands(tmp)["ring_stat"][2]
        subprocess.run([KI, "ring", "create", ring, "--capacity", "1024"], check=True, capture_output=True)
        load_before = os.getloadavg()[0]
        figures: dict[str, float] = {}
        try:
            # The floor: the interpreter alone, at the same load.
            runs = {"python": [sys.executable, "-c", "pass"]}
            runs |= {name: [KI, *argv] for name, argv in commands(tmp).items()}
            for name, argv in runs.items():
                times = []
                for _ in range(RUNS):
                    t0 = time.perf_counter()
                    subprocess.run(argv, capture_output=True, check=False)
                    times.append((time.perf_counter() - t0) * 1000)
                figures[name] = statistics.median(times)
                print(f"{name:<24} median {figures[name]:6.0f} ms (of {RUNS})")
        finally:
            subprocess.run([KI, "ring", "unlink", ring], capture_output=True, check=False)
        load_after = os.getloadavg()[0]
    parts = " ".join(f"{k}_ms={v:.0f}" for k, v in figures.items())
    print(f"BENCH cli {parts} load={load_before:.1f}-{load_after:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
