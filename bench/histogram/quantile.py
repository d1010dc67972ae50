"""bench-histogram's kql part: histogram_quantile over native histograms against classic buckets.

1,000 kernels, one hour at 15 s (241 samples each): cumulative native histograms (schema 3,
each step adding 1,000 long-tailed durations drawn from the kernel's own distribution) and the
same observations as classic ``_bucket`` series (le = powers of two from 1 us to 1 s and +Inf,
which are native bucket bounds, so both hold the same counts). Timed: the range query
``histogram_quantile(0.99, sum by (kernel) (rate(...[5m])))`` over the hour at 15 s.

Headline (``quantile_ms``, ``classic_quantile_ms``): the path users run. Both data sets are
written to one EmbeddedStore (``insert_histograms``, ``insert_samples``) and a real ``ki
collector`` over it answers ``/api/v1/query_range`` to one keep-alive client, as Grafana asks:
the client's wall time to the whole answer, and the collector's CPU time (all its threads,
``/proc/<pid>/task/*/schedstat``) for it (``*_cpu_ms``: the figure that survives a loaded
machine). Beside it, the same queries in-process over the EmbeddedStore (``store_*``, no HTTP)
and over MemoryStorage (``memory_*``, no store). Peers: the classic query on Prometheus
(``prometheus_classic_*``, promtool-made blocks) and VictoriaMetrics (``vm_classic_*``) over the
same buckets, through their HTTP APIs to one keep-alive client, with their CPU time (neither holds
native histograms: Debian's Prometheus is 2.42). Best of ``repeats`` each.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from bench.kql.servers import HttpQuerier, Server
    from kernel_insight.kql.engine import Engine
    from kernel_insight.kql.storage import MemoryStorage

__all__ = ["quantile_figures"]

KERNELS = 1000
STEPS = 241  # 1 h at 15 s, both ends
STEP_MS = 15_000
PER_STEP = 1000
LES = [2.0**k for k in range(-20, 1)]  # 0.95 us .. 1 s


def _storages() -> tuple[MemoryStorage, MemoryStorage]:
    from kernel_insight.kql.histogram import FloatHistogram
    from kernel_insight.kql.storage import MemoryStorage

    rng = np.random.default_rng(14)
    native, classic = MemoryStorage(), MemoryStorage()
    ts = np.arange(STEPS, dtype=np.int64) * STEP_MS
    for k in range(KERNELS):
        pool = rng.lognormal(np.log(20e-6 * (1 + k % 16)), 0.5, 20_000)
        strag = rng.random(pool.size) < 0.005  # stragglers: a Pareto tail
        pool[strag] *= 1 + rng.pareto(1.3, int(strag.sum()))
        base = FloatHistogram.from_observations(pool, 3)
        probs = np.asarray(base.positive_buckets) / base.count
        # per step, the bucket counts of PER_STEP new observations; cumulative over the hour
        counts = np.cumsum(rng.multinomial(PER_STEP, probs, size=STEPS), axis=0).astype(np.float64)
        mean = base.sum / base.count
        hs = [
            FloatHistogram(
                schema=3,
                count=float(row.sum()),
                sum=float(row.sum()) * mean,
                positive_spans=base.positive_spans,
                positive_buckets=tuple(row.tolist()),
            )
            for row in counts
        ]
        labels = {"kernel": f"kernel_{k}", "gpu": "0"}
        native.add_histograms({"__name__": "kernel_duration_seconds", **labels}, ts, hs)
        # classic: le = 2^j, a native bound at schema 3 (every 8th bucket index)
        idx = _indexes(base.positive_spans)
        upper = 2.0 ** (idx / 8.0)
        for le in [*LES, float("inf")]:
            sel = upper <= le * (1 + 1e-12)
            classic.add(
                {
                    "__name__": "kernel_duration_seconds_bucket",
                    "le": "+Inf" if le == float("inf") else repr(le),
                    **labels,
                },
                ts,
                counts[:, sel].sum(axis=1),
            )
    return native, classic


def _indexes(spans: tuple[tuple[int, int], ...]) -> npt.NDArray[np.float64]:
    out: list[int] = []
    i = 0
    for n, (off, length) in enumerate(spans):
        i = off if n == 0 else i + off
        out.extend(range(i, i + length))
        i += length
    return np.asarray(out, dtype=np.float64)


def _time(engine: Engine, query: str, repeats: int, base: int = 0) -> tuple[float, float]:
    """Best wall-clock and best CPU time (this process, ms) of ``repeats`` in-process runs."""
    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeats):
        c = time.process_time()
        t = time.perf_counter()
        r = engine.range_query(query, base, base + (STEPS - 1) * STEP_MS, STEP_MS)
        best = min(best, time.perf_counter() - t)
        best_cpu = min(best_cpu, time.process_time() - c)
        n = len(getattr(r.value, "series", ()))
        if n != KERNELS:
            raise RuntimeError(f"{query}: {n} series, expected {KERNELS}")
    return best * 1000, best_cpu * 1000


def _fill_store(path: Path, native: MemoryStorage, classic: MemoryStorage, base: int) -> None:
    """Both data sets into one EmbeddedStore at ``path``, shifted to ``base`` (settled hours)."""
    from kernel_insight.collector.clickhouse.store import EmbeddedStore
    from kernel_insight.collector.rows import HistogramBuilder, SampleBuilder

    store = EmbeddedStore(path)
    try:
        for series in native.select([_name_matcher()], 0, STEPS * STEP_MS):
            b = HistogramBuilder()
            for t, h in zip(series.hist_timestamps.tolist(), series.histograms, strict=True):
                b.add_histogram(series.labels, base + t, h)
            store.insert_histograms(b.build())
        buckets = classic.select([_name_matcher("kernel_duration_seconds_bucket")], 0, STEPS * STEP_MS)
        for k in range(0, len(buckets), 1_000):
            s = SampleBuilder()
            for series in buckets[k : k + 1_000]:
                s.add_series(series.labels, series.timestamps + base, series.values)
            store.insert_samples(s.build())
    finally:
        store.close()


def _best_over_http(
    server: Server, client: HttpQuerier, query: str, repeats: int, base: int, who: str
) -> tuple[float, float]:
    """Best client wall time and best server CPU time (ms) of ``repeats`` range queries over the
    hour; RuntimeError naming ``who`` when an answer is not the 1,000 kernels' series."""
    from bench.kql.servers import process_cpu_s

    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeats):
        cpu = process_cpu_s(server.proc.pid)
        answer = client.query(query, base, base + (STEPS - 1) * STEP_MS, STEP_MS)
        used = process_cpu_s(server.proc.pid) - cpu
        if answer.matrix is None or len(answer.matrix.series) != KERNELS:
            raise RuntimeError(f"{who}: {answer.error or 'wrong number of series'}")
        best, best_cpu = min(best, answer.seconds), min(best_cpu, used)
    return best * 1000, best_cpu * 1000


