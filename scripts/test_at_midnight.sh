#!/usr/bin/env bash
# Runs test files with the wall clock moved so that each starts LEAD seconds before the next UTC
# midnight (a negative LEAD: after it), to find tests and code that behave differently near a
# day, hour or minute boundary. Only the wall clock moves (scripts/wallshift.c); one pytest per
# file, so that module-level "now"s are taken close to midnight.
#
#   scripts/test_at_midnight.sh LEAD [test files...]   (default: every test file that reads the clock)
#
# Prints one line per file and exits 1 if any failed; each file's output is kept in build/midnight/.
set -uo pipefail
cd "$(dirname "$0")/.."
lead=${1:?usage: scripts/test_at_midnight.sh LEAD [test files...]}
shift
mkdir -p build/midnight
lib=build/midnight/wallshift.so
gcc -std=c11 -Wall -Wextra -Werror -O2 -shared -fPIC -o "$lib" scripts/wallshift.c -ldl || exit 2
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
    mapfile -t files < <(grep -rlE "time\.time\(\)|time_ns\(\)|datetime\.now|now\(\)" tests --include='test_*.py' | sort)
fi
failed=0
for f in "${files[@]}"; do
    now=$(date +%s)
    shift_s=$(( (now / 86400 + 1) * 86400 - now - lead ))
    out="build/midnight/$(echo "$f" | tr / _).txt"
    LD_PRELOAD="$PWD/$lib" WALLSHIFT_S=$shift_s .venv/bin/python -m pytest -q -p no:cacheprovider "$f" > "$out" 2>&1
    rc=$?
    [ $rc -eq 0 ] || failed=1
    echo "rc=$rc lead=${lead}s $f: $(tail -1 "$out")"
done
exit $failed
