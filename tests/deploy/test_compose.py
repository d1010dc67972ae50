"""deploy/compose: valid against the compose specification's schema, every mounted path exists,
every flag passed to ki collector exists, Alertmanager's configuration checks."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from deployutil import DEPLOY, collector_flags, unknown_flags

COMPOSE = DEPLOY / "compose" / "compose.yaml"
CHECK_JSONSCHEMA = Path(sys.executable).with_name("check-jsonschema")


def _schema_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_compose_file_matches_the_compose_specification():
    done = _schema_check(COMPOSE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_schema_check_catches_a_mistake(tmp_path):
    bad = yaml.safe_load(COMPOSE.read_text())
    bad["services"]["collector"]["restart"] = {"always": True}
    (tmp_path / "compose.yaml").write_text(yaml.safe_dump(bad))
    assert _schema_check(tmp_path / "compose.yaml").returncode != 0


def test_every_mounted_path_exists_and_the_collector_flags_exist():
    spec = yaml.safe_load(COMPOSE.read_text())
    for name, service in spec["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), (name, source)
        build = service.get("build")
        if build:
            assert (COMPOSE.parent / build["context"] / build["dockerfile"]).is_file()
    (command,) = spec["services"]["collector"]["command"]
    argv = shlex.split(command.replace("$$", "$"))
    assert argv[:3] == ["exec", "ki", "collector"]
    assert unknown_flags(argv[3:], collector_flags()) == []


def test_alertmanager_configuration_checks():
    if shutil.which("amtool") is None:
        pytest.skip("amtool is not installed (Debian package prometheus-alertmanager)")
    done = subprocess.run(
        ["amtool", "check-config", str(DEPLOY / "compose" / "alertmanager.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_grafana_is_provisioned_with_the_collector_and_the_dashboards():
    ds = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/kernel-insight.yaml").read_text())
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "https://collector:8470"
    assert source["secureJsonData"]["httpHeaderValue1"].startswith("Bearer $__file{/run/secrets/")
    providers = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/kernel-insight.yaml").read_text())
    spec = yaml.safe_load(COMPOSE.read_text())
    mounts = dict(v.split(":")[:2] for v in spec["services"]["grafana"]["volumes"])
    assert mounts["../grafana/dashboards"] == providers["providers"][0]["options"]["path"]
