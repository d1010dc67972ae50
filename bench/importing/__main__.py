"""``ki import`` and remote_write on the path users run, beside VictoriaMetrics and promtool.

The dataset is bench/kql's (2,050 series of GPU gauges and counters, 7 h at 15 s: about
3.4M samples), written as OpenMetrics text. Timed here, each as a real process:

- ``ki import FILE`` into a fresh embedded store (samples/s, peak RSS of the process);
- ``ki import FILE --collector URL`` into a running ``ki collector`` (remote_write; the
  importer loads no chDB): samples/s and the importer's peak RSS;
- ``ki collector`` receiving Prometheus remote_write (protobuf + snappy, as Prometheus encodes
  it: 2,000-sample requests, one scrape of every series each) from ``--senders`` concurrent
  keep-alive connections; acknowledged samples/s, then every sample counted in the store;
- VictoriaMetrics (``/api/v1/import/prometheus`` and the same remote_write requests) and
  ``promtool tsdb create-blocks-from openmetrics`` on the same data, when installed.

Bytes per sample on disk after ``ki import`` (docs/storage.md): ``du`` of the store directory
as the import left it, and again once its tables are merged (``OPTIMIZE FINAL`` and the
replaced parts deleted: what the store settles to), beside ``system.parts``' figure and
VictoriaMetrics' ``du`` after its text import (``force_flush``).
Ends with ``BENCH remote_write samples_per_s=<n> ...`` and then
``BENCH import samples_per_s=<n> peak_rss_mb=<n> ... bytes_per_sample_du=<n> ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import httpx
import numpy as np

from bench.e2e.__main__ import _du_bytes
from bench.kql.data import dataset, prometheus_text, write_openmetrics
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.remote_write import SeriesEncoder
from kernel_insight.collector.rows import Labels, SampleBatch
from kernel_insight.run import free_port

REQUEST_SAMPLES = 2_000  # Prometheus' max_samples_per_send


#: Peak resident memory of the last ``_run`` child by kind, MB: ``anon`` (its own: heap, arenas,
#: relocated data) and ``file`` (pages of mapped files: libraries' code, shared with the page cache).
PEAK_KIND_MB: dict[str, int] = {}


def _sample_rss(pid: int, stop: threading.Event) -> None:
    PEAK_KIND_MB.clear()
    while not stop.wait(0.02):
        try:
            fields = dict(
                line.split(":", 1)
                for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if ":" in line
            )
        except OSError:
            return
        for kind, key in (("anon", "RssAnon"), ("file", "RssFile"), ("hwm", "VmHWM")):
            if key in fields:
                PEAK_KIND_MB[kind] = max(PEAK_KIND_MB.get(kind, 0), int(fields[key].split()[0]) // 1024)


def _run(argv: list[str]) -> tuple[float, float, int, str]:
    """Wall seconds, CPU seconds (user + system), peak RSS (MB) and output of a child process.

    CPU seconds are reported beside wall time because this machine is shared: wall time
    says what a user waited, CPU time what the work cost whatever else was running. The
    peaks of anonymous and file-backed memory go to ``PEAK_KIND_MB`` (sampled every 20 ms).

    Peak RSS is the child's own ``VmHWM`` (sampled), not ``ru_maxrss`` from ``wait4``: Linux
    carries the parent's high-water mark into a child that it forked and that then exec'd, so
    ``ru_maxrss`` of a small ``ki import --collector`` read as this bench's own ~575 MB.
    """
    t = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_rss, args=(proc.pid, stop), daemon=True)
    sampler.start()
    out = proc.stdout.read().decode() if proc.stdout else ""
    stop.set()
    sampler.join()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:4]} failed ({proc.returncode}): {out[-2000:]}")
    return elapsed, usage.ru_utime + usage.ru_stime, PEAK_KIND_MB.get("hwm", 0), out


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def requests(data: list[tuple[Labels, np.ndarray, np.ndarray]]) -> list[bytes]:
    """Snappy WriteRequests of REQUEST_SAMPLES samples, time-major as a scraping Prometheus sends them."""
    series = [labels for labels, _, _ in data]
    ts = np.stack([t for _, t, _ in data])  # (series, points)
    vs = np.stack([v for _, _, v in data])
    order_ts = ts.T.ravel()
    order_vs = vs.T.ravel()
    idx = np.tile(np.arange(len(series), dtype=np.int32), ts.shape[1])
    enc = SeriesEncoder()
    return [
        enc.encode(
            SampleBatch(
                series,
                idx[i : i + REQUEST_SAMPLES],
                order_ts[i : i + REQUEST_SAMPLES],
                order_vs[i : i + REQUEST_SAMPLES],
            )
        )
        for i in range(0, len(idx), REQUEST_SAMPLES)
    ]


async def _send_all(url: str, bodies: list[bytes], senders: int) -> float:
    """Every body POSTed over ``senders`` keep-alive connections; seconds until the last 2xx."""
    headers = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"}
    limits = httpx.Limits(max_connections=senders, max_keepalive_connections=senders)
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for b in bodies:
        queue.put_nowait(b)
    async with httpx.AsyncClient(limits=limits, timeout=120, headers=headers) as client:

        async def worker() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                r = await client.post(url, content=body)
                if r.status_code // 100 != 2:
                    raise RuntimeError(f"{url} answered {r.status_code}: {r.text[:300]}")

        await client.post(url, content=bodies[0])  # connect and warm up (stored twice: not counted)
        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(senders)))
        return time.perf_counter() - t


def _collector(root: Path, name: str) -> tuple[subprocess.Popen[str], str, Path]:
    """A real ``ki collector`` (local-dev: no tokens) on a fresh embedded store; (process, base URL, store)."""
    data = root / name
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernel_insight.cli", "collector", "--local-dev", "--store", str(data),
         "--keys", str(root / f"{name}-keys.json"), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    line = proc.stdout.readline() if proc.stdout else ""
    if "listening on" not in line:
        proc.kill()
        proc.communicate()
        raise RuntimeError(f"ki collector did not start: {line!r}")
    return proc, line.split("listening on ")[1].strip(), data


def _stored(data: Path) -> int:
    with EmbeddedStore(data) as store:
        return int(store.query("SELECT count() AS n FROM ki.samples").column("n")[0].as_py())


def bench_ki_remote_write(
    root: Path, bodies: list[bytes], total: int, senders: int
) -> tuple[float, float, int, float]:
    """remote_write into a real ``ki collector``; samples/s, per collector CPU second, samples
    stored, and ``du`` of its store per sample once the collector stopped."""
    proc, base, data = _collector(root, "rw-data")
    try:
        cpu = _cpu_s(proc.pid)
        elapsed = asyncio.run(_send_all(base + "/api/v1/write", bodies, senders))
        cpu = _cpu_s(proc.pid) - cpu
    finally:
        proc.terminate()
        proc.wait(60)
    du = _du_bytes(data)
    stored = _stored(data)
    return total / elapsed, total / cpu, stored, du / max(stored, 1)


def bench_import_via_collector(root: Path, om: Path, total: int) -> tuple[float, int, int]:
    """``ki import FILE --collector URL``: samples/s, the importer's peak RSS (MB), samples stored."""
    proc, base, data = _collector(root, "import-collector-data")
    try:
        elapsed, _, rss, _ = _run(
            [sys.executable, "-m", "kernel_insight.cli", "import", str(om), "--collector", base]
        )
    finally:
        proc.terminate()
        proc.wait(60)
    return total / elapsed, rss, _stored(data)


