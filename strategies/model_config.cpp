#include "strategies/model_config.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "protocol/errors.h"
#include "strategies/config_file.h"
#include "strategies/family.h"
#include "strategies/model_files.h"

namespace dp::strategies {
namespace {

// A config that must be a JSON object (the one reader, config_file.h).
nlohmann::json read_object(const std::string& path) {
    nlohmann::json j = read_config_json(path);
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
    if (!spec.width_key.empty() && !config.contains(spec.head_dim_key)) {
        const int64_t width = positive(config, spec.width_key, d.heads * d.head_dim, path);
        if (width % shape.heads != 0)
            throw protocol::ModelError(path + ": \"" + spec.heads_key + "\" (" + std::to_string(shape.heads) +
                                       ") must divide \"" + spec.width_key + "\" (" + std::to_string(width) +
                                       ")");
        shape.head_dim = width / shape.heads;
    }
    shape.layers = positive(config, spec.layers_key, d.layers, path);
    for (const auto& [key, fallback] : spec.more_layers_keys)
        shape.more_layers += positive(config, key, fallback, path);
    shape.layers += shape.more_layers;
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
        if (spec.vae_scale_key == "temperal_downsample") {
            // AutoencoderKLQwenImage: 2^len(temperal_downsample), diffusers' default three.
            std::size_t downsamples = 3;
            if (const auto it = config.find("temperal_downsample"); it != config.end()) {
                if (!it->is_array() || it->size() > 7)
                    throw protocol::ModelError(
                        path + ": \"temperal_downsample\" must be a list of up to 7 booleans");
                downsamples = it->size();
            }
            rule.vae_scale = int64_t{1} << downsamples;
        } else {
            std::size_t blocks = 4;  // diffusers' SD3 VAE: (128, 256, 512, 512)
            if (const auto it = config.find("block_out_channels"); it != config.end()) {
                if (!it->is_array() || it->empty() || it->size() > 8)
                    throw protocol::ModelError(path +
                                               ": \"block_out_channels\" must be a list of 1 to 8 widths");
                blocks = it->size();
            }
            rule.vae_scale = int64_t{1} << (blocks - 1);
        }
    }
    const std::string path = model_dir + "/" + spec.transformer + "/config.json";
    const nlohmann::json config = read_object(path);
    const TransformerShape& d = spec.transformer_defaults;
    rule.patch_size =
        spec.packed_patch ? spec.packed_patch : positive(config, spec.patch_size_key, d.patch_size, path);
    // The position table's side (SD3Transformer2DModel's pos_embed_max_size, 96 by default, as the
    // worker reads it), or the family's fixed limit.
    rule.max_patches = spec.max_patches_key.empty()
                           ? spec.max_patches
                           : positive(config, spec.max_patches_key, spec.max_patches, path);
    rule.default_side = positive(config, spec.sample_size_key, d.sample_size, path) * rule.vae_scale;
    return rule;
}

}  // namespace dp::strategies

