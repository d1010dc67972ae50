"""make bench-histogram-core: CPU per observation into the agent's native-histogram table.

Builds bench_histogram_core.c against the agent's sources with the agent's own Makefile
(-O2, as the shipped binary), feeds 10 simulated seconds at 1M observations/s over
10,000 distinct keys (hit uniformly, then Zipf-skewed), and reports ns per observation (process CPU time, so other load on
the machine inflates it less than wall time would), the table's allocated memory and the
growth of VmHWM (pages actually touched). Issue 14's target for the whole path is
<= 20 ns per kernel. Ends with one ``BENCH histogram_core ...`` line.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent / "agent" / "src"


def main() -> None:
    """Build, run once per schema asked, print the figures and the BENCH line."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=10, help="simulated seconds at 1M observations/s")
    ap.add_argument("--schema", type=int, default=3)
    ap.add_argument("--max-buckets", type=int, default=160)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        make = ["make", "-s", "-C", str(SRC), f"OUT={tmp}", "unit", f"TEST={HERE / 'bench_histogram_core.c'}"]
        subprocess.run(make, check=True)
        load = os.getloadavg()
        r = subprocess.run(
            [str(Path(tmp) / "bench_histogram_core"), str(a.seconds), str(a.schema), str(a.max_buckets)],
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        )
    fields = dict(kv.split("=", 1) for kv in r.stdout.split())
    print(r.stdout.strip())
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(
        f"BENCH histogram_core ns_per_obs={fields['ns_per_obs']} table_kb={fields['table_kb']}"
        f" zipf_ns_per_obs={fields['zipf_ns_per_obs']} hwm_growth_kb={fields['hwm_growth_kb']} best_tick_ns_per_obs={fields['best_tick_ns_per_obs']}"
        f" schema={fields['schema']} max_buckets={fields['max_buckets']} keys={fields['keys']} load1={load[0]:.2f}"
    )


if __name__ == "__main__":
    main()
