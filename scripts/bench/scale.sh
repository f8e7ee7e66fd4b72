#!/usr/bin/env bash
# The launcher side of a large job: N prompts of the built-in shapes model's grammar at 1 step on
# 2 ranks (dp-launch -n 2 --steps 1 -q). Reports the launcher's own peak memory (getrusage of the
# dp-launch process itself through DP_LAUNCH_USAGE_FILE, never its ranks'), the wall time, and the
# time the launcher spends outside the ranks: before the first rank starts, after the last one
# ends, and its own CPU time while they run (from /proc, sampled every 20 ms). Then opens the
# gallery's index.html and some of its pages in headless Chromium and checks that every image on
# them loaded (skipped, with the reason, where no Chromium is installed).
#
#   scripts/bench/scale.sh [N] [OUT]     (default: 100000 prompts; OUT: a temporary folder, removed)
# Goals (issue 18): peak <= 50 MB, outside the ranks <= 2 % of the wall time.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${DP_BUILD_DIR:-$root/build}
n=${1:-100000}
dp=$build/bin/dp-launch
for b in dp-launch dp-worker dp-adherence; do
    [ -x "$build/bin/$b" ] || { echo "no $build/bin/$b (build it first)" >&2; exit 1; }
done
if [ -n "${2:-}" ]; then
    work=$2
    mkdir -p "$work"
else
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
fi
rm -rf "$work/out"
"$build/bin/dp-adherence" --print-held-out "$n" >"$work/prompts.txt"

echo "machine: $(nproc) CPUs, $(uname -sr); $("$dp" --version | head -1)"
echo "job: $(wc -l <"$work/prompts.txt") prompts, dp-launch -n 2 --steps 1 -q -o OUT PROMPTS"
python3 - "$dp" "$work" <<'PY'
import json, os, subprocess, sys, time

dp, work = sys.argv[1], sys.argv[2]
tick = os.sysconf("SC_CLK_TCK")
env = dict(os.environ, DP_LAUNCH_USAGE_FILE=f"{work}/usage.json")


def cpu_s(pid):  # utime + stime of the process itself (not its children), in seconds
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / tick


def ranks(pid):  # the dp-worker children alive now
    alive = []
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = f.read().split()
    except OSError:
        return alive
    for kid in kids:
        try:
            with open(f"/proc/{kid}/comm") as f:
                if f.read().strip() == "dp-worker":
                    alive.append(kid)
        except OSError:
            pass
    return alive


t0 = time.monotonic()
p = subprocess.Popen([dp, "-n", "2", "--steps", "1", "-q", "-o", f"{work}/out", f"{work}/prompts.txt"],
                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
first = last = None  # when ranks were first and last seen alive
cpu_first = cpu_last = 0.0
while p.poll() is None:
    now = time.monotonic()
    try:
        alive = ranks(p.pid)
        cpu = cpu_s(p.pid)
    except OSError:
        break
    if alive:
        if first is None:
            first, cpu_first = now, cpu
        last, cpu_last = now, cpu
    time.sleep(0.02)
out = p.communicate()[0].decode(errors="replace")
t_end = time.monotonic()
print(out.strip())
if p.returncode != 0 or first is None:
    sys.exit(f"dp-launch exited with {p.returncode}" + ("" if first else " before any rank started"))
usage = json.load(open(f"{work}/usage.json"))
wall = t_end - t0
before, after, during = first - t0, t_end - last, cpu_last - cpu_first
outside = before + after + during
print(f"wall {wall:.1f} s; launcher peak RSS {usage['max_rss_kb'] / 1024:.1f} MB, "
      f"CPU {usage['user_s'] + usage['system_s']:.2f} s")
print(f"outside the ranks {outside:.2f} s = {100 * outside / wall:.2f} % of the wall time "
      f"(before the ranks {before:.2f} s, after them {after:.2f} s, its CPU while they ran {during:.2f} s)")
goal = usage["max_rss_kb"] <= 50 * 1024 and outside <= 0.02 * wall
print("goals (peak <= 50 MB, outside <= 2 %): " + ("met" if goal else "NOT met"))
PY

out=$work/out
pages=$(ls "$out" | grep -c '^\(index\|page-[0-9]*\)\.html$' || true)
echo "gallery: $pages page(s), $(du -ch --apparent-size "$out"/*.html | tail -1 | cut -f1) of HTML"
# The index, the second and the last page, and one in the middle.
check=(index.html)
for k in 2 $(((pages + 1) / 2)) "$pages"; do
    [[ $k -ge 2 && -f $out/page-$k.html ]] && [[ ! " ${check[*]} " == *" page-$k.html "* ]] && check+=("page-$k.html")
done
failed=0
for page in "${check[@]}"; do
    t0=$(date +%s%N)
    rc=0
    counted=$("$root/tests/scripts/page_images.sh" "$out/$page") || rc=$?
    [[ $rc -eq 77 ]] && { echo "SKIP the browser check: $counted"; exit 0; }
    t1=$(date +%s%N)
    read -r items images loaded <<<"$counted"
    ok=yes
    [[ $loaded != - && $loaded -eq $images && $images -gt 0 ]] || { ok=NO; failed=1; }
    printf '%s: %s cards, %s of %s images loaded, %.1f s in Chromium: %s\n' "$page" "$items" "$loaded" "$images" \
        "$(((t1 - t0) / 1000000))e-3" "$ok"
done
[[ $failed -eq 0 ]] || { echo "FAIL: a page did not load every image"; exit 1; }
