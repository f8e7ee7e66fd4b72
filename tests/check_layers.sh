#!/usr/bin/env bash
# The layer rules of DESIGN.md, checked on the sources under ROOT (default: this checkout):
#   - launcher/, cli/, serve/, protocol/ and strategies/ include no LibTorch header (the launcher
#     starts in milliseconds, `dp-launch plan` needs no LibTorch, and the server runs jobs through
#     dp-launch);
#   - protocol/ includes nothing of ours but protocol/ (it is the contract both sides link);
#   - images/ includes no LibTorch header and nothing of ours but protocol/ and images/ (the
#     launcher reads input images' headers, the worker decodes them: both sides link it);
#   - runtime/parallel/ includes nothing from runtime/models/ (the parallel layer knows no model);
#   - nothing under runtime/models/ includes the communicator (models call the parallel layer,
#     never a collective);
#   - runtime/ is layered io/ <- parallel/ <- pipeline/ <- models/ <- the files at its top (worker,
#     registry, image sink): runtime/io/ includes nothing else of runtime/, runtime/parallel/ only
#     io/, runtime/pipeline/ nothing of models/, and nothing under runtime/models/ includes a file
#     at the top of runtime/.
# Exits 1 listing every violation.
set -uo pipefail
root=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
cd "$root" || exit 2
status=0
violations() {  # $1: rule, $2: pattern, folders...
    local rule=$1 pattern=$2
    shift 2
    local hits
    hits=$(grep -rnE --include='*.h' --include='*.cpp' --include='*.hpp' "^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]($pattern)" "$@" 2>/dev/null)
    if [[ -n $hits ]]; then
        echo "$rule:"
        echo "$hits" | sed 's/^/  /'
        status=1
    fi
}
violations "launcher/, cli/, serve/, protocol/ and strategies/ must not include LibTorch" \
    'ATen/|torch/|c10/|caffe2/' launcher cli serve protocol strategies
violations "protocol/ must include nothing of ours outside protocol/" \
    '(launcher|cli|strategies|runtime|shapes|training)/' protocol
violations "images/ must not include LibTorch" 'ATen/|torch/|c10/|caffe2/' images
violations "images/ must include nothing of ours outside protocol/ and images/" \
    '(launcher|cli|strategies|runtime|shapes|training)/' images
violations "runtime/parallel/ must include nothing from runtime/models/" 'runtime/models/' runtime/parallel
violations "runtime/models/ must not include the communicator" 'runtime/parallel/communicator\.h' runtime/models
violations "runtime/io/ must include nothing of runtime/ outside runtime/io/" 'runtime/(parallel|pipeline|models)/|runtime/[a-z_]+\.h' runtime/io
violations "runtime/parallel/ must include nothing of runtime/pipeline/ or a file at the top of runtime/" 'runtime/pipeline/|runtime/[a-z_]+\.h' runtime/parallel
violations "runtime/pipeline/ must include nothing from runtime/models/ or a file at the top of runtime/" 'runtime/models/|runtime/[a-z_]+\.h' runtime/pipeline
violations "runtime/models/ must not include a file at the top of runtime/" 'runtime/[a-z_]+\.h' runtime/models
if [[ $status == 0 ]]; then echo "layer rules hold under $root"; fi
exit $status
