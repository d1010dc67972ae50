"""The systems bench-fleet drives, each a real process on loopback with a fresh data directory:
``ki collector`` (embedded store), Prometheus 2.x (Debian) and 3.x, VictoriaMetrics 1.79 (Debian)
and 1.1xx (the newer ones from Debian's unstable suite, scripts/fetch_peers.sh)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.kql.servers import Server, free_port

__all__ = ["SYSTEMS", "System", "peers_dir"]

_PEERS = Path(__file__).resolve().parents[2] / "build" / "peers"


def peers_dir() -> Path:
    """Where scripts/fetch_peers.sh unpacked prometheus 3.x and victoria-metrics 1.1xx (fetched now if missing)."""
    if not (_PEERS / "prometheus" / "usr" / "bin" / "prometheus").exists():
        script = Path(__file__).resolve().parents[2] / "scripts" / "fetch_peers.sh"
        subprocess.run([str(script), str(_PEERS)], check=True, stdout=subprocess.DEVNULL)
    return _PEERS


class _Process(Server):
    def __init__(self, name: str, argv: list[str], base: str, ready: str, log: Path) -> None:
        self.name = name
        self.base = base
        self._start(argv, log)
        self.wait_ready(ready)

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass(frozen=True)
class System:
    """One system under test: how to start it on a data directory, and where remote_write goes."""

    name: str
    write_path: str
    start: Callable[[Path, Path], _Process]


def _ki(data: Path, log: Path, extra: tuple[str, ...] = ()) -> _Process:
    port = free_port()
    argv = [
        sys.executable, "-m", "kernel_insight.cli", "collector", "--local-dev", "--store", str(data / "store"),
        "--keys", str(data / "keys.json"), "--port", str(port), *extra,
    ]  # fmt: skip
    return _Process("ki", argv, f"http://127.0.0.1:{port}", "/api/v1/status/buildinfo", log)


def _prometheus(binary: str, name: str) -> Callable[[Path, Path], _Process]:
    def start(data: Path, log: Path) -> _Process:
        port = free_port()
        cfg = data / "prometheus.yml"
        data.mkdir(parents=True, exist_ok=True)
        cfg.write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
        argv = [
            binary, f"--storage.tsdb.path={data / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
            f"--config.file={cfg}", "--web.enable-remote-write-receiver",
        ]  # fmt: skip
        return _Process(name, argv, f"http://127.0.0.1:{port}", "/-/ready", log)

    return start


def _victoria(binary: str, name: str) -> Callable[[Path, Path], _Process]:
    def start(data: Path, log: Path) -> _Process:
        port = free_port()
        argv = [
            binary,
            f"-storageDataPath={data / 'vm'}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-search.disableCache",
        ]
        return _Process(name, argv, f"http://127.0.0.1:{port}", "/health", log)

    return start


def _systems() -> dict[str, System]:
    out = {"ki": System("ki", "/api/v1/write", _ki)}
    if shutil.which("prometheus"):
        out["prometheus-2"] = System(
            "prometheus-2", "/api/v1/write", _prometheus("prometheus", "prometheus-2")
        )
    if shutil.which("victoria-metrics"):
        out["vm-1.79"] = System("vm-1.79", "/api/v1/write", _victoria("victoria-metrics", "vm-1.79"))
    peers = _PEERS
    out["prometheus-3"] = System(
        "prometheus-3",
        "/api/v1/write",
        lambda d, log: _prometheus(str(peers_dir() / "prometheus/usr/bin/prometheus"), "prometheus-3")(
            d, log
        ),
    )
    out["vm-1.145"] = System(
        "vm-1.145",
        "/api/v1/write",
        lambda d, log: _victoria(str(peers_dir() / "victoria-metrics/usr/bin/victoria-metrics"), "vm-1.145")(
            d, log
        ),
    )
    del peers
    return out


SYSTEMS = _systems()
