"""``ki import``: a file in, samples visible to kql; bad files get one clear line and exit 1."""

from __future__ import annotations

import time

import pytest

from kernel_insight.cli import main
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.kql.storage import Matcher

NOW = (int(time.time()) // 60) * 60_000


def test_import_stores_samples_visible_to_kql(tmp_path, capsys):
    f = tmp_path / "dump.prom"
    f.write_text(
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",Hostname="n1"}} 61 {NOW}\n'
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",Hostname="n1"}} 62 {NOW + 15000}\n'
    )
    data = tmp_path / "data"
    assert main(["import", str(f), "--store", str(data)]) == 0
    assert "imported 2 samples of 1 series (prometheus)" in capsys.readouterr().out
    with EmbeddedStore(data) as store:
        (series,) = store.storage().select(
            [Matcher("__name__", "=", "DCGM_FI_DEV_GPU_TEMP")], NOW, NOW + 15000
        )
        assert series.values.tolist() == [61.0, 62.0]


def test_import_reports_the_bad_line(tmp_path, capsys):
    f = tmp_path / "bad.prom"
    f.write_text(f"up 1 {NOW}\nup{{a=b}} 1 {NOW}\n")
    assert main(["import", str(f), "--store", str(tmp_path / "d")]) == 1
    assert "bad.prom: line 2, column 6: expected a quoted label value" in capsys.readouterr().err


def test_import_refuses_missing_timestamps_when_asked(tmp_path, capsys):
    f = tmp_path / "now.prom"
    f.write_text("up 1\n")
    assert main(["import", str(f), "--store", str(tmp_path / "d"), "--require-timestamps"]) == 1
    assert "no timestamp" in capsys.readouterr().err


def test_import_missing_file_and_bad_utf8(tmp_path, capsys):
    assert main(["import", str(tmp_path / "nope.prom"), "--store", str(tmp_path / "d")]) == 1
    assert "cannot read" in capsys.readouterr().err
    f = tmp_path / "latin1.prom"
    f.write_bytes(b'up 1 1\nup{a="\xe9"} 1 1\n')
    assert main(["import", str(f), "--store", str(tmp_path / "d")]) == 1
    assert "line 2, column 7: not valid UTF-8" in capsys.readouterr().err


def test_ki_schema_prints_single_and_cluster_ddl(capsys):
    assert main(["schema", "--retention-samples", "9"]) == 0
    out = capsys.readouterr().out
    assert "TTL toDateTime(ts) + INTERVAL 9 DAY" in out
    assert "ON CLUSTER" not in out
    assert main(["schema", "--cluster", "prod"]) == 0
    assert "Distributed('prod'" in capsys.readouterr().out
    assert main(["schema", "--retention-spans", "-1"]) == 1
    assert "spans_days" in capsys.readouterr().err


def test_import_through_a_running_collector(tmp_path, capsys):
    # The collector's process holds the data directory; ki import then goes through remote_write.
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    data = tmp_path / "data"
    server = (
        "import uvicorn; from kernel_insight.collector import EmbeddedStore, create_app; "
        f"uvicorn.run(create_app(EmbeddedStore({str(data)!r})), host='127.0.0.1', port={port}, log_level='error')"
    )
    proc = subprocess.Popen([sys.executable, "-c", server])
    try:
        import httpx

        for _ in range(300):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        f = tmp_path / "dump.prom"
        f.write_text("".join(f'm{{i="{i % 7}"}} {i} {NOW + i}\n' for i in range(100)))
        url = f"http://127.0.0.1:{port}"
        assert main(["import", str(f), "--collector", url]) == 0
        assert "imported 100 samples of 7 series" in capsys.readouterr().out
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    with EmbeddedStore(data) as store:
        assert store.row_count("samples") == 100


def _big(path, series=50, points=400):
    with path.open("w") as f:
        for s in range(series):
            f.writelines(f'gpu_temp{{gpu="{s}"}} {p % 90} {NOW + p * 15000}\n' for p in range(points))


def test_import_streams_a_chunk_at_a_time_and_counts_every_sample(tmp_path, capsys, monkeypatch):
    import kernel_insight.collector.cli as cli

    monkeypatch.setattr(cli, "CHUNK_BYTES", 4096)  # hundreds of chunks, lines cut at every boundary
    monkeypatch.setattr(cli, "FLUSH_SAMPLES", 3000)
    f = tmp_path / "big.prom"
    _big(f)
    data = tmp_path / "data"
    assert main(["import", str(f), "--store", str(data)]) == 0
    assert "imported 20000 samples of 50 series (prometheus)" in capsys.readouterr().out
    with EmbeddedStore(data) as store:
        assert store.row_count("samples") == 20000


def test_a_bad_line_in_a_later_chunk_is_reported_with_its_line_in_the_file(tmp_path, capsys, monkeypatch):
    import kernel_insight.collector.cli as cli

    monkeypatch.setattr(cli, "CHUNK_BYTES", 4096)
    f = tmp_path / "big.prom"
    _big(f, series=5)
    with f.open("a") as out:
        out.write(f'{{"x{{y}}"}} 1 {NOW}\n')
    assert main(["import", str(f), "--store", str(tmp_path / "d")]) == 1
    assert "big.prom: line 2001, column 1: invalid metric name 'x{y}'" in capsys.readouterr().err


def test_import_reads_standard_input(tmp_path, monkeypatch, capsys):
    import io
    import sys

    text = f"# TYPE up gauge\nup 1 {NOW / 1000:.3f}\n# EOF\n".encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text)))
    assert main(["import", "-", "--store", str(tmp_path / "d")]) == 0
    assert "imported 1 samples of 1 series (openmetrics)" in capsys.readouterr().out


