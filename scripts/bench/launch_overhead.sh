#!/usr/bin/env bash
# Launch overhead, side by side in one run: dp-launch vs torchrun starting 4 trivial ranks.
# Prints median wall time, peak RSS of each launcher process, and the ratios.
#
#   scripts/bench/launch_overhead.sh [RUNS]      (default 30 runs each, after 3 warm-ups)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${DP_BUILD_DIR:-$root/build}
venv=${DP_VENV:-$HOME/.cache/dp-launch/venv}
runs=${1:-30}
setup_log=$(mktemp)
"$root/scripts/setup.sh" >"$setup_log" 2>&1 || { cat "$setup_log" >&2; exit 1; }

dp="$build/bin/dp-launch -n 4 -- true"
tr="$venv/bin/torchrun --nproc-per-node 4 --no-python true"
out=$(mktemp -d)
echo "machine: $(nproc) CPUs, $(uname -sr); torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
hyperfine -N --warmup 3 --runs "$runs" --export-json "$out/times.json" -n dp-launch "$dp" -n torchrun "$tr" >"$out/hyperfine.txt"

# Peak RSS of the launcher process itself (GNU time's %M: the largest resident set, in KiB).
peak() { for _ in 1 2 3 4 5; do /usr/bin/time -f '%M' "$@" 2>&1 >/dev/null | tail -n 1; done | sort -n | tail -n 1; }
dp_rss=$(peak $dp)
tr_rss=$(peak $tr)

python3 - "$out/times.json" "$dp_rss" "$tr_rss" <<'PY'
import json, statistics, sys
results = {r["command"]: r for r in json.load(open(sys.argv[1]))["results"]}
dp, tr = results["dp-launch"], results["torchrun"]
dp_med, tr_med = statistics.median(dp["times"]), statistics.median(tr["times"])
dp_rss, tr_rss = int(sys.argv[2]), int(sys.argv[3])
print(f"{'launcher':<12}{'median wall':>14}{'min':>12}{'max':>12}{'peak RSS':>12}")
for name, r, rss in (("dp-launch", dp, dp_rss), ("torchrun", tr, tr_rss)):
    print(f"{name:<12}{statistics.median(r['times'])*1e3:>11.2f} ms{r['min']*1e3:>9.2f} ms{r['max']*1e3:>9.2f} ms{rss/1024:>9.1f} MB")
print(f"dp-launch is {tr_med/dp_med:.0f}x faster to start 4 ranks, with {tr_rss/dp_rss:.0f}x less peak RSS "
      f"(target: >= 100x faster, < 10 MB)")
PY
rm -rf "$out"
