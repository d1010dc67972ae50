#!/usr/bin/env bash
# Newer peer servers for the benchmarks and differential tests: prometheus 3.x and
# victoria-metrics 1.1xx from Debian's unstable suite, fetched as .deb files through a private
# apt configuration and unpacked with dpkg-deb -x into a cache. Nothing is installed system-wide.
# Usage: scripts/fetch_peers.sh [DIR]  (default: build/peers). Prints the directory; idempotent.
# The binaries are then DIR/prometheus/usr/bin/prometheus and DIR/victoria-metrics/usr/bin/victoria-metrics.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(realpath -m "${1:-build/peers}")
if [[ -x $dir/prometheus/usr/bin/prometheus && -x $dir/victoria-metrics/usr/bin/victoria-metrics ]]; then
    echo "$dir"; exit 0
fi
apt_dir=$dir/apt
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$dir/debs"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian unstable main" \
    >"$apt_dir/sources.list"
opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=-"
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o "APT::Get::List-Cleanup=0"
    -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
apt-get "${opts[@]}" update -qq >&2
for pkg in prometheus victoria-metrics; do
    (cd "$dir/debs" && rm -f "${pkg}"_*.deb && apt-get "${opts[@]}" download -qq "$pkg" >&2)
    rm -rf "${dir:?}/$pkg" && mkdir -p "$dir/$pkg"
    dpkg-deb -x "$dir/debs/${pkg}"_*.deb "$dir/$pkg"
done
echo "$dir"
