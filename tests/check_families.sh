#!/usr/bin/env bash
# Note [a family in one place] (strategies/family.h), checked on the sources under ROOT (default:
# this checkout): a model family is named in code only in its facts file
# (strategies/families/<family>.cpp), its folder (runtime/models/<family>/) and the two registries
# (strategies/families/registry.cpp, runtime/pipeline_registry.cpp). For each family it counts the
# files outside those that name it (its id as a string, its pipeline class, its C++ classes and
# facts function, an include of its folder), comments left out, and exits 1 listing them.
# docs/models.md ("Adding a family") says what a new family touches.
set -uo pipefail
root=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
cd "$root" || exit 2
# A named exception, with its reason: FLUX.1's published MagCache ratios are a preset of the
# --cache syntax (mag_ratios=flux), which protocol/ parses and the records write as numbers.
exceptions=("flux protocol/step_cache_setting.cpp")

# id|folder|facts file|pattern (extended regex)
families=(
    'sd3|sd3|sd3|"sd3"|StableDiffusion3Pipeline|Sd3Pipeline|Sd3Transformer|sd3_family|models/sd3/'
    'flux|flux|flux|"flux"|"flux-schnell"|FluxPipeline|FluxTransformer|flux_family|models/flux/'
    'flux-fill|flux|flux|"flux-fill"|FluxFillPipeline|flux_fill_family'
    'flux-kontext|flux|flux|"flux-kontext"|FluxKontextPipeline|flux_kontext_family'
    'qwen-image|qwen_image|qwen_image|"qwen-image"|QwenImagePipeline|QwenImageTransformer|qwen_image_family|models/qwen_image/'
    'qwen-image-edit|qwen_image|qwen_image|"qwen-image-edit"|QwenImageEditPipeline|qwen_image_edit_family'
    'qwen-image-edit-plus|qwen_image|qwen_image|"qwen-image-edit-plus"|QwenImageEditPlusPipeline|qwen_image_edit_plus_family'
    'z-image|z_image|z_image|"z-image"|ZImagePipeline|ZImageTransformer|z_image_family|models/z_image/'
    'flux2-klein|flux2|flux2|"flux2-klein"|"flux2-klein-base"|Flux2KleinPipeline|Flux2Transformer|flux2_klein_family|models/flux2/'
    'flux2-dev|flux2|flux2|"flux2-dev"|Flux2Pipeline\b|flux2_dev_family'
)
# Code only: each file once with its // comments cut (a line that is a comment becomes blank), in
# a scratch tree that one grep a family then reads whole.
code=$(mktemp -d)
trap 'rm -rf "$code"' EXIT
mapfile -t files < <(find cli launcher protocol strategies runtime \( -name '*.cpp' -o -name '*.h' \) 2>/dev/null | sort)
for d in $(printf '%s\n' "${files[@]}" | xargs -r -n1 dirname | sort -u); do mkdir -p "$code/$d"; done
[[ ${#files[@]} -gt 0 ]] && awk -v out="$code" '{ sub(/\/\/.*$/, ""); print > (out "/" FILENAME) }' "${files[@]}"
status=0
for entry in "${families[@]}"; do
    IFS='|' read -r id folder facts pattern <<<"$entry"
    pattern=${entry#*|*|*|}
    outside=()
    while IFS= read -r file; do
        case $file in
            strategies/families/"$facts".cpp | strategies/families/registry.cpp | runtime/pipeline_registry.cpp) continue ;;
            runtime/models/"$folder"/*) continue ;;
        esac
        skip=0
        for e in "${exceptions[@]}"; do [[ $e == "$id $file" ]] && skip=1; done
        [[ $skip == 1 ]] && continue
        outside+=("$file")
    done < <(cd "$code" && grep -rlE -- "$pattern" . 2>/dev/null | sed 's|^\./||' | sort)
    echo "$id: ${#outside[@]} file(s) outside its facts file, its folder and the registries"
    for f in "${outside[@]}"; do
        echo "  $f: $(grep -noE -- "$pattern" "$code/$f" | head -3 | tr '\n' ' ')"
        status=1
    done
done
exit $status
