#!/usr/bin/env bash
# The family check must catch a family named outside its places: in a scratch copy of the sources,
# name one family at a time in a shared file and expect check_families.sh to fail naming the file
# under that family. A comment naming a family is not counted.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/can_fail.sh"
try() {  # $1: file to append a line to, $2: the line, $3: the family the report must name
    copy_sources "$scratch/tree"
    printf '%s\n' "$2" >>"$scratch/tree/$1"
    expect_caught "$2 in $1" "$3: 1 file(s) outside"$'\n'"  $1:" "$here/check_families.sh" "$scratch/tree"
}
try launcher/job.cpp 'static const char* kFamily = "sd3";' sd3
try strategies/model_config.cpp 'bool is_flux(const std::string& f) { return f == "flux-schnell"; }' flux
try runtime/pipeline/family_pipeline.cpp '#include "runtime/models/qwen_image/qwen_image_vae.h"' qwen-image
try cli/plan_command.cpp 'const char* kClass = "QwenImagePipeline";' qwen-image
copy_sources "$scratch/tree"
printf '%s\n' '// as FluxPipeline does' >>"$scratch/tree/launcher/job.cpp"
if "$here/check_families.sh" "$scratch/tree" | grep -q "^  launcher/job.cpp"; then
    echo "a comment naming a family was counted"
    fails=1
fi
[[ $fails == 0 ]] && echo "a family named outside its places is caught and named"
exit $fails