namespace dp::strategies {
namespace {

std::string or_list(const std::vector<std::string>& items) {
    std::string out;
    for (std::size_t i = 0; i < items.size(); ++i)
        out += (i == 0 ? "" : i + 1 == items.size() ? " or " : ", ") + items[i];
    return out;
}

// The class model_index.json names for `key`: empty for [null, null] or an absent key. Throws
// ModelError for an entry of another shape.
std::string component_class(const nlohmann::json& index, const std::string& key, const std::string& path) {
    const auto it = index.find(key);
    if (it == index.end()) return {};
    if (!it->is_array() || it->size() != 2)
        throw protocol::ModelError(path + ": \"" + key + "\" must be [library, class] or [null, null]");
    if ((*it)[1].is_null()) return {};
    if (!(*it)[1].is_string())
        throw protocol::ModelError(path + ": \"" + key + "\" must name its class as a string");
    return (*it)[1].get<std::string>();
}

// The problems of one component's folder: its config, tokenizer files and weights.
void check_component_files(const std::string& dir, const ComponentRule& rule, const ModelNeeds& needs,
                           std::vector<std::string>& problems) {
    const auto need_file = [&](const std::string& file) {
        try {
            check_model_file(dir + "/" + file);
        } catch (const protocol::ModelError& e) {
            problems.push_back(e.what());
        }
    };
    switch (rule.files) {
        case ComponentRule::kScheduler:
            need_file("scheduler_config.json");
            return;
        case ComponentRule::kBpeTokenizer:
            if (!model_file_exists(dir + "/tokenizer.json")) {
                need_file("vocab.json");
                need_file("merges.txt");
            } else {
                need_file("tokenizer.json");
            }
            return;
        case ComponentRule::kT5Tokenizer:
            // The SentencePiece model the worker's T5 tokenizer reads, or the tokenizer.json it is
            // rebuilt from (transformers 5 saves T5's tokenizer as tokenizer.json alone).
            if (model_file_exists(dir + "/spiece.model") || !model_file_exists(dir + "/tokenizer.json"))
                need_file("spiece.model");
            else
                need_file("tokenizer.json");
            return;
        case ComponentRule::kProcessor:
            need_file("preprocessor_config.json");
            return;
        case ComponentRule::kModel:
            break;
    }
    try {
        check_model_file(dir + "/config.json");  // names a symlink whose blob is missing
        read_object(dir + "/config.json");
    } catch (const protocol::ModelError& e) {
        problems.push_back(e.what());
    }
    // Weights that are not read from the folder: random ones, or a component's single file.
    if (needs.random_weights || needs.from_files.count(dir.substr(dir.rfind('/') + 1))) return;
    const std::set<std::string> variants = weight_variants(dir);
    if (variants.empty() && model_file_exists(dir + "/tensors.json")) return;  // config-only: said elsewhere
    try {
        const ComponentWeights weights = find_component_weights(dir, needs.variant);
        check_model_file(weights.index.empty() ? weights.file : weights.index);
    } catch (const protocol::ModelError& e) {
        problems.push_back(e.what());
    }
}

// A text encoder's width against the transformer's (`rule`): a problem naming both when they
// differ. A missing encoder config is reported with its folder.
void check_width(const std::string& model_dir, const WidthRule& rule, const nlohmann::json& config,
                 const std::string& path, std::vector<std::string>& problems) {
    const std::string encoder_path = model_dir + "/" + rule.component + "/config.json";
    try {
        const nlohmann::json encoder_config = read_object(encoder_path);
        const auto nested = rule.nested ? encoder_config.find(rule.nested) : encoder_config.end();
        const nlohmann::json& encoder =
            nested != encoder_config.end() && nested->is_object() ? *nested : encoder_config;
        const int64_t joint = positive(config, rule.joint_key, rule.joint_fallback, path);
        const int64_t width = positive(encoder, rule.key, rule.fallback, encoder_path);
        const std::string times = rule.times == 1 ? "" : " (x " + std::to_string(rule.times) + ")";
        if (width * rule.times != joint)
            problems.push_back(encoder_path + ": \"" + rule.key + "\" is " + std::to_string(width) + times +
                               " but the transformer's " + rule.joint_key + " is " + std::to_string(joint) +
                               (rule.why ? std::string(" (") + rule.why + ")" : std::string()) + "; " +
                               rule.advice);
    } catch (const protocol::ModelError& e) {
        if (model_file_exists(encoder_path))
            problems.push_back(e.what());  // a missing one is reported already
    }
}

// The transformer's config against the rest: dual-attention blocks within the blocks, T5's width.
void check_transformer_config(const std::string& model_dir, const ParallelSpec& spec, bool t5,
                              std::vector<std::string>& problems) {
    const std::string path = model_dir + "/" + spec.transformer + "/config.json";
    nlohmann::json config;
    int64_t layers = 0;
    try {
        config = read_object(path);
        layers = positive(config, spec.layers_key, spec.transformer_defaults.layers, path);
    } catch (const protocol::ModelError&) {
        return;  // reported with its folder
    }
    if (const auto it = config.find("dual_attention_layers"); it != config.end() && !it->is_null()) {
        std::set<int64_t> seen;
        bool ok = it->is_array();
        for (const auto& v : ok ? *it : nlohmann::json::array()) {
            ok = ok && v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < layers &&
                 seen.insert(v.get<int64_t>()).second;
        }
        if (!ok)
            problems.push_back(path + ": \"dual_attention_layers\" is " + it->dump().substr(0, 60) +
                               "; expected a list of distinct block indices from 0 to " +
                               std::to_string(layers - 1));
    }
    for (const WidthRule& rule : facts_of(spec).widths)
        if (!rule.t5 || t5) check_width(model_dir, rule, config, path, problems);
}

}  // namespace

namespace {

// Whether `model_dir` is its family's variant (ParallelSpec::variant_key false or absent in
// variant_config).
bool is_variant(const std::string& model_dir, const ParallelSpec& spec) {
    if (spec.variant_key.empty()) return false;
    const std::string path =
        model_dir + "/" +
        (spec.variant_config.empty() ? spec.transformer + "/config.json" : spec.variant_config);
    const nlohmann::json config = read_object(path);
    const auto it = config.find(spec.variant_key);
    if (it == config.end() || it->is_null()) return true;
    if (!it->is_boolean())
        throw protocol::ModelError(path + ": \"" + spec.variant_key + "\" is " + it->dump().substr(0, 40) +
                                   "; expected true or false");
    return !it->get<bool>();
}

}  // namespace

// Note [a model's own defaults]: a model folder may hold generation_defaults.json, a JSON object of
// call arguments by diffusers' names (the rows marked model_default: "num_inference_steps", the
// family's guidance keys, "max_sequence_length") that its maker found best: a small model trained for few
// steps may want another guidance scale than its family's. They replace the family's defaults only; a flag, a
// DP_* variable or a prompt record's key still wins, and the manifest records what ran. diffusers
// does not read the file, so the same image there needs the same values passed. Keys beginning
// with "_" are comments; any other key, or a value out of range, is refused naming the file.
protocol::FamilyArguments call_arguments_for_model(const std::string& model_dir, const ParallelSpec& spec) {
    protocol::FamilyArguments a = family_arguments(family_for_model(model_dir, spec));
    const std::string path = model_dir + "/" + kGenerationDefaultsFile;
    if (!model_file_exists(path)) return a;
    const nlohmann::json defaults = read_object(path);
    std::string accepted;
    for (const protocol::FamilyArgument& arg : a.all())
        if (arg.row->model_default && !arg.ignored)
            accepted += (accepted.empty() ? "" : ", ") + std::string(arg.row->name);
    for (const auto& [key, value] : defaults.items()) {
        if (!key.empty() && key.front() == '_') continue;
        const protocol::FamilyArgument* arg = a.find(key);
        if (!arg || key != arg->row->name || !arg->row->model_default || arg->ignored)
            throw protocol::ModelError(path + ": \"" + key.substr(0, 60) +
                                       "\" is not a default this model's pipeline takes (it takes " +
                                       accepted + ")");
        protocol::CallValue v;
        if (const std::string why = protocol::read_call_value(*arg->row, value, v, arg->max); !why.empty())
            throw protocol::ModelError(path + ": \"" + key + "\" is " + value.dump().substr(0, 40) + "; " +
                                       why);
        a.set_default(key, std::move(v));
    }
    return a;
}

std::string family_for_model(const std::string& model_dir, const ParallelSpec& spec) {
    return is_variant(model_dir, spec) ? spec.variant_family : spec.family;
}

std::string family_name_for_model(const std::string& model_dir, const ParallelSpec& spec) {
    return is_variant(model_dir, spec) ? spec.variant_name : spec.display_name;
}

std::vector<std::string> folder_components(const std::string& model_dir, const ParallelSpec& spec) {
    const std::string path = model_dir + "/model_index.json";
    const nlohmann::json index = read_object(path);
    std::vector<std::string> out;
    for (const std::string& component : spec.components)
        if (!component_class(index, component, path).empty()) out.push_back(component);
    return out;
}

std::vector<std::string> model_folder_problems(const std::string& model_dir, const ParallelSpec& spec,
                                               const ModelNeeds& needs) {
    std::vector<std::string> problems;
    const std::string path = model_dir + "/model_index.json";
    nlohmann::json index;
    try {
        index = read_object(path);
    } catch (const protocol::ModelError& e) {
        return {e.what()};
    }
    bool t5 = false;
    for (const ComponentRule& rule : facts_of(spec).components) {
        std::string cls;
        try {
            cls = component_class(index, rule.key, path);
        } catch (const protocol::ModelError& e) {
            problems.push_back(e.what());
            continue;
        }
        if (rule.t5 && needs.no_t5) continue;
        if (rule.t5 && rule.files == ComponentRule::kT5Tokenizer) {
            if (!t5) continue;  // no T5 encoder: its tokenizer is not needed
            if (cls.empty()) {
                problems.push_back(path + ": \"" + rule.key + "\" is missing, but " + spec.t5_encoder +
                                   " names a T5 encoder, which needs a " + or_list(rule.classes) +
                                   " (or run with --no-t5)");
                continue;
            }
        }
        if (cls.empty()) {
            if (rule.required)
                problems.push_back(path + ": \"" + rule.key + "\" is missing: " + spec.pipeline_class +
                                   " needs a " + rule.classes.front());
            continue;
        }
        if (std::find(rule.classes.begin(), rule.classes.end(), cls) == rule.classes.end()) {
            problems.push_back(path + ": \"" + rule.key + "\" is a " + cls + "; supported: " +
                               or_list(rule.classes) + (rule.t5 ? " (or run with --no-t5)" : ""));
            continue;
        }
        if (rule.key == spec.t5_encoder) t5 = true;
        const std::string dir = model_dir + "/" + rule.key;
        if (!is_directory(dir)) {
            problems.push_back(dir + ": missing (model_index.json names a " + cls + " there)");
            continue;
        }
        check_component_files(dir, rule, needs, problems);
    }
    check_transformer_config(model_dir, spec, t5, problems);
    return problems;
}

}  // namespace dp::strategies

namespace dp::strategies {

ModelInfo read_model_info(const std::string& model_dir) {
    ModelInfo m;
    m.dir = model_dir;
    m.spec = &parallel_spec_for_model(model_dir);
    m.family = family_for_model(model_dir, *m.spec);
    m.family_name = family_name_for_model(model_dir, *m.spec);
    m.shape = read_transformer_shape(model_dir, *m.spec);
    m.sizes = read_image_size_rule(model_dir, *m.spec);
    m.arguments = call_arguments_for_model(model_dir, *m.spec);
    return m;
}

void check_job_family(const protocol::JobFile& job) {
    protocol::FamilyArguments family;
    try {
        family = family_arguments(job.family);
    } catch (const protocol::InternalError&) {
        throw protocol::InputDataError("family: '" + job.family.substr(0, 40) +
                                       "' is not a model family this dp-worker runs");
    }
    for (std::size_t i = 0; i < job.requests.size(); ++i)
        for (const protocol::CallValues::Item& item : job.requests[i].arguments.items())
            if (!family.takes(item.first->name))
                throw protocol::InputDataError("requests[" + std::to_string(i) + "]." + item.first->name +
                                               ": " + job.family + " does not read it");
}

}  // namespace dp::strategies
