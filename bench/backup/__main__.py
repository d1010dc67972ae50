"""make bench-backup: ``ki backup`` of a running collector's embedded store and ``ki restore``
into an empty data directory, timed, on bench/kql's fleet (2,050 series, 7 h at 15 s).

The store is loaded and merged as bench-kql loads it; ``ki collector`` serves it while
``ki backup DEST --collector URL`` streams the frozen parts, keys and tokens; the collector is
stopped, ``ki restore`` attaches the parts in a new data directory, and a query over each
store (rows, sum of values per metric) must answer the same. Ends with
``BENCH backup samples=<n> store_mb=<n> backup_mb=<n> backup_s=<n> restore_s=<n>``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.collector_process import start_collector
from bench.kql.data import HOURS, dataset, load_chdb
from kernel_insight.api import TokenStore
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.keys import KeyStore

_SUMS = "SELECT metric, count() AS n, sum(value) AS total FROM ki.samples GROUP BY metric ORDER BY metric"


def _mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def _ki(*args: str) -> float:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "kernel_insight.cli", *args], capture_output=True, text=True)
    took = time.monotonic() - start
    if done.returncode:
        raise SystemExit(f"ki {args[0]} failed: {done.stderr}")
    print(done.stdout.strip(), file=sys.stderr)
    return took


def _answers(path: Path) -> list[dict[str, object]]:
    with EmbeddedStore(path, cache_bytes=0) as store:
        return list(store.query(_SUMS).to_pylist())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, help="work here (default: a temporary directory)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ki-bench-backup-", dir=args.dir) as tmp:
        root = Path(tmp)
        data = root / "data"
        t0 = (int(time.time()) - HOURS * 3600) * 1000
        load_chdb(data, dataset(t0))
        tokens = TokenStore(root / "tokens.json")
        admin = root / "admin.token"
        admin.write_text(tokens.create("backup", ["admin"]).token)
        KeyStore(root / "keys.json").add_agent("host/gpu0")
        proc, url = start_collector(
            "--store", str(data), "--keys", str(root / "keys.json"), "--tokens", str(root / "tokens.json")
        )
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("the collector did not answer /healthz")
                time.sleep(0.1)
            backup_s = _ki("backup", str(root / "backup"), "--collector", url, "--token-file", str(admin))
        finally:
            proc.terminate()
            proc.wait(60)
        restore_s = _ki("restore", str(root / "backup"), "--store", str(root / "restored"))
        before, after = _answers(data), _answers(root / "restored")
        if before != after:
            raise SystemExit(f"the restored store answers otherwise: {before[:3]} != {after[:3]}")
        samples = sum(int(str(r["n"])) for r in before)
        print(
            f"BENCH backup samples={samples} store_mb={_mb(data):.1f} backup_mb={_mb(root / 'backup'):.1f} "
            f"backup_s={backup_s:.2f} restore_s={restore_s:.2f}"
        )


if __name__ == "__main__":
    main()