def _peers(classic: MemoryStorage, root: Path, repeats: int, base: int) -> dict[str, float]:
    """The classic query on Prometheus (promtool-made blocks) and VictoriaMetrics (imported), the
    same buckets at the same times, each asked as the collector is: best client wall time and best
    server CPU time (ms). Prometheus 2.42 (Debian's) and VictoriaMetrics hold no native histograms."""
    from bench.kql.data import prometheus_text, write_promtool_blocks
    from bench.kql.servers import Prometheus, VictoriaMetrics

    buckets = classic.select([_name_matcher("kernel_duration_seconds_bucket")], 0, STEPS * STEP_MS)
    data = [(tuple(sorted(x.labels)), x.timestamps + base, x.values) for x in buckets]
    write_promtool_blocks(root, data, root / "prom")
    vm = VictoriaMetrics(root / "vm", root / "vm.log")
    try:
        vm.load(prometheus_text(data))
    except BaseException:
        vm.stop()
        raise
    del data
    out: dict[str, float] = {}
    servers: list[tuple[str, Server]] = [("vm", vm)]
    try:
        servers.append(("prometheus", Prometheus(root / "prom", root / "prometheus.log")))
        for key, server in servers:
            client = server.querier()
            try:
                out[f"{key}_classic_quantile_ms"], out[f"{key}_classic_quantile_cpu_ms"] = _best_over_http(
                    server, client, _CLASSIC, repeats, base, key
                )
            finally:
                client.close()
    finally:
        for _, server in servers:
            server.stop()
    return out


