"""The agent's native-histogram accumulator (agent/src/histogram.c) against Prometheus' algorithms.

Three checks: the C unit test (client_golang's published examples, edge cases, table refusal;
built with ASan + UBSan), a property test comparing the C bucket index with a Python port of
client_golang's mapping (prometheus/histogram.go, histogramCounts.observe) on 100k values over
every magnitude and every schema, and an accuracy check of Prometheus' histogram_quantile over
native buckets against the exact quantiles of 1M long-tailed durations.
"""

from __future__ import annotations

import bisect
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
from agent_harness import SRC, build

UNIT = Path(__file__).resolve().parent / "c" / "test_histogram.c"
BOUNDS_H = SRC.parent / "include" / "ki_histogram_bounds.h"


def bounds_table() -> dict[int, list[float]]:
    """client_golang's nativeHistogramBounds as the agent carries them (the table is data; the
    algorithm below is ported independently)."""
    text = BOUNDS_H.read_text()
    out: dict[int, list[float]] = {}
    for m in re.finditer(r"ki_histogram_bounds_(\d)\[\d+\] = \{(.*?)\};", text, re.S):
        out[int(m.group(1))] = [float(x) for x in re.findall(r"[0-9][0-9.e-]*", m.group(2))]
    return out


def go_index(v: float, schema: int, bounds: dict[int, list[float]]) -> int:
    """Port of client_golang's key computation (histogramCounts.observe), v not NaN."""
    is_inf = math.isinf(v)
    if is_inf:
        v = math.copysign(1.7976931348623157e308, v)
    frac, exp = math.frexp(abs(v))
    if schema > 0:
        b = bounds[schema]
        key = bisect.bisect_left(b, frac) + (exp - 1) * len(b)  # sort.SearchFloat64s
    else:
        key = exp
        if frac == 0.5:
            key -= 1
        offset = (1 << -schema) - 1
        key = (key + offset) >> -schema  # Python's >> floors like Go's on signed ints
    return key + 1 if is_inf else key


def run(exe: Path, *args: str) -> str:
    r = subprocess.run(
        [str(exe), *args], capture_output=True, text=True, timeout=120, env={"ASAN_OPTIONS": "detect_leaks=1"}
    )
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    assert r.stdout.startswith("ok")
    assert "runtime error" not in r.stderr
    return r.stdout


def exe(tmp_path: Path) -> Path:
    return build(tmp_path / "build", "unit", TEST=str(UNIT), SAN="1") / "test_histogram"


def test_c_histogram_published_examples_and_edges(tmp_path: Path) -> None:
    run(exe(tmp_path))


def test_bucket_index_matches_client_golang_port_on_100k_values(tmp_path: Path) -> None:
    rng = np.random.default_rng(14)
    n = 100_000
    mant = rng.uniform(0.5, 1.0, n)
    exps = rng.integers(-1074, 1024, n)
    values = np.ldexp(mant, exps)  # every magnitude, subnormals included
    k = n // 4
    values[:k] = np.ldexp(1.0, rng.integers(-1074, 1024, k))  # exact powers of two
    bounds = bounds_table()
    bvals = np.array([b for s in range(1, 9) for b in bounds[s]])
    j = rng.integers(0, len(bvals), k)
    values[k : 2 * k] = np.ldexp(bvals[j], rng.integers(-1000, 1000, k))  # bucket boundaries exactly
    values[2 * k : 2 * k + 1000] = np.nextafter(values[k : k + 1000], np.inf)  # just above a boundary
    values[2 * k + 1000 : 2 * k + 2000] = np.nextafter(values[k + 1000 : k + 2000], 0.0)  # just below one
    values[-4:] = [np.inf, -np.inf, np.finfo(np.float64).max, 5e-324]
    values *= np.where(rng.random(n) < 0.3, -1.0, 1.0)
    vin = tmp_path / "v.f64"
    values.astype("<f8").tofile(vin)
    out = tmp_path / "idx.i32"
    assert "indexes=1300000" in run(exe(tmp_path), "index", str(vin), str(out))
    got = np.fromfile(out, dtype="<i4").reshape(13, n)
    for row, schema in enumerate(range(-4, 9)):
        want = np.array([go_index(float(v), schema, bounds) for v in values], dtype=np.int64)
        bad = np.nonzero(got[row] != want)[0]
        assert bad.size == 0, f"schema {schema}: {bad.size} differ, first v={values[bad[0]]!r}"


