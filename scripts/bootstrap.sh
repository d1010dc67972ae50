#!/usr/bin/env bash
# Idempotent set-up of everything Kernel Insight needs on a Debian/Ubuntu machine:
# system packages, kernel tracing prerequisites, and the .venv virtual environment.
# Without root it installs nothing system-wide and names exactly what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# Build tools and headers for the C extension and the native agent; prometheus
# brings promtool, a real Prometheus client the API tests drive.
# python3-bpfcc and the kernel headers serve the eBPF tracer (scripts/setup_ebpf.sh);
# victoria-metrics is the second server make bench-kql compares kql with;
# chromium is the browser the web UI's tests and make bench-ui drive (docs/ui.md).
APT_PACKAGES=(build-essential pkg-config libzstd-dev libsodium-dev zstd python3-venv prometheus victoria-metrics prometheus-alertmanager chromium
    python3-bpfcc "linux-headers-$(dpkg --print-architecture)")

missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    if [[ $(id -u) -eq 0 ]]; then
        echo "bootstrap: installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "bootstrap: missing system packages: ${missing[*]}" >&2
        echo "bootstrap: run as root, or: sudo apt-get install ${missing[*]}" >&2
        exit 1
    fi
fi

# The virtual environment, rebuilt when pyproject.toml or setup.py change.
PY=${PYTHON:-python3}
stamp=.venv/.ki-stamp
want=$(cat pyproject.toml setup.py | sha256sum | cut -c1-16)
if [[ ! -x .venv/bin/python || ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
    echo "bootstrap: preparing .venv"
    [[ -x .venv/bin/python ]] || "$PY" -m venv .venv
    .venv/bin/python -m pip install -q --disable-pip-version-check -U pip setuptools wheel
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
    echo "$want" >"$stamp"
fi

# eBPF prerequisites (header links, tracefs) and Debian's bcc visible from the venv.
scripts/setup_ebpf.sh .venv
