#include "strategies/model_config.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "protocol/errors.h"
#include "strategies/model_files.h"

namespace dp::strategies {
namespace {

nlohmann::json read_object(const std::string& path) {
    if (!model_file_exists(path)) throw protocol::ModelError(path + ": cannot read");
    const std::string text = read_model_file(path);  // a FIFO or device is refused, not read
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        throw protocol::ModelError(path + ": not valid JSON (" + std::string(e.what()).substr(0, 120) + ")");
    }
    if (!j.is_object()) throw protocol::ModelError(path + ": expected a JSON object");
    return j;
}

int64_t positive(const nlohmann::json& config, const std::string& key, int64_t fallback,
                 const std::string& path) {
    const auto it = config.find(key);
    if (it == config.end()) {
        if (fallback > 0) return fallback;
        throw protocol::ModelError(path + ": no \"" + key + "\"");
    }
    if (!it->is_number_integer() || it->get<int64_t>() < 1)
        throw protocol::ModelError(path + ": \"" + key + "\" is " + it->dump().substr(0, 40) +
                                   "; expected a positive integer");
    return it->get<int64_t>();
}

}  // namespace

const ParallelSpec& parallel_spec_for_model(const std::string& model_dir) {
    const std::string path = model_dir + "/model_index.json";
    const nlohmann::json index = read_object(path);
    const auto name = index.find("_class_name");
    if (name == index.end() || !name->is_string())
        throw protocol::ModelError(path + ": no \"_class_name\" naming the pipeline");
    if (const ParallelSpec* spec = find_parallel_spec(name->get<std::string>())) return *spec;
    std::string supported;
    for (const ParallelSpec* s : parallel_specs())
        supported += (supported.empty() ? "" : ", ") + s->pipeline_class;
    throw protocol::ModelError(path + ": _class_name " + name->get<std::string>() +
                               " is not supported (supported: " + supported + ")");
}

TransformerShape read_transformer_shape(const std::string& model_dir, const ParallelSpec& spec) {
    const std::string path = model_dir + "/" + spec.transformer + "/config.json";
    const nlohmann::json config = read_object(path);
    const TransformerShape& d = spec.transformer_defaults;
    TransformerShape shape;
    shape.heads = positive(config, spec.heads_key, d.heads, path);
    shape.head_dim = positive(config, spec.head_dim_key, d.head_dim, path);
    shape.layers = positive(config, spec.layers_key, d.layers, path);
    shape.patch_size = positive(config, spec.patch_size_key, d.patch_size, path);
    shape.in_channels = positive(config, spec.in_channels_key, d.in_channels, path);
    shape.sample_size = positive(config, spec.sample_size_key, d.sample_size, path);
    return shape;
}

std::string ImageSizeRule::check(int64_t pixels) const {
    const int64_t m = multiple(), max = max_side();
    if (pixels >= m && pixels <= max && pixels % m == 0) return {};
    const int64_t below = std::clamp(pixels / m * m, m, max), above = (pixels + m - 1) / m * m;
    std::string nearest = std::to_string(below);
    if (above != below && above <= max) nearest += " or " + std::to_string(above);
    return "this model makes sizes that are multiples of " + std::to_string(m) + " from " +
           std::to_string(m) + " to " + std::to_string(max) + " pixels (nearest: " + nearest + ")";
}

ImageSizeRule read_image_size_rule(const std::string& model_dir, const ParallelSpec& spec) {
    ImageSizeRule rule;
    // model_index.json's "vae": ["diffusers", "AutoencoderKL"], or [null, null] in pixel space.
    const nlohmann::json index = read_object(model_dir + "/model_index.json");
    const auto vae = index.find("vae");
    if (vae != index.end() && vae->is_array() && vae->size() == 2 && !(*vae)[1].is_null()) {
        const std::string path = model_dir + "/vae/config.json";
        const nlohmann::json config = read_object(path);
        std::size_t blocks = 4;  // diffusers' SD3 VAE: (128, 256, 512, 512)
        if (const auto it = config.find("block_out_channels"); it != config.end()) {
            if (!it->is_array() || it->empty() || it->size() > 8)
                throw protocol::ModelError(path + ": \"block_out_channels\" must be a list of 1 to 8 widths");
            blocks = it->size();
        }
        rule.vae_scale = int64_t{1} << (blocks - 1);
    }
    const std::string path = model_dir + "/" + spec.transformer + "/config.json";
    const nlohmann::json config = read_object(path);
    const TransformerShape& d = spec.transformer_defaults;
    rule.patch_size = positive(config, spec.patch_size_key, d.patch_size, path);
    // The position table's side: diffusers' SD3Transformer2DModel defaults it to 96, as the worker does.
    rule.max_patches = positive(config, "pos_embed_max_size", 96, path);
    rule.default_side = positive(config, spec.sample_size_key, d.sample_size, path) * rule.vae_scale;
    return rule;
}

}  // namespace dp::strategies
