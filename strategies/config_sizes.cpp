#include "strategies/config_sizes.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "strategies/config_file.h"
#include "strategies/family.h"
#include "strategies/model_sizes.h"
#include "strategies/text.h"

namespace dp::strategies {
namespace {

using nlohmann::json;

// CLIPTextModel(WithProjection): token and position embeddings, pre-LN layers (q, k, v, out and a
// two-layer MLP, with biases; two LayerNorms), the final LayerNorm, and the bias-free projection.
double clip_parameters(const json& c, bool projection) {
    const double h = config_number(c, "hidden_size", 512), mlp = config_number(c, "intermediate_size", 2048);
    const double layer =
        4 * linear_parameters(h, h) + linear_parameters(h, mlp) + linear_parameters(mlp, h) + 4 * h;
    return config_number(c, "vocab_size", 49408) * h + config_number(c, "max_position_embeddings", 77) * h +
           config_number(c, "num_hidden_layers", 12) * layer + 2 * h +
           (projection ? linear_parameters(h, config_number(c, "projection_dim", 512), false) : 0);
}

// T5EncoderModel: the token embedding once (tied), bias-free attention and feed-forward (gated: two
// input matrices), RMS norms with a weight only, the relative position bias in the first layer.
double t5_parameters(const json& c) {
    const double d = config_number(c, "d_model", 512), heads = config_number(c, "num_heads", 8);
    const double inner = heads * config_number(c, "d_kv", 64), ff = config_number(c, "d_ff", 2048);
    const auto act = c.find("feed_forward_proj");
    const bool gated = act != c.end() && act->is_string() && starts_with(act->get<std::string>(), "gated-");
    const double layer = 4 * d * inner + (gated ? 3 : 2) * d * ff + 2 * d;
    return config_number(c, "vocab_size", 32128) * d + config_number(c, "num_layers", 6) * layer +
           config_number(c, "relative_attention_num_buckets", 32) * heads + d;
}

// AutoencoderKL's decoder: conv_in, the mid block (two ResNets and, unless turned off, one
// attention), the up blocks (layers_per_block + 1 ResNets each, an upsampling conv but in the last),
// the output norm and conv; and post_quant_conv when used.
double vae_decoder_parameters(const json& c) {
    std::vector<double> ch;
    for (const json& x : c.value("block_out_channels", json::array({64}))) {
        if (!x.is_number() || x.get<double>() < 1 || x.get<double>() > 1e6)
            throw std::invalid_argument("block_out_channels");
        ch.push_back(x.get<double>());
    }
    if (ch.empty()) throw std::invalid_argument("block_out_channels");
    const double per = config_number(c, "layers_per_block", 1),
                 latent = config_number(c, "latent_channels", 4);
    const auto conv = [](double i, double o, double k) { return i * o * k * k + o; };
    const auto resnet = [&](double i, double o) {
        return 2 * i + conv(i, o, 3) + 2 * o + conv(o, o, 3) + (i != o ? conv(i, o, 1) : 0);
    };
    const double top = ch.back();
    const bool attention = c.value("mid_block_add_attention", true);
    double n = conv(latent, top, 3) + 2 * resnet(top, top) +
               (attention ? 2 * top + 4 * linear_parameters(top, top) : 0);
    double previous = top;
    for (std::size_t i = 0; i < ch.size(); ++i) {
        const double o = ch[ch.size() - 1 - i];
        n += resnet(previous, o) + per * resnet(o, o) + (i + 1 < ch.size() ? conv(o, o, 3) : 0);
        previous = o;
    }
    n += 2 * ch.front() + conv(ch.front(), config_number(c, "out_channels", 3), 3);
    return n + (c.value("use_post_quant_conv", true) ? conv(latent, latent, 1) : 0);
}

// Qwen2.5-VL's language model (its config's text_config, or the config itself): the token
// embedding, layers of q, k, v (with biases, k and v over the key-value heads), o, a gated MLP
// and two RMS norms, and the final norm.
double qwen2_language_parameters(const json& config) {
    const auto nested = config.find("text_config");
    const json& c = nested != config.end() && nested->is_object() ? *nested : config;
    const double h = config_number(c, "hidden_size", 3584),
                 inter = config_number(c, "intermediate_size", 18944);
    const double heads = std::max(1.0, config_number(c, "num_attention_heads", 28));
    const double kv = config_number(c, "num_key_value_heads", 4) * std::floor(h / heads);
    const double layer =
        linear_parameters(h, h) + 2 * linear_parameters(h, kv) + h * h + 3 * h * inter + 2 * h;
    return config_number(c, "vocab_size", 152064) * h + config_number(c, "num_hidden_layers", 28) * layer + h;
}

bool unloaded(const ParallelSpec& spec, const std::string& component, const std::string& prefix) {
    return std::any_of(spec.unloaded_tensors.begin(), spec.unloaded_tensors.end(),
                       [&](const auto& u) { return u.first == component && u.second == prefix; });
}

// The count for `class_name` with `config`, of what the pipeline loads; nullopt: not known here.
std::optional<double> class_parameters(const std::string& class_name, const json& config,
                                       const ParallelSpec& spec, const std::string& component) {
    if (component == spec.transformer) {
        const auto count = facts_of(spec).transformer_parameters;
        return count ? std::optional<double>(count(config)) : std::nullopt;
    }
    if (class_name == "CLIPTextModel" || class_name == "CLIPTextModelWithProjection")
        return clip_parameters(config, class_name == "CLIPTextModelWithProjection");
    if (class_name == "T5EncoderModel") return t5_parameters(config);
    // The encoders no pipeline here loads are not counted: they must be among the unloaded ones.
    if (class_name == "AutoencoderKL" && unloaded(spec, component, "encoder.") &&
        unloaded(spec, component, "quant_conv."))
        return vae_decoder_parameters(config);
    if (class_name == "Qwen2_5_VLForConditionalGeneration" && unloaded(spec, component, "visual.") &&
        unloaded(spec, component, "lm_head."))
        return qwen2_language_parameters(config);
    return std::nullopt;
}

}  // namespace

double config_number(const nlohmann::json& config, const char* key, double fallback) {
    const auto it = config.find(key);
    if (it == config.end() || it->is_null()) return fallback;
    if (!it->is_number() || !(it->get<double>() >= 0 && it->get<double>() <= 1e15))
        throw std::invalid_argument(std::string(key) + " is not a size");
    return it->get<double>();
}

std::optional<int64_t> config_parameters(const std::string& model_dir, const ParallelSpec& spec,
                                         const std::string& component) {
    try {
        const json index = read_config_object_if_present(model_dir + "/model_index.json");
        const auto entry = index.find(component);
        if (entry == index.end() || !entry->is_array() || entry->size() != 2 || !(*entry)[1].is_string())
            return std::nullopt;
        const json config = read_config_json(model_dir + "/" + component + "/config.json");
        if (!config.is_object()) return std::nullopt;
        const std::optional<double> n =
            class_parameters((*entry)[1].get<std::string>(), config, spec, component);
        if (!n || !(*n >= 0)) return std::nullopt;
        return static_cast<int64_t>(std::min(*n, 4e18));
    } catch (const std::exception&) {
        return std::nullopt;  // the model's own checks say what is wrong with its configs
    }
}

std::vector<ComponentSize> random_weight_component_sizes(const std::string& model_dir,
                                                         const ParallelSpec& spec, int64_t element_bytes,
                                                         const std::vector<std::string>& left_out) {
    std::vector<ComponentSize> out;
    for (const std::string& name : spec.components) {
        if (std::find(left_out.begin(), left_out.end(), name) != left_out.end()) continue;
        if (const std::optional<int64_t> n = config_parameters(model_dir, spec, name)) {
            const double bytes = static_cast<double>(*n) * static_cast<double>(element_bytes);
            out.push_back({name, static_cast<int64_t>(std::min(bytes, 4e18)), {}});
            continue;
        }
        // Its files, as a job with its weights counts them: pipeline_component_sizes of it alone.
        std::vector<std::string> others = left_out;
        for (const std::string& other : spec.components)
            if (other != name) others.push_back(other);
        try {
            for (ComponentSize& c : pipeline_component_sizes(model_dir, spec, element_bytes, "", others))
                out.push_back({c.name, c.bytes, {}});
        } catch (const std::exception&) {
            // Neither: left out of the estimate.
        }
    }
    return out;
}

}  // namespace dp::strategies
