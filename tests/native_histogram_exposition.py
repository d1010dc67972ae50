"""A native histogram exposition target for tests with a real Prometheus: client_model's
MetricFamily (transcribed from metrics.proto field for field, built by Google's protobuf
library), served varint-delimited over HTTP on 127.0.0.1 as Prometheus scrapes it."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal.encoder import _VarintBytes

from kernel_insight.run import free_port

__all__ = [
    "PROTO_TYPE",
    "MetricFamily",
    "delimited",
    "free_port",
    "remote_write_config",
    "serve",
    "start_prometheus",
    "stop_prometheus",
]

F = descriptor_pb2.FieldDescriptorProto
PROTO_TYPE = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"


def _metric_family() -> Any:
    fd = descriptor_pb2.FileDescriptorProto(
        name="ki_test_client_model.proto", package="io.prometheus.client", syntax="proto2"
    )
    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED

    def message(name: str, fields: list[tuple[str, int, int, int, str | None]]) -> Any:
        m = fd.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name
        return m

    message("LabelPair", [("name", 1, F.TYPE_STRING, opt, None), ("value", 2, F.TYPE_STRING, opt, None)])
    message("BucketSpan", [("offset", 1, F.TYPE_SINT32, opt, None), ("length", 2, F.TYPE_UINT32, opt, None)])
    span = ".io.prometheus.client.BucketSpan"
    message(
        "Histogram",
        [
            ("sample_count", 1, F.TYPE_UINT64, opt, None),
            ("sample_sum", 2, F.TYPE_DOUBLE, opt, None),
            ("schema", 5, F.TYPE_SINT32, opt, None),
            ("zero_threshold", 6, F.TYPE_DOUBLE, opt, None),
            ("zero_count", 7, F.TYPE_UINT64, opt, None),
            ("negative_span", 9, F.TYPE_MESSAGE, rep, span),
            ("negative_delta", 10, F.TYPE_SINT64, rep, None),
            ("positive_span", 12, F.TYPE_MESSAGE, rep, span),
            ("positive_delta", 13, F.TYPE_SINT64, rep, None),
        ],
    )
    message(
        "Metric",
        [
            ("label", 1, F.TYPE_MESSAGE, rep, ".io.prometheus.client.LabelPair"),
            ("histogram", 7, F.TYPE_MESSAGE, opt, ".io.prometheus.client.Histogram"),
        ],
    )
    mf = message(
        "MetricFamily",
        [
            ("name", 1, F.TYPE_STRING, opt, None),
            ("help", 2, F.TYPE_STRING, opt, None),
            ("type", 3, F.TYPE_ENUM, opt, ".io.prometheus.client.MetricType"),
            ("metric", 4, F.TYPE_MESSAGE, rep, ".io.prometheus.client.Metric"),
        ],
    )
    del mf
    kind = fd.enum_type.add(name="MetricType")
    for i, n in enumerate(("COUNTER", "GAUGE", "SUMMARY", "UNTYPED", "HISTOGRAM")):
        kind.value.add(name=n, number=i)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("io.prometheus.client.MetricFamily"))


MetricFamily = _metric_family()


def delimited(mf: Any) -> bytes:
    """One MetricFamily as the protobuf exposition sends it: its length as a varint, then it."""
    raw = mf.SerializeToString()
    return bytes(_VarintBytes(len(raw))) + raw


def serve(body: Callable[[], bytes]) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 answering every GET with ``body()`` as a protobuf exposition."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            payload = body()
            self.send_response(200)
            self.send_header("Content-Type", PROTO_TYPE)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def remote_write_config(target: ThreadingHTTPServer, collector_url: str, token_file: Path) -> dict[str, Any]:
    """Prometheus scraping ``target`` every second and remote-writing native histograms to ki collector."""
    return {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {"job_name": "nh", "static_configs": [{"targets": [f"127.0.0.1:{target.server_address[1]}"]}]}
        ],
        "remote_write": [
            {
                "url": f"{collector_url}/api/v1/write",
                "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                "send_native_histograms": True,
                "queue_config": {"batch_send_deadline": "1s"},
            }
        ],
    }


def start_prometheus(
    tmp_path: Path,
    config: dict[str, Any],
    port: int,
    binary: str | Path = "prometheus",
    tsdb: str = "prom",
) -> subprocess.Popen[str]:
    """Debian's ``prometheus`` (or ``binary``) with native histograms on, its TSDB in
    ``tmp_path/<tsdb>``, on 127.0.0.1."""
    path = tmp_path / "prometheus.yml"
    path.write_text(json.dumps(config))
    return subprocess.Popen(
        [
            str(binary),
            f"--config.file={path}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--storage.tsdb.path={tmp_path / tsdb}",
            "--enable-feature=native-histograms",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop_prometheus(prom: subprocess.Popen[str]) -> None:
    prom.terminate()
    try:
        prom.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        prom.kill()
        prom.communicate(timeout=10)
