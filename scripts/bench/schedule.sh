#!/usr/bin/env bash
# The dynamic schedule against the static split on an uneven prompt file (docs/strategies.md, "Schedules"):
# N prompts of the built-in model, the first eighth of them at 4x the steps (a block of costly
# prompts, as when a file gathers its high-quality prompts in one part), over 2 ranks. Both
# schedules run side by side (hyperfine when installed, else alternating runs), and the script
# prints:
#   - the cost model's figures from `dp-launch plan` (static, dynamic and ideal in cost units);
#   - the median wall time of each schedule, and dynamic / static;
#   - the median makespan of the ranks' generation (the busiest rank's sum of its images' ms, from
#     the manifest: what the schedule changes, without start-up and loading), dynamic / static, and
#     both against the ideal (every image's ms summed, over the 2 ranks).
# Goal (issue 18): dynamic <= 0.8x static and within 10 % of the ideal.
#   scripts/bench/schedule.sh [PROMPTS=64] [STEPS=8] [RUNS=5]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${DP_BUILD_DIR:-$root/build}
n=${1:-64}
steps=${2:-8}
runs=${3:-5}
launch=$build/bin/dp-launch
[[ -x $launch ]] || { echo "schedule.sh: $launch is not built (cmake --build build --target dp-launch dp-worker)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prompts=$tmp/uneven.jsonl
python3 - "$prompts" "$n" "$steps" <<'PY'
import json, sys
path, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
colours = ["red", "green", "blue", "yellow", "orange", "purple"]
shapes = ["circle", "square", "triangle", "star", "ring"]
with open(path, "w") as f:
    for i in range(n):
        p = {"prompt": f"a {colours[i % 6]} {shapes[i % 5]} on a plain background"}
        if i < n // 8:
            p["steps"] = 4 * steps
        f.write(json.dumps(p) + "\n")
PY
flags=(-n 2 --device cpu --steps "$steps")
echo "machine: $(nproc) CPUs; $n prompts of the built-in model, the first $((n / 8)) at $((4 * steps)) steps," \
    "the rest at $steps; 2 ranks; $runs runs each"
"$launch" plan "${flags[@]}" "$prompts" | sed -n '/^schedules:/,/^  runs:/p'
# One run of a schedule into its folder; its manifest is kept as manifest.K (K counts from 0).
{
    echo '#!/usr/bin/env bash'
    echo 'set -euo pipefail'
    printf '%q ' "$launch" "${flags[@]}" -q --overwrite --schedule
    echo '"$1" -o "$(dirname "$0")/$1/out" '"$(printf '%q' "$prompts")"' >/dev/null'
    echo 'd=$(dirname "$0")/$1; cp "$d/out/manifest.jsonl" "$d/manifest.$(ls "$d" | grep -c "^manifest\.")"'
} >"$tmp/run.sh"
chmod +x "$tmp/run.sh"
mkdir -p "$tmp/static" "$tmp/dynamic"
if command -v hyperfine >/dev/null; then
    hyperfine -N --warmup 1 --runs "$runs" --export-json "$tmp/hyperfine.json" \
        -n static "$tmp/run.sh static" -n dynamic "$tmp/run.sh dynamic" >&2
    python3 - "$tmp/hyperfine.json" >"$tmp/wall" <<'PY'
import json, statistics, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(r["command"], statistics.median(r["times"]))
PY
else
    : >"$tmp/wall.raw"
    for ((i = 0; i <= runs; i++)); do  # run 0 warms up, as hyperfine's --warmup 1
        for s in static dynamic; do
            start=$(date +%s.%N)
            "$tmp/run.sh" "$s"
            end=$(date +%s.%N)
            ((i > 0)) && echo "$s $(echo "$end - $start" | bc -l)" >>"$tmp/wall.raw"
        done
    done
    python3 - "$tmp/wall.raw" >"$tmp/wall" <<'PY'
import statistics, sys
t = {}
for line in open(sys.argv[1]):
    s, v = line.split()
    t.setdefault(s, []).append(float(v))
for s in ("static", "dynamic"):
    print(s, statistics.median(t[s]))
PY
fi
python3 - "$tmp" <<'PY'
import glob, json, statistics, sys
tmp = sys.argv[1]
wall = dict((l.split()[0], float(l.split()[1])) for l in open(f"{tmp}/wall"))
def spans(schedule):
    paths = sorted(glob.glob(f"{tmp}/{schedule}/manifest.*"), key=lambda p: int(p.rsplit(".", 1)[1]))
    out = []
    for path in paths[1:]:  # the first is the warm-up
        busy, total = {}, 0.0
        for line in open(path):
            r = json.loads(line)
            busy[r["rank"]] = busy.get(r["rank"], 0) + r["ms"]
            total += r["ms"]
        out.append((max(busy.values()) / 1000, total / 1000 / 2))
    return out
st, dy = spans("static"), spans("dynamic")
ms, md = statistics.median(s for s, _ in st), statistics.median(s for s, _ in dy)
ideal_s, ideal_d = statistics.median(i for _, i in st), statistics.median(i for _, i in dy)
# Each run against its own ideal (every image's time over 2 ranks), so that a slower run is not
# counted as a worse schedule.
over_s = statistics.median(s / i - 1 for s, i in st)
over_d = statistics.median(s / i - 1 for s, i in dy)
print(f"wall time (median): static {wall['static']:.2f} s, dynamic {wall['dynamic']:.2f} s, "
      f"dynamic/static {wall['dynamic'] / wall['static']:.2f}x")
print(f"generation makespan (median, busiest rank): static {ms:.2f} s, dynamic {md:.2f} s, "
      f"dynamic/static {md / ms:.2f}x")
print(f"ideal (every image's time over 2 ranks, median): static's runs {ideal_s:.2f} s, dynamic's {ideal_d:.2f} s; "
      f"makespan over the ideal: static {100 * over_s:+.1f} %, dynamic {100 * over_d:+.1f} %")
PY
