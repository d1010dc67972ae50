#!/usr/bin/env bash
# bench/gpu/check.sh - the probes on a real NVIDIA GPU, in one command (issue 37; docs/probes.md).
#
# Needs: nvidia-smi, python3 with PyTorch built for CUDA, a C compiler, the CUDA headers (nvcc's
# toolkit, or CUDA_HOME), CUPTI (the toolkit's or PyTorch's wheel's). Optional: nvidia-ml-py
# (pynvml) for the NVML comparison, pytest for the gpu-marked tests; each missing one is named in
# the output and skipped. No network, no pip, no root: it builds into build/gpu-check (or
# $KI_CHECK_BUILD) the CUPTI probe, bench/gpu/ring_tool and the ring extension, and runs the
# checkout's Python through a linked package (nothing installed).
#
#   bench/gpu/check.sh            # about 3-6 minutes; hard limit 450 s
#
# Runs bench/gpu/check.py: a transformer block (bf16, forward + backward + SGD, KI_CHECK_STEPS=300
# steps after 50 of warm-up) plain, under the CUPTI probe and with instrument_torch's spans,
# interleaved KI_CHECK_ROUNDS=3 times; the probe's kernels against torch.profiler's; the NVML
# sampler's series, ours and dcgm-exporter's DCGM_FI_* (issue 38), against nvidia-smi; the GPM
# profiling fields (DCGM_FI_PROF_*) under bf16 GEMMs on Hopper and later, beside nvidia-smi dmon's
# GPM readings; the two gpu-marked tests. Prints the summary (also written to
# $OUT/gpu-check.json when OUT is set) and one BENCH line. Exit 0 only when every target holds:
# CUPTI step-time overhead <= 1%, kernel count equal to torch.profiler's, summed device time within
# 1%, every kernel with its launch, NVML and DCGM series within tolerance, the GPM fields there and
# plausible under load (Hopper and later), and the gpu tests passed (where they ran).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${KI_CHECK_BUILD:-$ROOT/build/gpu-check}
PY=${PYTHON:-python3}
mkdir -p "$B"
cd "$ROOT" || exit 1

fail() {
    echo "check: $*" >&2
    echo "BENCH gpu ok=0 failed=$(printf '%s' "$1" | tr -c 'A-Za-z0-9_.-' '_')"
    exit 1
}

command -v nvidia-smi >/dev/null && nvidia-smi -L || fail "no GPU (nvidia-smi -L)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$PY" -c 'import sys, torch; print("torch", torch.__version__, "cuda", torch.version.cuda); sys.exit(0 if torch.cuda.is_available() else 1)' \
    || fail "no PyTorch with a CUDA device for $PY"

# The CUDA headers: CUDA_HOME, else nvcc's toolkit, else /usr/local/cuda.
if [ -z "${CUDA_HOME:-}" ]; then
    if nvcc=$(command -v nvcc); then CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$nvcc")")"); else CUDA_HOME=/usr/local/cuda; fi
fi
export CUDA_HOME
echo "CUDA_HOME=$CUDA_HOME"
make -s -C agent/cupti OUT="$B" CUDA_HOME="$CUDA_HOME" all || fail "building libki_cupti.so.1 (cupti.h under $CUDA_HOME?)"
cc -std=c11 -O2 -Wall -Wextra -Werror -Iagent/include bench/gpu/ring_tool.c -o "$B/ring_tool" || fail "building ring_tool"

# PyTorch's own CUPTI first on the loader's path, so the probe and torch share one library.
TORCH_CUPTI=$("$PY" -c 'import os, nvidia.cuda_cupti as m; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="${TORCH_CUPTI:+$TORCH_CUPTI:}$CUDA_HOME/lib64:$CUDA_HOME/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}"

# The ring extension for this python, and the checkout as the kernel_insight package.
PYINC=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
EXT=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
if [ -f "$PYINC/Python.h" ]; then
    cc -std=c11 -O2 -shared -fPIC -Iagent/include -I"$PYINC" agent/python/ringmodule.c -o "agent/_ring$EXT" \
        || fail "building the ring extension"
else
    echo "check: no Python.h under $PYINC: the span probe and NVML comparison cannot run" >&2
fi
mkdir -p "$B/py/kernel_insight"
for f in kernel_insight/*; do ln -sfn "$ROOT/$f" "$B/py/kernel_insight/"; done
ln -sfn "$ROOT/agent" "$B/py/kernel_insight/agent"
export PYTHONPATH="$B/py${PYTHONPATH:+:$PYTHONPATH}"

started=$(date +%s)
timeout 450 "$PY" bench/gpu/check.py "$B" > "$B/gpu-check.json" || fail "bench/gpu/check.py (exit $?)"
cat "$B/gpu-check.json"
echo "check.py took $(( $(date +%s) - started )) s"
[ -n "${OUT:-}" ] && cp "$B/gpu-check.json" "$OUT/gpu-check.json"

"$PY" - "$B/gpu-check.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
k = s["kernels"]
nvml, gpm, tests = s["nvml"], s["gpm"], s["gpu_tests"]
checks = {
    "cupti_overhead": s["cupti_overhead_pct"] <= 1.0,
    "kernel_count": k["probe"] == k["torch_profiler"] and k["probe"] > 0,
    "device_time": s["device_time_diff_pct"] is not None and abs(s["device_time_diff_pct"]) <= 1.0,
    "launches": k["with_launch"] == k["probe"],
    "span_ran": s["span_overhead_pct"] is not None,
    "nvml": "skipped" in nvml or nvml["ok"],
    "gpm": "skipped" in gpm or gpm["ok"],
    "gpu_tests": "skipped" in tests or tests["ok"],
}
failed = [name for name, ok in checks.items() if not ok]
span = s["span_overhead_pct"]
print(
    f"BENCH gpu ok={int(not failed)} gpu={s['gpu'].replace(' ', '_')} cupti_overhead_pct={s['cupti_overhead_pct']:.2f} "
    f"span_overhead_pct={'na' if span is None else f'{span:.2f}'} kernels={k['probe']} "
    f"profiler_kernels={k['torch_profiler']} device_time_diff_pct={s['device_time_diff_pct']} "
    f"with_launch={k['with_launch']} nvml={'skipped' if 'skipped' in nvml else int(nvml['ok'])} "
    f"gpm={'skipped' if 'skipped' in gpm else int(gpm['ok'])} "
    f"gpu_tests={'skipped' if 'skipped' in tests else int(tests['ok'])} failed={','.join(failed) or 'none'}"
)
sys.exit(1 if failed else 0)
EOF
