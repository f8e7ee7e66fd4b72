#!/usr/bin/env bash
# Two builds of dp-launch side by side on the strategy benchmark (scripts/bench/strategies.sh):
# the runs alternate (old, new, old, new, ...) so that both see the same machine load, and each
# strategy's median s/step/prompt is reported for both, with the ratio new / old and whether the
# bytes each rank sends are the same. For checking that a refactor costs nothing.
#   scripts/bench/compare_builds.sh OLD_CHECKOUT NEW_CHECKOUT [RUNS] [MODEL] [SIZE] [STEPS]
# Each checkout must hold its own build (CHECKOUT/build, or set OLD_BUILD / NEW_BUILD).
set -euo pipefail
old=$(cd "$1" && pwd)
new=$(cd "$2" && pwd)
runs=${3:-3}
shift $(($# < 3 ? $# : 3))
old_build=${OLD_BUILD:-$old/build}
new_build=${NEW_BUILD:-$new/build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for ((i = 1; i <= runs; i++)); do
    for side in old new; do
        checkout=$old build=$old_build
        [[ $side == new ]] && checkout=$new build=$new_build
        DP_BENCH_SKIP_SETUP=1 DP_BUILD_DIR=$build "$checkout/scripts/bench/strategies.sh" "$@" >"$tmp/$side.$i"
    done
done
python3 - "$tmp" "$runs" <<'PY'
import re, statistics, sys
tmp, runs = sys.argv[1], int(sys.argv[2])
def rows(path):
    out = {}
    for line in open(path):
        m = re.match(r"^(.*?)\s{2,}(\d+)\s+(\d+\.\d+)\s+\S+x\s+(.*?)\s+(\d+) MB$", line.rstrip())
        if m:
            out[m.group(1).strip()] = (float(m.group(3)), m.group(4).strip(), int(m.group(5)))
    return out
old = [rows(f"{tmp}/old.{i}") for i in range(1, runs + 1)]
new = [rows(f"{tmp}/new.{i}") for i in range(1, runs + 1)]
print(open(f"{tmp}/new.1").readline().rstrip())
print(f"{'strategy':34} {'old s/step':>10} {'new s/step':>10} {'new/old':>8}  bytes")
for name in old[0]:
    if not all(name in r for r in old + new):
        continue
    o = statistics.median(r[name][0] for r in old)
    n = statistics.median(r[name][0] for r in new)
    same = "same" if all(r[name][1] == old[0][name][1] for r in old + new) else "DIFFER: %s vs %s" % (old[0][name][1], new[0][name][1])
    print(f"{name:34} {o:10.4f} {n:10.4f} {n / o:7.2f}x  {same}")
print(f"(medians of {runs} alternating runs each)")
PY
