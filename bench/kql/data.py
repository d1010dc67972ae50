"""bench-kql's dataset: a GPU fleet over 7 h at 15 s, and its loaders (chDB, promtool blocks, VictoriaMetrics).

Metric names and labels are the collector's own (docs/metrics.md), so the queries read as a
fleet's dashboards and alerts do.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt

from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import SampleBuilder
from kernel_insight.kql.storage import Labels

__all__ = [
    "GPUS",
    "HOURS",
    "INSTANCES",
    "SCRAPE_MS",
    "Dataset",
    "dataset",
    "load_chdb",
    "prometheus_text",
    "write_openmetrics",
    "write_promtool_blocks",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Dataset = list[tuple[Labels, I64, F64]]

SCRAPE_MS = 15_000
HOURS = 7  # the 6 h range query's first 1 h windows need the hour before it
INSTANCES = 25
GPUS = 8
KERNELS = ("gemm_fp16", "flash_attn_fwd", "flash_attn_bwd", "nccl_allreduce", "layernorm")
MODELS = ("llama-70b", "llama-8b", "mistral-7b", "mixtral-8x22b")


def dataset(t0_ms: int, seed: int = 5) -> Dataset:
    """2,050 series: 5 GPU metrics per GPU (1,000), launches per kernel per GPU (1,000), 2 agent metrics per instance.

    Each instance scrapes at its own phase (whole seconds + 250 ms); counters reset once on a
    few GPUs (a process restart), so rate/increase/resets see resets as in a real fleet.
    """
    rng = np.random.default_rng(seed)
    points = HOURS * 3600_000 // SCRAPE_MS
    out: Dataset = []
    for n in range(INSTANCES):
        inst = f"node-{n:02d}"
        model = MODELS[n % len(MODELS)]
        # Scrapes at x.250 s: query steps (x.500 s) and subquery steps (whole minutes) never hit a sample.
        ts = t0_ms + (n % 15) * 1000 + 250 + np.arange(points, dtype=np.int64) * SCRAPE_MS

        def add(name: str, values: F64, labels: dict[str, str], ts: I64 = ts) -> None:
            full = {**labels, "__name__": name}
            out.append((tuple(sorted(full.items())), ts, np.round(values, 6)))

        add("ki_agent_drain_lag_seconds", np.abs(rng.normal(0.05, 0.02, points)), {"instance": inst})
        add(
            "ki_agent_records_read_total",
            np.cumsum(rng.poisson(40_000, points)).astype(np.float64),
            {"instance": inst},
        )
        for gpu in range(GPUS):
            base = {"instance": inst, "gpu": str(gpu), "model": model}
            load = np.clip(0.6 + np.cumsum(rng.normal(0, 0.02, points)), 0.0, 1.0)
            add("gpu_temperature_celsius", 45 + 40 * load + rng.normal(0, 1.5, points), base)
            add("gpu_power_watts", 120 + 560 * load + rng.normal(0, 15, points), base)
            add("gpu_sm_utilization_ratio", np.clip(load + rng.normal(0, 0.05, points), 0, 1), base)
            add("gpu_memory_used_bytes", np.floor((20 + 50 * load) * 2**30), base)
            reset = int(rng.integers(points // 4, points)) if rng.random() < 0.2 else points
            energy = np.cumsum((120 + 560 * load) * 15.0)
            energy[reset:] -= energy[reset - 1] if reset < points else 0
            add("gpu_energy_joules_total", energy, base)
            for k, kernel in enumerate(KERNELS):
                per_scrape = rng.poisson(200 * (k + 1) * load + 1)
                launches = np.cumsum(per_scrape).astype(np.float64)
                if reset < points:
                    launches[reset:] -= launches[reset - 1]
                add("kernel_launches_total", launches, {**base, "kernel": kernel})
    return out


def load_chdb(path: Path, data: Dataset) -> None:
    """The dataset into an embedded store, in batches as an ingest would write them, then merged."""
    with EmbeddedStore(path) as store:
        for i in range(0, len(data), 250):
            b = SampleBuilder()
            for labels, ts, vs in data[i : i + 250]:
                b.add_series(labels, ts, vs)
            store.insert_samples(b.build(), dedup_token=f"bench-kql:{i}")
        store.optimize("samples")


def write_openmetrics(path: Path, data: Dataset) -> None:
    """OpenMetrics text (timestamps in seconds), one family at a time: promtool's and ``ki import``'s input."""
    by_name: dict[str, Dataset] = {}
    for item in data:
        by_name.setdefault(dict(item[0])["__name__"], []).append(item)
    with path.open("w") as f:
        for name, items in by_name.items():
            kind = "counter" if name.endswith("_total") else "gauge"
            family = name.removesuffix("_total") if kind == "counter" else name
            f.write(f"# TYPE {family} {kind}\n")
            for labels, ts, vs in items:
                lab = ",".join(f'{k}="{v}"' for k, v in labels if k != "__name__")
                head = f"{name}{{{lab}}} "
                f.writelines(
                    f"{head}{v!r} {t // 1000}.{t % 1000:03d}\n"
                    for v, t in zip(vs.tolist(), ts.tolist(), strict=True)
                )
        f.write("# EOF\n")


def write_promtool_blocks(root: Path, data: Dataset, out: Path) -> None:
    """Prometheus TSDB blocks through ``promtool tsdb create-blocks-from openmetrics``."""
    om = root / "data.om"
    write_openmetrics(om, data)
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(out)],
        check=True,
        capture_output=True,
    )
    om.unlink()


def prometheus_text(data: Dataset, per_chunk: int = 100) -> Iterator[bytes]:
    """The Prometheus text format with millisecond timestamps (VictoriaMetrics' import), ``per_chunk`` series at a time."""
    for i in range(0, len(data), per_chunk):
        lines: list[str] = []
        for labels, ts, vs in data[i : i + per_chunk]:
            name = dict(labels)["__name__"]
            lab = ",".join(f'{k}="{v}"' for k, v in labels if k != "__name__")
            head = f"{name}{{{lab}}} "
            lines.extend(f"{head}{v!r} {t}\n" for v, t in zip(vs.tolist(), ts.tolist(), strict=True))
        yield "".join(lines).encode()
