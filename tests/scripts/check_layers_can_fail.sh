#!/usr/bin/env bash
# The layer check must catch a violation of each rule: in a scratch copy of the sources, break
# one rule at a time and expect check_layers.sh to fail naming it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/can_fail.sh"
try() {  # $1: file to append an include to, $2: the include, $3: text the report must contain
    copy_sources "$scratch/tree"
    printf '#include %s\n' "$2" >>"$scratch/tree/$1"
    expect_caught "$2 in $1" "$3" "$here/check_layers.sh" "$scratch/tree"
}
"$here/check_layers.sh" "$src" >/dev/null || { echo "the real tree already breaks a rule"; exit 1; }
try launcher/job.cpp '<ATen/ATen.h>' "must not include LibTorch"
try strategies/mesh.h '<torch/torch.h>' "must not include LibTorch"
try protocol/errors.h '"launcher/errors.h"' "protocol/ must include nothing"
try runtime/parallel/attention.cpp '"runtime/models/common/layers.h"' "runtime/parallel/ must include nothing"
try runtime/models/sd3/sd3_transformer.cpp '"runtime/parallel/communicator.h"' "must not include the communicator"
try runtime/io/weights.cpp '"runtime/parallel/parallel_linear.h"' "runtime/io/ must include nothing"
try runtime/parallel/guidance.cpp '"runtime/pipeline/pipeline.h"' "runtime/parallel/ must include nothing of runtime/pipeline/"
try runtime/pipeline/pipeline_common.cpp '"runtime/models/common/layers.h"' "runtime/pipeline/ must include nothing"
try runtime/models/flux/flux_pipeline.cpp '"runtime/worker.h"' "must not include a file at the top of runtime/"
[[ $fails == 0 ]] && echo "every layer rule is caught when broken"
exit $fails
