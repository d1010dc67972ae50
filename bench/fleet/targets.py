"""N node_exporter-like targets as remote_write requests, the way prometheus-benchmark drives a TSDB.

The page is a real one: Debian's ``prometheus-node-exporter`` is started on loopback and scraped
once. Each target is that page with its own ``instance`` label and values that evolve from
round to round (counters grow, gauges wander). A page smaller than ``SERIES_PER_TARGET`` is
padded with copies of its per-CPU series for further CPUs, so a target carries about as many
series as prometheus-benchmark's (~828), whatever this machine's core count.

A target's request is a template: every series' label bytes are fixed, and so is where its
sample's value and timestamp go (a 6-byte varint until 2109), so a round rewrites only those
bytes with numpy and compresses with snappy; the sender costs a fraction of what it sends.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass

import cramjam
import httpx
import numpy as np
import numpy.typing as npt

from bench.kql.servers import free_port
from kernel_insight.collector.openmetrics import parse_exposition

__all__ = ["SERIES_PER_TARGET", "Page", "TargetSet", "node_exporter_page"]

SERIES_PER_TARGET = 828
_TS_VARINT_BYTES = 6


@dataclass(frozen=True)
class Page:
    """One scrape: each series' labels (``__name__`` first), value and whether it is a counter."""

    labels: list[list[tuple[str, str]]]
    values: npt.NDArray[np.float64]
    counter: npt.NDArray[np.bool_]


