// The registry of pipelines: a model family (its id in strategies' facts, which name its pipeline
// class) -> the code that loads it. A new model family adds one line here, and its facts file in
// strategies/families/ (Note [a family in one place]).
#include <ATen/core/Tensor.h>

#include <utility>

#include "runtime/io/errors.h"
#include "runtime/models/flux/flux_pipeline.h"
#include "runtime/models/flux2/flux2_pipeline.h"
#include "runtime/models/qwen_image/qwen_image_pipeline.h"
#include "runtime/models/sd3/sd3_pipeline.h"
#include "runtime/models/z_image/z_image_pipeline.h"
#include "runtime/pipeline/pipeline.h"
#include "strategies/model_config.h"

namespace dp::runtime {
namespace {

using Loader = std::unique_ptr<DiffusionPipeline> (*)(const PipelineOptions&, const ParallelContext&);

template <typename P>
std::unique_ptr<DiffusionPipeline> load_as(const PipelineOptions& o, const ParallelContext& parallel) {
    return P::load(o, parallel);
}

const std::pair<const char*, Loader> kPipelines[] = {
    {"sd3", &load_as<Sd3Pipeline>},
    {"qwen-image", &load_as<QwenImagePipeline>},
    {"flux", &load_as<FluxPipeline>},
    {"flux-fill", &load_as<FluxPipeline>},
    {"flux-kontext", &load_as<FluxPipeline>},
    {"qwen-image-edit", &load_as<QwenImagePipeline>},
    {"qwen-image-edit-plus", &load_as<QwenImagePipeline>},
    {"z-image", &load_as<ZImagePipeline>},
    {"flux2-klein", &load_as<Flux2Pipeline>},
    {"flux2-dev", &load_as<Flux2Pipeline>},
};

}  // namespace

GenerateResult DiffusionPipeline::generate(const GenerateRequest& request) const {
    return std::move(generate_batch({request}).front());
}

std::unique_ptr<DiffusionPipeline> load_pipeline(const PipelineOptions& options,
                                                 const ParallelContext& parallel) {
    // The family model_index.json names (a ModelError naming the file and the supported classes).
    const strategies::ParallelSpec& spec =
        options.model ? *options.model->spec : strategies::parallel_spec_for_model(options.model_dir);
    for (const auto& [family, load] : kPipelines)
        if (spec.family == family) return load(options, parallel);
    throw InternalError(spec.display_name +
                        " has facts in strategies/families/ but no pipeline in this build");
}

}  // namespace dp::runtime