def _wait_http(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def bench_victoria(root: Path, text: Path, bodies: list[bytes], total: int, senders: int) -> dict[str, float]:
    """VictoriaMetrics on the same data: text import of the whole file, then remote_write (fresh store each)."""
    out: dict[str, float] = {}
    for kind in ("import", "remote_write"):
        port = free_port()
        proc = subprocess.Popen(
            ["victoria-metrics", f"-storageDataPath={root / ('vm-' + kind)}",
             f"-httpListenAddr=127.0.0.1:{port}", "-retentionPeriod=100y"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}"
            _wait_http(base + "/health")
            if kind == "import":
                t = time.perf_counter()
                with text.open("rb") as f:
                    httpx.post(base + "/api/v1/import/prometheus", content=f, timeout=600).raise_for_status()
                urllib.request.urlopen(base + "/internal/force_flush", timeout=120).read()
                out["victoriametrics_import"] = total / (time.perf_counter() - t)
            else:
                elapsed = asyncio.run(_send_all(base + "/api/v1/write", bodies, senders))
                out["victoriametrics_remote_write"] = total / elapsed
        finally:
            proc.terminate()
            proc.wait(60)
        if kind == "import":  # after a clean stop: force_flush leaves recent rows in memory parts
            vm = root / "vm-import"
            out["victoriametrics_bytes_per_sample_du"] = _du_bytes(vm) / total
            # Without the caches it saves at a stop (``cache/``): its rows and its index.
            out["victoriametrics_bytes_per_sample_du_data"] = (
                _du_bytes(vm / "data") + _du_bytes(vm / "indexdb")
            ) / total
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--senders", type=int, default=16, help="concurrent remote_write connections")
    ap.add_argument("--no-compare", action="store_true", help="skip VictoriaMetrics and promtool")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ki-bench-import-"))
    try:
        t0 = (int(time.time()) // 86400) * 86_400_000 - 2 * 86_400_000
        data = dataset(t0)
        total = sum(len(t) for _, t, _ in data)
        om = root / "data.om"
        write_openmetrics(om, data)
        size_mb = om.stat().st_size / 2**20
        print(f"dataset: {total} samples of {len(data)} series, OpenMetrics {size_mb:.0f} MB")

        ki = [sys.executable, "-m", "kernel_insight.cli"]
        elapsed, cpu, rss, out = _run([*ki, "import", str(om), "--store", str(root / "import-data")])
        import_sps, import_cpu = total / elapsed, total / cpu
        kinds = dict(PEAK_KIND_MB)
        print(
            f"ki import: {out.strip()} in {elapsed:.1f} s ({cpu:.1f} CPU s): {import_sps:,.0f} samples/s, "
            f"{import_cpu:,.0f} per CPU second, peak RSS {rss} MB (anonymous {kinds.get('anon')} MB, "
            f"file-backed {kinds.get('file')} MB)"
        )
        disk = {"du": _du_bytes(root / "import-data") / total}
        with EmbeddedStore(root / "import-data") as store:
            stored = int(store.query("SELECT count() AS n FROM ki.samples").column("n")[0].as_py())
            for t in ("samples", "series"):
                store.optimize(t)
            deadline = time.monotonic() + 60  # replaced parts go 1 s after the merge (the store's cleanup)
            while (
                time.monotonic() < deadline
                and store.query("SELECT count() AS n FROM system.parts WHERE NOT active AND database = 'ki'")
                .column("n")[0]
                .as_py()
            ):
                time.sleep(0.5)
            disk["store"] = sum(store.disk_bytes(t) for t in ("samples", "series")) / total
        disk["du_merged"] = _du_bytes(root / "import-data") / total
        print(
            f"ki import on disk: {disk['du']:.2f} bytes/sample by du as imported, {disk['du_merged']:.2f} merged "
            f"({disk['store']:.2f} in system.parts, samples and series)"
        )
        if stored != total:
            raise RuntimeError(f"ki import stored {stored} of {total} samples")
        shutil.rmtree(root / "import-data")

        bodies = requests(data)
        rw_sps, rw_cpu, rw_stored, rw_du = bench_ki_remote_write(root, bodies, total, args.senders)
        lost = total + REQUEST_SAMPLES - rw_stored  # the warm-up request is stored twice
        print(
            f"ki collector remote_write: {len(bodies)} requests of {REQUEST_SAMPLES} samples, "
            f"{args.senders} senders: {rw_sps:,.0f} samples/s, {rw_cpu:,.0f} per collector CPU second, "
            f"{rw_stored} stored (lost {lost}), {rw_du:.2f} bytes/sample by du of its store after it stopped"
        )
        via_sps, via_rss, via_stored = bench_import_via_collector(root, om, total)
        print(
            f"ki import --collector: {via_sps:,.0f} samples/s, importer peak RSS {via_rss} MB, "
            f"{via_stored} stored"
        )
        if via_stored != total:
            raise RuntimeError(f"ki import --collector stored {via_stored} of {total} samples")
        compare: dict[str, float] = {}
        if not args.no_compare and shutil.which("victoria-metrics"):
            text = root / "data.prom"
            with text.open("wb") as f:
                f.writelines(prometheus_text(data))
            compare.update(bench_victoria(root, text, bodies, total, args.senders))
            text.unlink()
        if not args.no_compare and shutil.which("promtool"):
            elapsed, _, prss, _ = _run(
                ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(root / "blocks")]
            )
            compare["promtool_import"] = total / elapsed
            print(f"promtool create-blocks-from openmetrics: {elapsed:.1f} s, peak RSS {prss} MB")
        for name, value in compare.items():
            print(f"compare: {name} {value:,.2f}" + ("" if "bytes" in name else " samples/s"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    extra = " ".join(f"{k}={v:.0f}" for k, v in compare.items() if k.endswith("remote_write"))
    print(
        f"BENCH remote_write samples_per_s={rw_sps:.0f} per_cpu_s={rw_cpu:.0f} senders={args.senders} "
        f"lost={lost} bytes_per_sample_du={rw_du:.2f} {extra}".rstrip()
    )
    extra = " ".join(f"{k}={v:.0f}" for k, v in compare.items() if k.endswith("import"))
    extra += "".join(f" {k}={v:.2f}" for k, v in compare.items() if "bytes_per_sample" in k)
    print(
        f"BENCH import samples_per_s={import_sps:.0f} peak_rss_mb={rss} peak_anon_mb={kinds.get('anon')} "
        f"per_cpu_s={import_cpu:.0f} bytes_per_sample_du={disk['du']:.2f} "
        f"bytes_per_sample_du_merged={disk['du_merged']:.2f} bytes_per_sample_store={disk['store']:.2f} "
        f"via_collector_samples_per_s={via_sps:.0f} via_collector_peak_rss_mb={via_rss} {extra}".rstrip()
    )


if __name__ == "__main__":
    main()
