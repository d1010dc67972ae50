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
# prometheus-node-exporter gives make bench-fleet the real page its targets replicate;
# chromium is the browser the web UI's tests and make bench-ui drive (docs/ui.md).
# valgrind (callgrind) counts the instructions make bench-cupti reports per record.
APT_PACKAGES=(build-essential valgrind pkg-config libzstd-dev libsodium-dev zstd python3-venv prometheus victoria-metrics prometheus-alertmanager prometheus-node-exporter chromium
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

# The strict editable install is a tree of links to the files that existed when it ran
# (build/__editable__.*, docs/architecture.md "Packaging"): a module added, removed or renamed since
# needs a re-install to be importable as kernel_insight.*. Cheap to check (names only, no contents),
# a few seconds to redo, so every make target (they all run this script) keeps the tree current.
tree_stamp=build/.ki-editable-stamp
# The SDK is its own distribution (sdk/pyproject.toml) installed the same way; its link tree and
# egg-info land inside sdk/ (sdk/build, sdk/*.egg-info), which the names below leave out.
tree_want=$( { cat pyproject.toml setup.py sdk/pyproject.toml
    find kernel_insight agent api collector kql rules sdk -type f -not -path '*/__pycache__/*' \
        -not -path 'agent/bin/*' -not -path 'sdk/build/*' -not -path 'sdk/*.egg-info/*' \
        -not -name '*.so' -not -name '*.pyc' | LC_ALL=C sort; } | sha256sum | cut -c1-16)

# The virtual environment, rebuilt when pyproject.toml, setup.py or sdk/pyproject.toml change. The
# server distribution depends on kernel-insight-sdk: both are named in one pip command, so pip takes
# the SDK from ./sdk (never from the package index).
PY=${PYTHON:-python3}
stamp=.venv/.ki-stamp
want=$(cat pyproject.toml setup.py sdk/pyproject.toml | sha256sum | cut -c1-16)
if [[ ! -x .venv/bin/python || ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
    echo "bootstrap: preparing .venv"
    [[ -x .venv/bin/python ]] || "$PY" -m venv .venv
    .venv/bin/python -m pip install -q --disable-pip-version-check -U pip setuptools wheel
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ./sdk -e '.[dev]' \
        --config-settings editable_mode=strict
    echo "$want" >"$stamp"
    mkdir -p build && echo "$tree_want" >"$tree_stamp"
fi

if ! compgen -G 'build/__editable__.kernel_insight-*/kernel_insight' >/dev/null \
    || ! compgen -G 'sdk/build/__editable__.kernel_insight_sdk-*/kernel_insight/sdk' >/dev/null \
    || [[ ! -f $tree_stamp || $(cat "$tree_stamp") != "$tree_want" ]]; then
    echo "bootstrap: refreshing the editable install (modules added or removed)"
    # Its output is setuptools' long notice about the link tree: shown only when it fails.
    if ! out=$(.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
        -e ./sdk -e . --config-settings editable_mode=strict 2>&1); then
        echo "$out" >&2
        exit 1
    fi
    echo "$tree_want" >"$tree_stamp"
fi

# eBPF prerequisites (header links, tracefs) and Debian's bcc visible from the venv.
scripts/setup_ebpf.sh .venv

# Prometheus 3.5 and VictoriaMetrics 1.1xx, the newer peers of kql's differential tests and
# benchmarks (docs/kql.md), from Debian's unstable suite, unpacked under build/peers (nothing
# installed system-wide; a no-op once there). Without the archive the set-up goes on and the tests
# that need them skip, naming this script.
if ! scripts/fetch_peers.sh >/dev/null; then
    echo "bootstrap: could not fetch the newer peers (scripts/fetch_peers.sh); their tests will skip" >&2
fi
