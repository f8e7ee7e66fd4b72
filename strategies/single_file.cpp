#include "strategies/single_file.h"
#include "strategies/text.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "protocol/errors.h"
#include "strategies/family.h"
#include "strategies/gguf.h"
#include "strategies/lora.h"
#include "strategies/original_layouts.h"

namespace dp::strategies {
namespace {

using protocol::ModelError;

// The prefixes single files put before a component's own keys (ComfyUI's, and Stability's).
const char* const kPrefixes[] = {"model.diffusion_model.", "diffusion_model.", "transformer."};

// A file in diffusers' own names (a component's diffusion_pytorch_model.safetensors, renamed).
void map_diffusers(const CheckpointTensors& file, SingleFileLayout& out) {
    out.layout = "diffusers";
    for (const auto& [name, info] : file) {
        if (!starts_with(name, out.prefix) || name == "scaled_fp8" || ends_with(name, ".scale_weight"))
            continue;
        StoredTensor t{name, {}, {}};
        if (ends_with(name, ".weight")) {
            const std::string scale = name.substr(0, name.size() - 6) + "scale_weight";
            if (file.count(scale)) t.scale = scale;
        }
        const std::string target = name.substr(out.prefix.size());
        out.tensors[target] = t;
        out.shapes[target] = info.shape;
    }
}

// Note [bundled files]: the prefixes a whole-pipeline file keeps each component under.
const char* const kVaePrefixes[] = {"first_stage_model.", "vae."};
const char* const kTransformerPrefix = "model.diffusion_model.";

bool is_bundle(const CheckpointTensors& file) {
    bool transformer = false, vae = false, other = false;
    for (const auto& [name, info] : file) {
        transformer = transformer || starts_with(name, kTransformerPrefix);
        vae = vae || starts_with(name, "vae.");
        other = other || starts_with(name, "text_encoders.") || starts_with(name, "first_stage_model.");
    }
    return other || (transformer && vae);
}

// The text encoder a family's `component` is in such files ("clip_l"), or empty.
std::string bundled_encoder(const ParallelSpec& spec, const std::string& component) {
    const std::map<std::string, std::string>& encoders = facts_of(spec).bundled_encoders;
    const auto it = encoders.find(component);
    return it == encoders.end() ? std::string() : it->second;
}

// The prefix `component`'s tensors have in the bundle `file`, or empty when it holds none.
std::string bundle_prefix(const CheckpointTensors& file, const ParallelSpec& spec,
                          const std::string& component) {
    std::vector<std::string> candidates;
    if (component == spec.transformer) candidates.push_back(kTransformerPrefix);
    if (component == "vae") candidates.assign(std::begin(kVaePrefixes), std::end(kVaePrefixes));
    if (const std::string encoder = bundled_encoder(spec, component); !encoder.empty())
        candidates.push_back("text_encoders." + encoder + ".transformer.");
    for (const std::string& prefix : candidates)
        if (std::any_of(file.begin(), file.end(),
                        [&](const auto& t) { return starts_with(t.first, prefix); }))
            return prefix;
    return {};
}

std::vector<std::string> bundled_components(const CheckpointTensors& file, const ParallelSpec& spec) {
    std::vector<std::string> out;
    if (!is_bundle(file)) return out;
    for (const std::string& component : spec.components)
        if (!bundle_prefix(file, spec, component).empty()) out.push_back(component);
    return out;
}

// Note [bundled files]: CLIP's position_ids and a T5's second name for its embedding are no
// weights of their own; a CLIP-L the family takes unprojected (SD3's) has the identity for its text
// projection from a bundle.
void text_encoder_fixes(const ParallelSpec& spec, const std::string& component, bool bundle,
                        SingleFileLayout& out) {
    for (auto it = out.tensors.begin(); it != out.tensors.end();) {
        const bool position_ids = ends_with(it->first, "embeddings.position_ids");
        const bool second_embedding =
            it->first == "encoder.embed_tokens.weight" && out.tensors.count("shared.weight");
        if (position_ids || second_embedding) {
            out.shapes.erase(it->first);
            it = out.tensors.erase(it);
        } else {
            ++it;
        }
    }
    if (component != facts_of(spec).identity_projection) return;
    const auto norm = out.shapes.find("text_model.final_layer_norm.weight");
    if (norm == out.shapes.end() || norm->second.size() != 1)
        return;  // single_file_problem names what is missing
    if (!bundle && out.tensors.count("text_projection.weight"))
        return;  // a CLIP-L file of its own keeps its projection
    StoredTensor identity;
    identity.identity = true;
    out.tensors["text_projection.weight"] = identity;
    out.shapes["text_projection.weight"] = {norm->second[0], norm->second[0]};
}

std::string format_of(const CheckpointTensors& file, const SingleFileLayout& layout, bool gguf) {
    std::map<std::string, std::size_t> bytes;
    for (const auto& [target, t] : layout.tensors)
        if (!t.identity) bytes[file.at(t.tensor).dtype] += file.at(t.tensor).nbytes;
    const auto most = std::max_element(bytes.begin(), bytes.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
    if (most == bytes.end()) return "empty";
    if (gguf) {
        // "GGUF Q4_K (and F32, Q8_0)": the file's quantization, as its name says it, is its type of
        // fewest bits per weight (a Q4_K file keeps rows that are no whole K blocks in Q8_0, its
        // embeddings and biases in F16 or F32); then the others.
        std::string main = most->first;
        double bits = 1e9;
        for (const auto& [dtype, n] : bytes)
            for (uint32_t id = 0; id < 64; ++id)
                if (const GgmlType* t = ggml_type(id); t && dtype == t->name) {
                    const double b =
                        8.0 * static_cast<double>(t->block_bytes) / static_cast<double>(t->block_elements);
                    if (b < bits) bits = b, main = dtype;
                }
        std::string others;
        for (const auto& [dtype, n] : bytes)
            if (dtype != main) others += (others.empty() ? "" : ", ") + dtype;
        return "GGUF " + main + (others.empty() ? "" : " (and " + others + ")");
    }
    const bool scaled =
        file.count("scaled_fp8") || std::any_of(layout.tensors.begin(), layout.tensors.end(),
                                                [](const auto& t) { return !t.second.scale.empty(); });
    if (most->first == "F8_E4M3") return scaled ? "scaled fp8 (e4m3)" : "fp8 (e4m3)";
    if (most->first == "F8_E5M2") return scaled ? "scaled fp8 (e5m2)" : "fp8 (e5m2)";
    if (most->first == "BF16") return "bf16";
    if (most->first == "F16") return "fp16";
    if (most->first == "F32") return "fp32";
    return most->first;
}

void check_scales(const CheckpointTensors& file, const SingleFileLayout& layout) {
    for (const auto& [target, t] : layout.tensors) {
        if (t.scale.empty()) continue;
        const CheckpointTensor& s = file.at(t.scale);
        int64_t n = 1;
        for (const int64_t d : s.shape) n *= d;
        if (n != 1)
            throw ModelError(layout.path + ": '" + t.scale + "' must be one number (the scale of '" +
                             t.tensor + "'), not " + std::to_string(n));
        if (s.dtype != "F32" && s.dtype != "BF16" && s.dtype != "F16")
            throw ModelError(layout.path + ": '" + t.scale + "' has dtype " + s.dtype +
                             "; a weight's scale is F32, BF16 or F16");
    }
}

}  // namespace

CheckpointTensors checkpoint_tensors(const SafetensorsFile& file) {
    CheckpointTensors out;
    for (const auto& [name, info] : file.tensors())
        out[name] = {info.shape, st_dtype_name(info.dtype), info.nbytes};
    return out;
}

CheckpointTensors checkpoint_tensors(const GgufFile& file) {
    CheckpointTensors out;
    for (const auto& [name, info] : file.tensors()) out[name] = {info.shape, info.type->name, info.nbytes};
    return out;
}

SingleFileLayout read_single_file_layout(const std::string& path, const CheckpointTensors& all,
                                         const ParallelSpec& spec, const std::string& component, bool gguf) {
    SingleFileLayout out;
    out.path = path;
    out.gguf = gguf;
    if (all.empty()) throw ModelError(path + ": holds no tensors");
    // Note [bundled files]: a file of several components gives this one the tensors under its prefix.
    CheckpointTensors part;
    const bool bundle = is_bundle(all);
    if (bundle) {
        const std::string prefix = bundle_prefix(all, spec, component);
        if (prefix.empty()) {
            std::string held;
            for (const std::string& c : bundled_components(all, spec)) held += (held.empty() ? "" : ", ") + c;
            throw ModelError(path + ": holds no " + component + " (it holds " +
                             (held.empty() ? "none of " + spec.display_name + "'s components" : held) + ")");
        }
        for (const auto& [name, info] : all)
            if (starts_with(name, prefix) || name == "scaled_fp8") part[name] = info;
        out.prefix = prefix;
    }
    const CheckpointTensors& file = bundle ? part : all;
    std::vector<std::string> names;
    for (const auto& [name, info] : file) names.push_back(name);
    if (!bundle)
        for (const char* p : kPrefixes)
            if (std::all_of(names.begin(), names.end(),
                            [&](const std::string& n) { return starts_with(n, p) || n == "scaled_fp8"; }))
                out.prefix = p;
    // The family the names say, for the transformer (a text encoder's names say none).
    const std::string guess = component == spec.transformer ? adapter_family_guess(names) : std::string();
    if (!names_fit(facts_of(spec), guess))
        throw ModelError(path + ": its tensor names look made for " + guess + ", not " + spec.display_name +
                         " (the model of --model's folder)");
    const auto has_name = [&](const char* marker) {
        return std::any_of(names.begin(), names.end(),
                           [&](const std::string& n) { return n.find(marker) != std::string::npos; });
    };
    const FamilyFacts& family = facts_of(spec);
    if (component == spec.transformer && family.is_original_transformer &&
        family.is_original_transformer(file, out.prefix)) {
        family.map_original_transformer(file, out);
    } else if (component == "vae" && (has_name("decoder.up.") || has_name("encoder.down."))) {
        map_ldm_vae(file, out);
    } else {
        map_diffusers(file, out);
        text_encoder_fixes(spec, component, bundle, out);
    }
    check_scales(file, out);
    out.format = format_of(file, out, gguf);
    std::set<std::string> counted;  // a fused tensor once
    for (const auto& [target, t] : out.tensors) {
        if (t.identity || !gguf || !counted.insert(t.tensor).second) continue;
        const CheckpointTensor& info = file.at(t.tensor);
        if (info.dtype != "F32" && info.dtype != "F16" && info.dtype != "BF16")
            out.quantized_bytes += info.nbytes;
    }
    return out;
}

SingleFileLayout read_single_file_layout(const SafetensorsFile& file, const ParallelSpec& spec,
                                         const std::string& component) {
    SingleFileLayout layout =
        read_single_file_layout(file.path(), checkpoint_tensors(file), spec, component, false);
    // Scaled fp8: each scale is one number read here (a few bytes each), and must be finite.
    for (const auto& [target, t] : layout.tensors) {
        if (t.scale.empty()) continue;
        const std::byte* at = file.data(t.scale);
        const std::string dtype = st_dtype_name(file.info(t.scale).dtype);
        bool finite = true;
        if (dtype == "F32") {
            float v = 0;
            std::memcpy(&v, at, sizeof v);
            finite = std::isfinite(v);
        } else {  // BF16 or F16 (check_scales): all exponent bits set is an infinity or a NaN
            uint16_t bits = 0;
            std::memcpy(&bits, at, sizeof bits);
            const uint16_t exponent = dtype == "BF16" ? 0x7F80 : 0x7C00;
            finite = (bits & exponent) != exponent;
        }
        if (!finite)
            throw ModelError(file.path() + ": '" + t.scale + "', the scale of '" + t.tensor +
                             "', is not a finite number (a corrupt or badly converted scaled fp8 file)");
    }
    return layout;
}

SingleFileLayout read_single_file_layout(const GgufFile& file, const ParallelSpec& spec,
                                         const std::string& component) {
    return read_single_file_layout(file.path(), checkpoint_tensors(file), spec, component, true);
}

std::vector<std::string> bundled_components(const std::string& path, const ParallelSpec& spec) {
    return bundled_components(read_checkpoint_tensors(path), spec);
}

CheckpointTensors read_checkpoint_tensors(const std::string& path) {
    if (is_gguf_file(path)) return checkpoint_tensors(*GgufFile::open(path));
    return checkpoint_tensors(*SafetensorsFile::open(path));
}

std::string shipped_config_for(const std::string& path) {
    const CheckpointTensors tensors = read_checkpoint_tensors(path);
    std::vector<std::string> names;  // of a bundle, its transformer's (Note [bundled files])
    const bool bundle = is_bundle(tensors);
    for (const auto& [name, t] : tensors)
        if (!bundle || starts_with(name, kTransformerPrefix)) names.push_back(name);
    const std::string guess = adapter_family_guess(names);
    std::vector<std::string> readable;  // the families with shipped configs
    for (const FamilyFacts* f : families()) {
        if (!f->shipped_config) continue;
        readable.push_back(f->spec.display_name);
        if (f->spec.display_name != guess) continue;
        if (std::string config = f->shipped_config(names); !config.empty()) return config;
    }
    std::string list;
    for (std::size_t i = 0; i < readable.size(); ++i)
        list += (i == 0 ? "" : i + 1 == readable.size() ? " and " : ", ") + readable[i];
    throw ModelError(path + ": cannot tell which model this file is from its tensor names" +
                     (guess.empty() ? std::string() : " (they look made for " + guess + ")") +
                     "; dp-launch reads " + list +
                     " from one file: pass the model's diffusers folder as --model and the file as "
                     "--transformer FILE, or --config FOLDER");
}

SingleFileLayout read_single_file_layout(const std::string& path, const ParallelSpec& spec,
                                         const std::string& component) {
    if (is_gguf_file(path)) return read_single_file_layout(*GgufFile::open(path), spec, component);
    return read_single_file_layout(*SafetensorsFile::open(path), spec, component);
}

std::string single_file_problem(const SingleFileLayout& layout,
                                const std::map<std::string, std::vector<int64_t>>& expected) {
    const auto shape_text = [](const std::vector<int64_t>& shape) {
        std::string s = "[";
        for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
        return s + "]";
    };
    const auto list = [](const std::vector<std::string>& names) {
        std::string s;
        for (std::size_t i = 0; i < names.size() && i < 4; ++i)
            s += (i ? ", " : "") + std::string("'") + names[i] + "'";
        if (names.size() > 4) s += " and " + std::to_string(names.size() - 4) + " more";
        return s;
    };
    std::vector<std::string> missing, extra;
    for (const auto& [name, shape] : expected) {
        const auto it = layout.tensors.find(name);
        if (it == layout.tensors.end()) {
            missing.push_back(name);
            continue;
        }
        const std::vector<int64_t>& have = layout.shapes.at(name);
        if (have != shape)
            return layout.path + ": '" + it->second.tensor + "' gives '" + name + "' the shape " +
                   shape_text(have) + " but the model's config implies " + shape_text(shape) +
                   " (is the file for another size of the model?)";
    }
    for (const auto& [name, t] : layout.tensors)
        if (!expected.count(name)) extra.push_back(t.tensor);
    if (!missing.empty() && layout.layout != "diffusers") {
        // Named as the file would name them: a missing block is the usual cause.
        const bool sd3 = layout.layout == "Stability AI's original (SD3)";
        const std::vector<std::pair<std::string, std::string>> blocks =
            sd3 ? std::vector<std::pair<std::string, std::string>>{{"transformer_blocks.", "joint_blocks."}}
                : std::vector<std::pair<std::string, std::string>>{
                      {"transformer_blocks.", "double_blocks."},
                      {"single_transformer_blocks.", "single_blocks."}};
        for (std::string& name : missing)
            for (const auto& [ours, theirs] : blocks)
                if (starts_with(name, ours)) {
                    const std::size_t dot = name.find('.', ours.size());
                    name = layout.prefix + theirs + name.substr(ours.size(), dot - ours.size()) + " (" +
                           name + ")";
                    break;
                }
    }
    if (!missing.empty())
        return layout.path + ": has no tensor for " + list(missing) + " of the model's " +
               std::to_string(expected.size()) +
               " (a block missing, or a file for a model with fewer layers?)";
    if (!extra.empty())
        return layout.path + ": holds " + list(extra) +
               ", which the model's config has no place for (a file for a model with more layers?)";
    return {};
}

}  // namespace dp::strategies
