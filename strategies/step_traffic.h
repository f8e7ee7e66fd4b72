#pragma once
// Note [step traffic]: the bytes each rank sends per denoising step, for one prompt, by collective
// kind, in closed form from the family's parallel spec, the transformer's shape and the mesh
// degrees: what `dp-launch plan` prints, and what the strategy tests measure a job against
// (docs/strategies.md, "Strategy guide"). Pure: no files, no processes.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "strategies/mesh.h"
#include "strategies/model_config.h"
#include "strategies/parallel_spec.h"

namespace dp::strategies {

// One prompt's denoising step, as the traffic depends on it.
struct StepTrafficInput {
    int64_t image_tokens = 0;  // the image's patches, before padding to the ranks that split them
    int64_t text_tokens = 0;   // plan_text_tokens' (a split text stream: at most this many)
    int branches = 1;  // guidance branches in one batch: 2 when guided and not split by --cfg-parallel
    int64_t element_bytes = 2;  // the run's dtype: 4 for fp32, else 2
};

// Bytes per collective kind ("all_gather", "all_to_all", "all_reduce", "send") a rank sends in one
// step of one prompt; a kind with none is absent. `transformer_counts`: the transformer's tensors'
// element counts (tensor_element_counts), in which the spec's TP rules find the layers split by
// output features and gathered (AdaLN's modulations). The figures are the busiest rank's when tp x
// ulysses splits the heads unevenly (Note [uneven heads]).
std::map<std::string, int64_t> step_traffic(const ParallelSpec& spec, const TransformerShape& shape,
                                            const MeshDegrees& degrees,
                                            const std::map<std::string, int64_t>& transformer_counts,
                                            const StepTrafficInput& step);

// The text tokens the transformer attends over for a prompt of `max_sequence` tokens (its
// max_sequence_length): the T5 or Qwen2.5-VL tokens themselves (a split text stream: at most that
// many, as long as the prompt), or what the family's facts say (FamilyFacts::plan_text_tokens:
// SD3's CLIP tokens, then T5's or one standing for its zeros). `left_out`: the components the job
// does not load (components_left_out). Throws protocol::ModelError for a config that is not JSON.
int64_t plan_text_tokens(const ModelInfo& model, int64_t max_sequence,
                         const std::vector<std::string>& left_out);

}  // namespace dp::strategies
