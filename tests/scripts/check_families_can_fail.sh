#!/usr/bin/env bash
# The family check must catch a family named outside its places: in a scratch copy of the sources,
# name one family at a time in a shared file and expect check_families.sh to fail naming the file.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src=$(cd "$here/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fails=0
try() {  # $1: file to append a line to, $2: the line, $3: the family the report must name
    rm -rf "$scratch/tree" && mkdir -p "$scratch/tree"
    for d in launcher cli protocol strategies runtime; do cp -r "$src/$d" "$scratch/tree/"; done
    printf '%s\n' "$2" >>"$scratch/tree/$1"
    if out=$("$here/check_families.sh" "$scratch/tree"); then
        echo "not caught: $2 in $1"
        fails=1
    elif ! grep -qE "^  $1:" <<<"$out" || ! grep -qE "^$3: [1-9]" <<<"$out"; then
        echo "caught, but the report does not name $1 under $3: $out"
        fails=1
    fi
}
# The real tree is expected to pass; a violation there is reported by the check's own test.
try launcher/job.cpp 'static const char* kFamily = "sd3";' sd3
try strategies/model_config.cpp 'bool is_flux(const std::string& f) { return f == "flux-schnell"; }' flux
try runtime/pipeline/family_pipeline.cpp '#include "runtime/models/qwen_image/qwen_image_vae.h"' qwen-image
try cli/plan_command.cpp 'const char* kClass = "QwenImagePipeline";' qwen-image
# A comment may name a family.
rm -rf "$scratch/tree" && mkdir -p "$scratch/tree"
for d in launcher cli protocol strategies runtime; do cp -r "$src/$d" "$scratch/tree/"; done
printf '%s\n' '// as FluxPipeline does' >>"$scratch/tree/launcher/job.cpp"
if "$here/check_families.sh" "$scratch/tree" | grep -q "^  launcher/job.cpp"; then
    echo "a comment naming a family was counted"
    fails=1
fi
[[ $fails == 0 ]] && echo "a family named outside its places is caught and named"
exit $fails