def _http(path: Path, root: Path, repeats: int, base: int) -> dict[str, float]:
    """Both queries through a ``ki collector`` over the store at ``path``: best client wall time
    and best collector CPU time per query (ms)."""
    from bench.kql.servers import Collector

    out: dict[str, float] = {}
    server = Collector(path, root, root / "collector.log", "--query-timeout", "1800")
    try:
        client = server.querier()
        try:
            for key, query in (("quantile", _QUERY), ("classic_quantile", _CLASSIC)):
                out[f"{key}_ms"], out[f"{key}_cpu_ms"] = _best_over_http(
                    server, client, query, repeats, base, f"{query} over HTTP"
                )
        finally:
            client.close()
    finally:
        server.stop()
    return out


class _Figures(dict[str, float]):
    """The figures so far, each also written to stderr as it is measured (a long run that fails
    late still shows what it measured)."""

    def __setitem__(self, key: str, value: float) -> None:
        print(f"  {key}: {value:.1f}", file=sys.stderr, flush=True)
        super().__setitem__(key, value)

    def update(self, *args: Any, **kwargs: float) -> None:
        for k, v in dict(*args, **kwargs).items():
            self[k] = v


def quantile_figures(repeats: int = 2, http: bool = True, peers: bool = True) -> dict[str, float]:
    """Every figure of the module docstring; without ``http`` the headline keys are the
    in-process store's; without ``peers`` no Prometheus or VictoriaMetrics figures."""
    from kernel_insight.collector.clickhouse.store import EmbeddedStore
    from kernel_insight.kql.engine import Engine, EngineLimits

    native, classic = _storages()
    limits = EngineLimits(timeout_s=1800.0)  # measured, not bounded: the default 30 s is a server's limit
    figures = _Figures()
    for key, storage, query in (("quantile", native, _QUERY), ("classic_quantile", classic, _CLASSIC)):
        figures[f"memory_{key}_ms"], figures[f"memory_{key}_cpu_ms"] = _time(
            Engine(storage, limits), query, repeats
        )
    base = (int(time.time() * 1000) // 3_600_000 - 3) * 3_600_000  # settled hours
    with tempfile.TemporaryDirectory(prefix="ki-quantile-") as tmp:
        path = Path(tmp) / "data"
        _fill_store(path, native, classic, base)
        if peers:
            figures.update(_peers(classic, Path(tmp), repeats, base))
        del native, classic
        store = EmbeddedStore(path)
        try:
            engine = Engine(store.storage(use_cache=False), limits)
            for key, query in (("quantile", _QUERY), ("classic_quantile", _CLASSIC)):
                figures[f"store_{key}_ms"], figures[f"store_{key}_cpu_ms"] = _time(
                    engine, query, repeats, base
                )
        finally:
            store.close()
        if http:
            figures.update(_http(path, Path(tmp), repeats, base))
        else:
            for key in ("quantile", "classic_quantile"):
                figures[f"{key}_ms"] = figures[f"store_{key}_ms"]
                figures[f"{key}_cpu_ms"] = figures[f"store_{key}_cpu_ms"]
    return dict(figures)


_QUERY = "histogram_quantile(0.99, sum by (kernel) (rate(kernel_duration_seconds[5m])))"
_CLASSIC = "histogram_quantile(0.99, sum by (kernel, le) (rate(kernel_duration_seconds_bucket[5m])))"


def _name_matcher(name: str = "kernel_duration_seconds") -> Any:
    from kernel_insight.kql.storage import Matcher

    return Matcher("__name__", "=", name)


if __name__ == "__main__":
    import argparse
    import os

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each query (the best is kept)")
    ap.add_argument(
        "--no-http", action="store_true", help="skip the ki collector (headline: the in-process store)"
    )
    ap.add_argument(
        "--store", action="store_true", help="accepted for old command lines: the store is always measured"
    )
    ap.add_argument("--no-peers", action="store_true", help="skip Prometheus and VictoriaMetrics")
    a = ap.parse_args()
    load = os.getloadavg()
    for k, v in quantile_figures(a.repeats, not a.no_http, not a.no_peers).items():
        print(f"{k}: {v:.1f}")
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
