#!/usr/bin/env bash
# LoRA adapters (docs/lora.md): what a replica's switch between two adapter sets costs, and whether
# the queue's grouping keeps a job of alternating sets as fast as a job of one set.
#   - the switch: dp-generate on a model folder builds the components an adapter changes again
#     (adapter_switch_ms in its JSON), for each folder given (default: the tiny FLUX.1-dev and
#     Qwen-Image folders, with the golden adapters);
#   - the job: PROMPTS prompts (default 64) on the tiny FLUX.1-dev folder over `-n 2`, once all with
#     one adapter and once alternating between two, side by side with hyperfine; the ratio of the
#     median walls (goal: at most 1.1x).
#   scripts/bench/lora_switch.sh [PROMPTS=64] [RUNS=5]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${DP_BUILD_DIR:-$root/build}
n=${1:-64}
runs=${2:-5}
launch=$build/bin/dp-launch
generate=$build/bin/dp-generate
for bin in "$launch" "$generate"; do
    [[ -x $bin ]] || { echo "lora_switch.sh: $bin is not built (cmake --build build)" >&2; exit 1; }
done
command -v hyperfine >/dev/null || { echo "lora_switch.sh: needs hyperfine (apt-get install hyperfine)" >&2; exit 1; }
golden=$root/tests/data/golden/lora
flux=$root/models/tiny-random-flux-dev
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "machine: $(nproc) CPUs; fp32 on the CPU"
echo "switch (dp-generate, median of $runs):"
for pair in "$flux:$golden/flux_peft.safetensors" "$flux:$golden/flux_kohya.safetensors" \
            "$root/models/tiny-random-qwen-image:$golden/qwen_peft.safetensors"; do
    model=${pair%%:*}
    adapter=${pair#*:}
    for ((i = 0; i < runs; ++i)); do
        "$generate" --model "$model" --lora "$adapter" --steps 1 --width 32 --height 32 2>/dev/null |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["adapter_switch_ms"])'
    done | sort -g | awk -v m="$(basename "$model")" -v a="$(basename "$adapter")" \
        '{v[NR]=$1} END {printf "  %s, %s: %.1f ms\n", m, a, v[int((NR+1)/2)]}'
done

python3 - "$tmp" "$n" "$golden" <<'PY'
import json, sys
tmp, n, golden = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sets = [f"{golden}/flux_peft.safetensors", f"{golden}/flux_kohya.safetensors"]
for name, pick in (("one", lambda i: sets[0]), ("alternating", lambda i: sets[i % 2])):
    with open(f"{tmp}/{name}.jsonl", "w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": f"a red fox number {i}", "lora": pick(i)}) + "\n")
PY
flags=(--model "$flux" -n 2 --device cpu --steps 4 --width 32 --height 32 -q --overwrite)
hyperfine --style basic --runs "$runs" --export-json "$tmp/h.json" \
    -n "one set" "$launch ${flags[*]} -o $tmp/one $tmp/one.jsonl" \
    -n "alternating sets" "$launch ${flags[*]} -o $tmp/alt $tmp/alternating.jsonl" >/dev/null
python3 - "$tmp/h.json" "$n" <<'PY'
import json, sys
r = {x["command"]: x["median"] for x in json.load(open(sys.argv[1]))["results"]}
one, alt = r["one set"], r["alternating sets"]
print(f"{sys.argv[2]} prompts over -n 2: one set {one:.2f} s, alternating sets {alt:.2f} s (medians): "
      f"{alt / one:.2f}x (goal <= 1.1x)")
PY