def node_exporter_page() -> Page:
    """Scrape a real node_exporter once, on loopback (only its default collectors)."""
    exe = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if exe is None:
        raise SystemExit(
            "bench-fleet needs Debian's prometheus-node-exporter (scripts/bootstrap.sh installs it)"
        )
    port = free_port()
    proc = subprocess.Popen(
        [exe, f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        text = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        if not text:
            raise SystemExit("prometheus-node-exporter did not answer")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    types = {m.group(1): m.group(2) for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.M)}
    batch = parse_exposition(text, default_timestamp_ms=0).samples
    labels: list[list[tuple[str, str]]] = []
    values: list[float] = []
    counter: list[bool] = []
    for i, value in zip(batch.series_idx.tolist(), batch.values.tolist(), strict=True):
        series = dict(batch.series[i])
        name = series.pop("__name__")
        base = re.sub(r"_(bucket|sum|count|total)$", "", name)
        kind = types.get(name, types.get(base, "untyped"))
        labels.append([("__name__", name), *sorted(series.items())])
        values.append(float(value))
        counter.append(kind in ("counter", "histogram", "summary"))
    return _padded(Page(labels, np.array(values), np.array(counter)))


def _padded(page: Page) -> Page:
    """Copies of the per-CPU series for more CPUs until the page has SERIES_PER_TARGET series."""
    per_cpu = [i for i, lab in enumerate(page.labels) if any(k == "cpu" for k, _ in lab)]
    labels, values, counter = list(page.labels), list(page.values), list(page.counter)
    cpus = sorted({int(v) for i in per_cpu for k, v in page.labels[i] if k == "cpu" and v.isdigit()})
    per_cpu = [i for i in per_cpu if all(v.isdigit() for k, v in page.labels[i] if k == "cpu")]
    copy = 1
    while per_cpu and len(labels) < SERIES_PER_TARGET:
        shift = copy * (max(cpus) + 1)  # copy k of CPU c is CPU c + k * (number of CPUs): no clash
        for i in per_cpu:
            if len(labels) >= SERIES_PER_TARGET:
                break
            labels.append([(k, str(int(v) + shift) if k == "cpu" else v) for k, v in page.labels[i]])
            values.append(page.values[i])
            counter.append(bool(page.counter[i]))
        copy += 1
    return Page(labels, np.array(values), np.array(counter))


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


class TargetSet:
    """Targets ``first .. first+count-1`` of one page: a remote_write body per target per round.

    >>> # TargetSet(page, 0, 10).body(3, round_ts_ms) -> snappy-compressed WriteRequest bytes
    """

    def __init__(self, page: Page, first: int, count: int, *, seed: int = 1, job: str = "node") -> None:
        self.page = page
        self.first, self.count = first, count
        n = len(page.labels)
        rng = np.random.default_rng(seed + first)
        self._values = np.tile(page.values, (count, 1)) * rng.uniform(0.5, 1.5, (count, n))
        self._rates = np.where(page.counter, rng.uniform(0.0, 5.0, (count, n)), 0.0)
        self._rng = rng
        self.job = job
        self.generations = [0] * count
        self._templates = [self._template(t) for t in range(count)]
        self._layouts = [self._offsets(t) for t in range(count)]

    def _template(self, t: int) -> bytearray:
        sample_len = 1 + 8 + 1 + _TS_VARINT_BYTES
        sample = b"\x12" + _varint(sample_len) + b"\x09" + b"\0" * 8 + b"\x10" + b"\0" * _TS_VARINT_BYTES
        generation = self.generations[t]
        name = f"host-{self.first + t:05d}" + (f"-g{generation}" if generation else "")
        extra = [("instance", f"{name}:9100"), ("job", self.job)]
        chunks = []
        for lab in self.page.labels:
            full = sorted([*lab, *extra], key=lambda kv: kv[0])
            body = b"".join(_field(1, _field(1, k.encode()) + _field(2, v.encode())) for k, v in full)
            chunks.append(_field(1, body + sample))
        return bytearray(b"".join(chunks))

    def replace(self, t: int) -> None:
        """Target ``t`` replaced by a new host (a new instance label: all its series are new), as
        prometheus-benchmark's scrapeConfigUpdatePercent churns targets."""
        self.generations[t] += 1
        self._templates[t] = self._template(t)
        self._layouts[t] = self._offsets(t)

    def _offsets(self, t: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Where target ``t``'s values and timestamps go (one scan of its template)."""
        buf = self._templates[t]
        value_at: list[int] = []
        ts_at: list[int] = []
        pos = 0
        while pos < len(buf):
            assert buf[pos] == 0x0A
            length, q = _read_varint(buf, pos + 1)
            end = q + length
            sample = end - (1 + 8 + 1 + _TS_VARINT_BYTES)  # the Sample's fields: 0x09 value, 0x10 ts
            value_at.append(sample + 1)
            ts_at.append(sample + 10)
            pos = end
        return np.array(value_at, np.int64), np.array(ts_at, np.int64)

    @property
    def series_per_target(self) -> int:
        return len(self.page.labels)

    def advance(self, seconds: float) -> None:
        """One scrape interval: counters grow by their rate, gauges wander by up to 1%."""
        self._values += self._rates * seconds
        gauges = ~self.page.counter
        if gauges.any():
            g = self._values[:, gauges]
            g *= 1.0 + self._rng.uniform(-0.01, 0.01, g.shape)
            self._values[:, gauges] = np.round(g, 3)

    def body(self, t: int, ts_ms: int) -> bytes:
        """Target ``t``'s WriteRequest for one round at ``ts_ms``, snappy-compressed."""
        buf = np.frombuffer(self._templates[t], dtype=np.uint8)
        value_at, ts_at = self._layouts[t]
        raw = self._values[t].astype("<f8").view(np.uint8).reshape(-1, 8)
        buf[value_at[:, None] + np.arange(8)] = raw
        tsb = np.frombuffer(_varint_fixed(ts_ms, _TS_VARINT_BYTES), np.uint8)
        buf[ts_at[:, None] + np.arange(_TS_VARINT_BYTES)] = tsb
        return bytes(cramjam.snappy.compress_raw(bytes(self._templates[t])))


def _read_varint(buf: bytearray, pos: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        b = buf[pos]
        v |= (b & 0x7F) << shift
        pos += 1
        if not b & 0x80:
            return v, pos
        shift += 7


def _varint_fixed(v: int, width: int) -> bytes:
    out = bytearray()
    for i in range(width):
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if i < width - 1 else 0))
    if v:
        raise ValueError("timestamp does not fit the fixed varint")
    return bytes(out)
