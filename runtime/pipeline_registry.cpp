// The registry of pipelines: model_index.json's _class_name -> the family that loads it. A new
// model family adds one line here (and its parallel spec in strategies/).
#include <ATen/core/Tensor.h>

#include <utility>

#include "runtime/io/config_json.h"
#include "runtime/io/errors.h"
#include "runtime/models/flux/flux_pipeline.h"
#include "runtime/models/qwen_image/qwen_image_pipeline.h"
#include "runtime/models/sd3/sd3_pipeline.h"
#include "runtime/pipeline/pipeline.h"

namespace dp::runtime {
namespace {

using Loader = std::unique_ptr<DiffusionPipeline> (*)(const PipelineOptions&, const ParallelContext&);

template <typename P>
std::unique_ptr<DiffusionPipeline> load_as(const PipelineOptions& o, const ParallelContext& parallel) {
    return P::load(o, parallel);
}

const std::pair<const char*, Loader> kPipelines[] = {
    {"StableDiffusion3Pipeline", &load_as<Sd3Pipeline>},
    {"QwenImagePipeline", &load_as<QwenImagePipeline>},
    {"FluxPipeline", &load_as<FluxPipeline>},
};

}  // namespace

GenerateResult DiffusionPipeline::generate(const GenerateRequest& request) const {
    return std::move(generate_batch({request}).front());
}

std::unique_ptr<DiffusionPipeline> load_pipeline(const PipelineOptions& options,
                                                 const ParallelContext& parallel) {
    const std::string path = options.model_dir + "/model_index.json";
    const std::string cls = ConfigJson::from_file(path).string("_class_name", "");
    std::string supported;
    for (const auto& [name, load] : kPipelines) {
        if (cls == name) return load(options, parallel);
        supported += (supported.empty() ? "" : ", ") + std::string(name);
    }
    throw ModelError(path + ": pipeline class '" + cls + "' is not supported (supported: " + supported + ")");
}

}  // namespace dp::runtime