def test_import_shows_a_progress_bar_on_a_terminal(tmp_path):
    import os
    import pty
    import subprocess
    import sys

    f = tmp_path / "big.prom"
    _big(f, series=5, points=100)
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "kernel_insight.cli", "import", str(f), "--store", str(tmp_path / "d")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=terminal,
            timeout=120,
            env={**os.environ, "COLUMNS": "120", "TERM": "xterm"},
        )
        os.close(terminal)
        terminal = -1
        shown = b""
        while True:
            try:
                block = os.read(controller, 65536)
            except OSError:
                break
            if not block:
                break
            shown += block
    finally:
        if terminal >= 0:
            os.close(terminal)
        os.close(controller)
    assert proc.returncode == 0, shown
    assert b"imported 500 samples" in proc.stdout
    assert b"importing big.prom" in shown


def test_import_relabels_series_before_storing_them(tmp_path, capsys):
    # DCGM's exporter names the host `Hostname`; the rules give it the `host` the topology uses,
    # derive the served model from the pod name, and keep only the GPU temperature.
    f = tmp_path / "dcgm.prom"
    f.write_text(
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",Hostname="n1",pod="vllm-llama-70b-0"}} 61 {NOW}\n'
        f'DCGM_FI_DEV_POWER_USAGE{{gpu="0",Hostname="n1",pod="vllm-llama-70b-0"}} 300 {NOW}\n'
    )
    rules = tmp_path / "relabel.yml"
    rules.write_text(
        "- action: keep\n  source_labels: [__name__]\n  regex: DCGM_FI_DEV_GPU_TEMP\n"
        "- source_labels: [Hostname]\n  target_label: host\n"
        "- source_labels: [pod]\n  regex: 'vllm-(.+)-[0-9]+'\n  target_label: model\n"
        "- action: labeldrop\n  regex: Hostname|pod\n"
    )
    data = tmp_path / "data"
    assert main(["import", str(f), "--store", str(data), "--relabel-config", str(rules)]) == 0
    assert "imported 1 samples of 1 series" in capsys.readouterr().out
    with EmbeddedStore(data) as store:
        (series,) = store.storage().select([Matcher("__name__", "=~", "DCGM.*")], NOW, NOW)
    assert dict(series.labels) == {
        "__name__": "DCGM_FI_DEV_GPU_TEMP",
        "gpu": "0",
        "host": "n1",
        "model": "llama-70b",
    }
    rules.write_text("- action: hashmod\n  target_label: shard\n")
    assert main(["import", str(f), "--store", str(data), "--relabel-config", str(rules)]) == 2
    assert "hashmod requires non-zero modulus" in capsys.readouterr().err


def test_classic_histograms_import_as_bucket_series_and_native_ones_are_refused_with_the_reason(
    tmp_path, capsys
):
    f = tmp_path / "classic.prom"
    f.write_text(
        "# TYPE lat histogram\n"
        f'lat_bucket{{le="0.1"}} 3 {NOW}\n'
        f'lat_bucket{{le="+Inf"}} 5 {NOW}\n'
        f"lat_count 5 {NOW}\n"
        f"lat_sum 1.5 {NOW}\n"
    )
    data = tmp_path / "data"
    assert main(["import", str(f), "--store", str(data)]) == 0
    with EmbeddedStore(data) as store:
        buckets = store.storage().select([Matcher("__name__", "=", "lat_bucket")], NOW, NOW)
        assert [(dict(s.labels)["le"], s.values.tolist()) for s in buckets] == [
            ("+Inf", [5.0]),
            ("0.1", [3.0]),
        ]
        assert store.row_count("histograms") == 0
    capsys.readouterr()
    # A native histogram written as the OpenMetrics 2.0 draft (and promqltest) write one.
    g = tmp_path / "native.prom"
    g.write_text(
        f"lat {{count:5,sum:1.5,schema:0,zero_count:0,positive_spans:[0:1],positive_buckets:[5]}} {NOW}\n"
    )
    assert main(["import", str(g), "--store", str(tmp_path / "d2")]) == 1
    err = capsys.readouterr().err
    assert "native.prom: line 1, column 5: invalid value: a native histogram" in err
    assert "send it by remote_write" in err


def test_insert_samples_sets_the_insert_size_and_refuses_zero(tmp_path, capsys, monkeypatch):
    from kernel_insight.collector import cli
    from kernel_insight.collector.clickhouse.store import Store

    sizes: list[int] = []
    real = Store.insert_samples

    def counted(self, batch, **kw):
        sizes.append(len(batch))
        return real(self, batch, **kw)

    monkeypatch.setattr(Store, "insert_samples", counted)
    monkeypatch.setattr(cli, "CHUNK_BYTES", 64)  # a few lines per chunk
    f = tmp_path / "five.prom"
    f.write_text("".join(f'up{{i="{i}"}} 1 {NOW + i}\n' for i in range(5)))
    assert main(["import", str(f), "--store", str(tmp_path / "d"), "--insert-samples", "2"]) == 0
    assert "imported 5 samples of 5 series" in capsys.readouterr().out
    assert sum(sizes) == 5
    assert max(sizes) < 5  # more than one insert
    with pytest.raises(SystemExit) as exc:
        main(["import", str(f), "--insert-samples", "0"])
    assert exc.value.code == 2
    assert (
        "argument --insert-samples: expected a whole number of samples >= 1, got '0'"
        in capsys.readouterr().err
    )
