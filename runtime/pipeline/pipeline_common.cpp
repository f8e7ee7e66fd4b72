#include "runtime/pipeline/pipeline_common.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "protocol/schedulers.h"
#include "runtime/io/config_json.h"
#include "runtime/io/errors.h"
#include "runtime/parallel/device_mapping.h"
#include "runtime/pipeline/family_pipeline.h"
#include "strategies/model_config.h"

namespace dp::runtime {

void check_max_sequence_length(int value, int max) {
    if (value < 1 || value > max)
        throw ModelError("max_sequence_length " + std::to_string(value) + ": must be 1 to " +
                         std::to_string(max));
}

void require_loadable(const PipelineOptions& o, const strategies::ParallelSpec& spec) {
    const std::string index = o.model_dir + "/model_index.json";
    const std::string cls = ConfigJson::from_file(index).string("_class_name", "");
    if (cls != spec.pipeline_class)
        throw ModelError(index + ": pipeline class '" + cls + "' is not " + spec.pipeline_class);
    if (o.offload && (o.trainable || o.device_map))
        throw ModelError(
            "offload: not with training or device_map (each component would be built again per use)");
    const DeviceMapping* dm = o.device_map.get();
    if (dm && (dm->transformer_blocks.empty() || device_of(o, "transformer") != o.device))
        throw ModelError("device_map: the run's device must be that of transformer block 0");
    strategies::ModelNeeds needs;
    needs.variant = o.variant;
    needs.no_t5 = o.no_t5;
    needs.random_weights = o.random_weights.has_value();
    for (const auto& [component, file] : o.component_files) needs.from_files.insert(component);
    const std::vector<std::string> problems = strategies::model_folder_problems(o.model_dir, spec, needs);
    if (problems.empty()) return;
    std::string text = problems.front();
    for (std::size_t i = 1; i < problems.size(); ++i) text += "\n" + problems[i];
    throw ModelError(text);
}

std::string read_scheduler_config(const PipelineOptions& o) {
    const std::string path = o.model_dir + "/scheduler/scheduler_config.json";
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ModelError("cannot read " + path);
    std::ostringstream text;
    text << in.rdbuf();
    const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw ModelError(path + ": not a JSON object");
    protocol::ResolvedScheduler own;
    if (const std::string why = protocol::resolve_scheduler(j, {}, {}, own); !why.empty())
        throw ModelError(path + ": " + why);
    return text.str();
}

strategies::ModelInfo model_info_of(const PipelineOptions& o) {
    return o.model ? *o.model : strategies::read_model_info(o.model_dir);
}

at::Device device_of(const PipelineOptions& o, const std::string& component) {
    return o.device_map ? o.device_map->device_of(component) : o.device;
}

namespace {

WeightStore open_single_file(const std::string& path, const strategies::ParallelSpec& spec,
                             const std::string& component, at::ScalarType dtype, at::Device device,
                             bool keep_quantized) {
    if (strategies::is_gguf_file(path)) {
        const std::shared_ptr<strategies::GgufFile> file = strategies::GgufFile::open(path);
        return WeightStore::open_single_file(
            file, strategies::read_single_file_layout(*file, spec, component), dtype, device, keep_quantized);
    }
    const std::shared_ptr<SafetensorsFile> file = SafetensorsFile::open(path);
    return WeightStore::open_single_file(file, strategies::read_single_file_layout(*file, spec, component),
                                         dtype, device);
}

}  // namespace

WeightStore open_weights(const PipelineOptions& o, const std::string& component, uint64_t salt,
                         at::Device device) {
    const auto file = o.component_files.find(component);
    WeightStore w = o.random_weights
                        ? WeightStore::random(*o.random_weights * 1000003ULL + salt, o.dtype, device)
                    : file != o.component_files.end()
                        ? open_single_file(file->second, *model_info_of(o).spec, component, o.dtype, device,
                                           o.keep_quantized)
                        : WeightStore::open_folder(o.model_dir + "/" + component, o.dtype, device, o.variant);
    if (o.adapters) w.set_deltas(o.adapters->deltas(component));
    if (o.quantize == "int8") {
        const strategies::ModelInfo model = model_info_of(o);
        if (component == model.spec->transformer) w.set_int8_layers(model.spec->int8_layers);
    }
    return w;
}

std::string component_class(const ConfigJson& index, const char* key) {
    if (!index.has(key)) return {};
    const auto& entry = index.raw()[key];
    if (!entry.is_array() || entry.size() != 2) index.fail(key, "must be [library, class] or [null, null]");
    if (entry[1].is_null()) return {};
    if (!entry[1].is_string()) index.fail(key, "must name its class as a string");
    return entry[1].get<std::string>();
}

std::pair<int, int> checked_size(const DiffusionPipeline& pipeline, const GenerateRequest& r) {
    const int width = r.width ? r.width : pipeline.default_width();
    const int height = r.height ? r.height : pipeline.default_height();
    const int multiple = pipeline.size_multiple();
    if (width <= 0 || height <= 0 || width % multiple != 0 || height % multiple != 0)
        throw ModelError("image size " + std::to_string(width) + "x" + std::to_string(height) +
                         ": width and height must be positive multiples of " + std::to_string(multiple) +
                         " for this model");
    if (r.steps < 1) throw ModelError("steps must be at least 1");
    return {width, height};
}

void finish_results(std::vector<GenerateResult>& results, const at::Tensor& images, const at::Tensor& latents,
                    int steps) {
    const at::Tensor image = (images / 2 + 0.5).clamp(0, 1).to(at::kCPU, at::kFloat);
    const at::Tensor pixels = (image.permute({0, 2, 3, 1}) * 255).round().to(at::kByte);
    const at::Tensor final_latents = latents.to(at::kCPU, at::kFloat);
    const at::Tensor finite = at::isfinite(final_latents).flatten(1).all(1);
    for (std::size_t k = 0; k < results.size(); ++k) {
        const int64_t i = static_cast<int64_t>(k);
        GenerateResult& out = results[k];
        out.image = pixels[i].contiguous();
        out.latents = final_latents.narrow(0, i, 1).contiguous();
        if (!finite[i].item<bool>())
            out.error = "the final latents are not finite (NaN or inf) after " + std::to_string(steps) +
                        " steps: the model's weights or these settings produce no image (check the weights, "
                        "and try --dtype fp32)";
    }
}

at::Tensor pack_latents(const at::Tensor& x) {
    const int64_t b = x.size(0), ch = x.size(1), h = x.size(2), w = x.size(3);
    return x.view({b, ch, h / 2, 2, w / 2, 2})
        .permute({0, 2, 4, 1, 3, 5})
        .reshape({b, (h / 2) * (w / 2), ch * 4});
}

at::Tensor unpack_latents(const at::Tensor& x, int64_t h, int64_t w) {
    const int64_t b = x.size(0), ch = x.size(2) / 4;
    return x.view({b, h / 2, w / 2, ch, 2, 2}).permute({0, 3, 1, 4, 2, 5}).reshape({b, ch, h, w});
}

Conditioning kept_tokens(const at::Tensor& hidden, const std::vector<int64_t>& lengths, int64_t drop) {
    const int64_t n = static_cast<int64_t>(lengths.size());
    const int64_t width = *std::max_element(lengths.begin(), lengths.end());
    Conditioning e;
    e.warnings.assign(lengths.size(), "");
    e.text = at::zeros({n, width, hidden.size(-1)}, hidden.options());
    e.mask = at::zeros({n, width}, at::TensorOptions().dtype(at::kLong).device(hidden.device()));
    for (int64_t k = 0; k < n; ++k) {
        const int64_t len = lengths[static_cast<std::size_t>(k)];
        e.text[k].narrow(0, 0, len).copy_(hidden[k].narrow(0, drop, len));
        e.mask[k].narrow(0, 0, len).fill_(1);
    }
    return e;
}

}  // namespace dp::runtime
