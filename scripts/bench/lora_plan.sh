#!/usr/bin/env bash
# What a replica's LoRA switch makes again at real size, from `dp-launch plan`: a rank-16 bf16
# diffusers/PEFT adapter of every attention projection (to_q, to_k, to_v, to_out.0) of the
# transformer, written at the real width from the config-only folders' tensors.json, for FLUX.1-dev
# and SD3.5-large at tp 1, 2 and 8. Headers are read, no weights: it runs in seconds anywhere.
#   scripts/bench/lora_plan.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dp=${1:-${DP_BUILD_DIR:-$root/build}}/bin/dp-launch
[[ -x $dp ]] || { echo "lora_plan.sh: $dp is not built" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for model in flux.1-dev sd3.5-large; do
    python3 - "$root/models/$model/transformer/tensors.json" "$tmp/$model.safetensors" <<'PY'
import json, struct, sys
tensors = json.load(open(sys.argv[1]))
rank, header, offset = 16, {}, 0
for name, t in tensors.items():
    if name == "__metadata__" or not any(name.endswith(f"attn.{p}.weight") for p in ("to_q", "to_k", "to_v", "to_out.0")):
        continue
    out, inp = t["shape"]
    base = "transformer." + name[: -len(".weight")]
    for key, shape in ((base + ".lora_A.weight", [rank, inp]), (base + ".lora_B.weight", [out, rank])):
        n = shape[0] * shape[1] * 2
        header[key] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
text = json.dumps(header).encode()
with open(sys.argv[2], "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text)
    f.truncate(8 + len(text) + offset)  # zeros: plan reads the header only
PY
    for tp in 1 2 8; do
        t5=(); [[ $model == sd3.5-large ]] && t5=(--no-t5)
        line=$("$dp" plan --model "$root/models/$model" --random-weights 1 --dtype bf16 "${t5[@]}" -n "$tp" --tp "$tp" \
            --lora "$tmp/$model.safetensors" | grep -A1 "changes" | tail -1)
        echo "$model tp $tp:$line"
    done
done
