#!/usr/bin/env bash
# The launcher's peak memory while it reads a prompt file: an endless one (/dev/zero, `yes`) and
# large ones, under and over the job's limits (64 MiB, 100 000 prompt lines). --dry-run reads,
# validates and writes the job file exactly as a real job does, then starts nothing.
# Prints, for each input: its size, dp-launch's exit code, wall time and peak RSS (GNU time's %M).
#
#   scripts/bench/prompt_file_memory.sh [DP_LAUNCH]      (default: build/bin/dp-launch)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dp=${1:-${DP_BUILD_DIR:-$root/build}/bin/dp-launch}
[ -x "$dp" ] || { echo "no dp-launch at $dp (build it first, or pass its path)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "needs GNU time (/usr/bin/time): apt-get install time" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# N lines of about BYTES bytes each: "prompt I: a red circle xxx...".
lines() { awk -v n="$1" -v w="$2" 'BEGIN { pad = sprintf("%*s", w - 24, ""); gsub(/ /, "x", pad); for (i = 0; i < n; i++) printf "prompt %07d: a red circle %s\n", i, pad }'; }
lines 100000 100 >"$work/100k.txt"    # 10 MB: the most lines one job takes
lines 60000 1000 >"$work/60k-long.txt" # 60 MB of long prompts: near the most bytes one job takes
lines 2000000 100 >"$work/2m.txt"     # 200 MB: more lines than one job takes
head -c 300000000 /dev/zero >"$work/zeros.bin"  # 300 MB in one line: more bytes than one job takes

run() {  # NAME SIZE COMMAND...: one row of the table
    local name=$1 size=$2
    shift 2
    local t0 t1 rc
    t0=$(date +%s%N)
    set +e
    /usr/bin/time -f '%M' "$@" -o "$work/out" --dry-run -q --overwrite >/dev/null 2>"$work/err"
    rc=$?
    set -e
    t1=$(date +%s%N)
    # dp-launch's first line of stderr (its refusal, if any), and GNU time's peak RSS in KiB (last line).
    awk -v name="$name" -v size="$size" -v rc="$rc" -v ns=$((t1 - t0)) '
        NR == 1 { said = $0 } { last = $0 }
        END { sub(/^dp-launch: /, "", said); if (rc == 0) said = "accepted";
              gsub(/\|/, "\\|", said); if (length(said) > 70) said = substr(said, 1, 70) "...";
              printf "| %s | %s | %d | %s | %.2f s | %.1f MB |\n", name, size, rc, said, ns / 1e9, last / 1024 }' "$work/err"
}

echo "machine: $(nproc) CPUs, $(uname -sr); $("$dp" --version)"
echo
echo "| input | size | exit | dp-launch says | wall | peak RSS |"
echo "|---|---|---|---|---|---|"
run "/dev/zero" "endless" "$dp" /dev/zero
run "yes \| dp-launch -" "endless" sh -c "yes 'a red circle' | \"\$0\" \"\$@\" -" "$dp"
run "NUL bytes, one line" "$(du -h "$work/zeros.bin" | cut -f1)" "$dp" "$work/zeros.bin"
run "2 000 000 lines of 100 bytes" "$(du -h "$work/2m.txt" | cut -f1)" "$dp" "$work/2m.txt"
run "100 000 lines of 100 bytes" "$(du -h "$work/100k.txt" | cut -f1)" "$dp" "$work/100k.txt"
run "60 000 lines of 1000 bytes" "$(du -h "$work/60k-long.txt" | cut -f1)" "$dp" "$work/60k-long.txt"
