#!/usr/bin/env bash
# Make the eBPF tracer (`ki probe ebpf`) runnable: bcc from Debian, kernel headers
# where bcc looks for them, tracefs mounted, and bcc visible from the venv.
# Idempotent: every step checks before it acts. Needs root for the first three
# steps; without root it prints what is missing and exits 0 (the ebpf tests skip
# with the reason). Usage: scripts/setup_ebpf.sh [VENV]   (default .venv)
set -euo pipefail

VENV=${1:-.venv}
say() { echo "setup_ebpf: $*"; }

if [[ $(id -u) -ne 0 ]]; then
    say "not root: skipping apt-get, header links and tracefs (the ebpf tests will skip and say why)"
else
    # 1. bcc's Python front end and kernel headers (never PyPI's unrelated 'bcc').
    arch=$(dpkg --print-architecture)  # amd64 on the CI machine; arm64 works the same way
    if ! dpkg -s python3-bpfcc >/dev/null 2>&1 || ! dpkg -s "linux-headers-$arch" >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-bpfcc "linux-headers-$arch" >/dev/null
        say "installed python3-bpfcc linux-headers-$arch"
    fi
    # 2. bcc compiles its programs against /lib/modules/$(uname -r)/{build,source}.
    #    The running kernel may have no packaged headers; the newest Debian headers serve
    #    (the tracer's programs use only stable uprobe helpers, no kernel structs).
    kdir=/lib/modules/$(uname -r)
    hdr=$(ls -d /usr/src/linux-headers-*-"$arch" 2>/dev/null | sort -V | tail -n1 || true)
    common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n1 || true)
    if [[ -z $hdr || -z $common ]]; then
        say "no /usr/src/linux-headers-*-$arch and -common after install: cannot link headers" >&2
        exit 1
    fi
    mkdir -p "$kdir"
    [[ -e $kdir/build ]] || { ln -sfn "$hdr" "$kdir/build"; say "linked $kdir/build -> $hdr"; }
    [[ -e $kdir/source ]] || { ln -sfn "$common" "$kdir/source"; say "linked $kdir/source -> $common"; }
    # 3. uprobes are attached through tracefs.
    if [[ ! -e /sys/kernel/tracing/uprobe_events ]]; then
        mount -t tracefs nodev /sys/kernel/tracing && say "mounted tracefs on /sys/kernel/tracing"
    fi
fi

# 4. Let the venv import Debian's bcc, and nothing else from dist-packages: a
#    directory holding one symlink (bcc -> /usr/lib/python3/dist-packages/bcc) and a
#    .pth in the venv's site-packages naming that directory. Adding all of
#    dist-packages instead would shadow the venv's own numpy, cryptography, ...
if [[ -d /usr/lib/python3/dist-packages/bcc && -x $VENV/bin/python ]]; then
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    shim=$(cd "$VENV" && pwd)/bcc-system
    mkdir -p "$shim"
    [[ -L $shim/bcc ]] || ln -sfn /usr/lib/python3/dist-packages/bcc "$shim/bcc"
    if [[ ! -f $site/ki_bcc_system.pth ]] || [[ $(cat "$site/ki_bcc_system.pth") != "$shim" ]]; then
        echo "$shim" >"$site/ki_bcc_system.pth"
        say "venv sees Debian's bcc through $site/ki_bcc_system.pth -> $shim"
    fi
fi