def test_the_bucket_index_table_is_generated_from_the_bounds() -> None:
    """ki_histogram_index.h (the lookup that replaced the bounds search) is what the generator
    writes from the bounds today, and no interval of its leading mantissa bits holds two bounds."""
    gen = SRC.parents[1] / "scripts" / "gen_histogram_index.py"
    r = subprocess.run([sys.executable, str(gen), "--check"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"agent/include/ki_histogram_index.h is stale: run {gen.name} ({r.stderr})"


def parse_export(text: str) -> tuple[int, int, int, list[tuple[int, int]]]:
    """(schema, zero_count, count, [(bucket index, count)]) from the test program's export."""
    fields = dict(line.split(" ", 1) if " " in line else (line, "") for line in text.splitlines()[1:])
    buckets: list[tuple[int, int]] = []
    deltas = [int(x) for x in fields["pos_deltas"].split()]
    idx, c, d = 0, 0, 0
    for span in fields["pos_spans"].split():
        off, length = (int(x) for x in span.split(":"))
        idx += off
        for _ in range(length):
            c += deltas[d]
            d += 1
            buckets.append((idx, c))
            idx += 1
    assert d == len(deltas)
    return int(fields["schema"]), int(fields["zero_count"]), int(fields["count"]), buckets


def histogram_quantile(
    q: float, schema: int, zero_count: int, count: int, buckets: list[tuple[int, int]]
) -> float:
    """Prometheus' HistogramQuantile (promql/quantile.go) for a positive native histogram: the
    bucket where the cumulative count reaches q*count, interpolated exponentially inside it."""
    rank = q * count
    cum = float(zero_count)
    if cum >= rank:
        return 0.0
    base = 2.0 ** (2.0**-schema)
    for idx, c in buckets:
        if c == 0:
            continue
        if cum + c >= rank:
            upper = base**idx
            lower = upper / base
            frac = (rank - cum) / c
            log_lower, log_upper = math.log2(lower), math.log2(upper)
            return float(2.0 ** (log_lower + (log_upper - log_lower) * frac))
        cum += c
    return math.inf


def test_quantiles_from_buckets_are_within_the_schema_error_bound(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    n = 1_000_000
    # Kernel durations: lognormal body around 50 us, 1% stragglers 10-1000x slower.
    d = rng.lognormal(np.log(50e-6), 0.6, n)
    slow = rng.random(n) < 0.01
    d[slow] *= rng.uniform(10, 1000, int(slow.sum()))
    vin = tmp_path / "d.f64"
    d.astype("<f8").tofile(vin)
    ordered = np.sort(d)
    for schema in (0, 3, 5):
        schema_got, zero_count, count, buckets = parse_export(
            run(exe(tmp_path), "export", str(schema), str(vin))
        )
        # 160 buckets hold ~17 octaves at schema 3; schema 5 needs more, so the limit lowers it (client_golang).
        assert schema_got == schema if schema <= 3 else schema_got < schema
        assert len(buckets) <= 160 * 3
        assert count == n
        assert zero_count == 0
        assert sum(c for _, c in buckets) == n
        bound = 2.0 ** (
            2.0**-schema_got
        )  # estimate and exact share one bucket (lower, upper], upper/lower = base
        for q in (0.5, 0.9, 0.99, 0.999):
            exact = float(ordered[math.ceil(q * n) - 1])
            est = histogram_quantile(q, schema_got, zero_count, count, buckets)
            assert 1 / bound <= est / exact <= bound, (schema, q, est, exact)
