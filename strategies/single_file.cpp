#include "strategies/single_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "protocol/errors.h"
#include "strategies/gguf.h"
#include "strategies/lora.h"

namespace dp::strategies {
namespace {

using protocol::ModelError;

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
    return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// The prefixes single files put before a component's own keys (ComfyUI's, and Stability's).
const char* const kPrefixes[] = {"model.diffusion_model.", "diffusion_model.", "transformer."};

// Note [single files]: FLUX.1's original names, as Black Forest Labs publish them, and where each
// goes in diffusers' FluxTransformer2DModel. `to` ends in '.' for a module (".weight" and ".bias"
// follow) or names a tensor whole; a fused module lists its parts, which share its rows in order
// (each `width` of the model's hidden width, the last one taking the rest).
struct FluxModule {
    const char* from;
    std::vector<const char*> to;
};
const FluxModule kFluxTop[] = {
    {"img_in.", {"x_embedder."}},
    {"txt_in.", {"context_embedder."}},
    {"time_in.in_layer.", {"time_text_embed.timestep_embedder.linear_1."}},
    {"time_in.out_layer.", {"time_text_embed.timestep_embedder.linear_2."}},
    {"vector_in.in_layer.", {"time_text_embed.text_embedder.linear_1."}},
    {"vector_in.out_layer.", {"time_text_embed.text_embedder.linear_2."}},
    {"guidance_in.in_layer.", {"time_text_embed.guidance_embedder.linear_1."}},
    {"guidance_in.out_layer.", {"time_text_embed.guidance_embedder.linear_2."}},
    {"final_layer.linear.", {"proj_out."}},
};
const FluxModule kFluxDouble[] = {
    {"img_mod.lin.", {"norm1.linear."}},
    {"txt_mod.lin.", {"norm1_context.linear."}},
    {"img_attn.qkv.", {"attn.to_q.", "attn.to_k.", "attn.to_v."}},
    {"txt_attn.qkv.", {"attn.add_q_proj.", "attn.add_k_proj.", "attn.add_v_proj."}},
    {"img_attn.norm.query_norm.scale", {"attn.norm_q.weight"}},
    {"img_attn.norm.key_norm.scale", {"attn.norm_k.weight"}},
    {"txt_attn.norm.query_norm.scale", {"attn.norm_added_q.weight"}},
    {"txt_attn.norm.key_norm.scale", {"attn.norm_added_k.weight"}},
    {"img_attn.proj.", {"attn.to_out.0."}},
    {"txt_attn.proj.", {"attn.to_add_out."}},
    {"img_mlp.0.", {"ff.net.0.proj."}},
    {"img_mlp.2.", {"ff.net.2."}},
    {"txt_mlp.0.", {"ff_context.net.0.proj."}},
    {"txt_mlp.2.", {"ff_context.net.2."}},
};
const FluxModule kFluxSingle[] = {
    {"modulation.lin.", {"norm.linear."}},
    {"linear1.", {"attn.to_q.", "attn.to_k.", "attn.to_v.", "proj_mlp."}},
    {"linear2.", {"proj_out."}},
    {"norm.query_norm.scale", {"attn.norm_q.weight"}},
    {"norm.key_norm.scale", {"attn.norm_k.weight"}},
};

struct Mapper {
    const CheckpointTensors& file;
    SingleFileLayout& out;
    std::set<std::string> used;  // the file's tensors placed

    const CheckpointTensor* find(const std::string& name) const {
        const auto it = file.find(out.prefix + name);
        return it == file.end() ? nullptr : &it->second;
    }
    // `from` (a module ending in '.', or a tensor) to `to`, its fused parts each `width` rows but
    // the last; `swap_halves`: the two halves of its rows in the other order.
    void place(const std::string& from, const std::vector<const char*>& to, int64_t width, bool swap_halves = false) {
        place(from, std::vector<std::string>(to.begin(), to.end()), width, swap_halves);
    }
    void place(const std::string& from, const std::vector<std::string>& to, int64_t width, bool swap_halves = false) {
        const bool module = ends_with(from, ".");
        for (const char* suffix : module ? std::vector<const char*>{"weight", "bias"} : std::vector<const char*>{""}) {
            const std::string source = from + suffix;
            const CheckpointTensor* info = find(source);
            if (!info) continue;
            used.insert(out.prefix + source);
            const int64_t rows = info->shape.empty() ? 0 : info->shape[0];
            // width 0: the fused parts are equal (SD3's qkv); else each `width` rows but the last.
            if (width == 0 && to.size() > 1 && rows % static_cast<int64_t>(to.size()) != 0)
                throw ModelError(out.path + ": '" + out.prefix + source + "' has " + std::to_string(rows) +
                                 " rows, not " + std::to_string(to.size()) + " equal fused parts");
            const int64_t part = width > 0 ? width : rows / static_cast<int64_t>(to.size());
            int64_t first = 0;
            for (std::size_t k = 0; k < to.size(); ++k) {
                StoredTensor t;
                t.tensor = out.prefix + source;
                std::vector<int64_t> shape = info->shape;
                if (to.size() > 1) {
                    const int64_t count = k + 1 < to.size() ? part : rows - first;
                    if (count <= 0 || first + count > rows)
                        throw ModelError(out.path + ": '" + t.tensor + "' has " + std::to_string(rows) +
                                         " rows, too few for its " + std::to_string(to.size()) +
                                         " fused parts of the model's width " + std::to_string(part));
                    t.rows = {{first, count}};
                    shape[0] = count;
                    first += count;
                } else if (swap_halves) {
                    if (rows % 2 != 0)
                        throw ModelError(out.path + ": '" + t.tensor + "' has an odd number of rows (" +
                                         std::to_string(rows) + "), not two halves");
                    t.rows = {{rows / 2, rows / 2}, {0, rows / 2}};
                }
                const std::string scale = out.prefix + from + "scale_weight";
                if (module && std::string(suffix) == "weight" && file.count(scale)) {
                    t.scale = scale;
                    used.insert(scale);
                }
                const std::string target = module ? to[k] + suffix : to[k];
                out.tensors[target] = t;
                out.shapes[target] = shape;
            }
        }
    }
};

// The blocks `prefix`N. the file has, in order.
std::set<int64_t> blocks_of(const CheckpointTensors& file, const std::string& prefix) {
    std::set<int64_t> blocks;
    for (const auto& [name, info] : file) {
        if (!starts_with(name, prefix)) continue;
        const std::string rest = name.substr(prefix.size());
        const std::size_t dot = rest.find('.');
        if (dot == 0 || dot == std::string::npos || dot > 6) continue;
        if (!std::all_of(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(dot), ::isdigit)) continue;
        blocks.insert(std::stoll(rest.substr(0, dot)));
    }
    return blocks;
}

// Each block `from`N. of the file, its modules renamed under `to`N.; `halved`: one more module
// whose two halves of rows come in the other order in the last block only (SD3's last joint block).
template <std::size_t K>
void place_blocks(Mapper& m, int64_t width, const std::string& from, const std::string& to,
                  const FluxModule (&modules)[K], const FluxModule* halved = nullptr) {
    const std::set<int64_t> blocks = blocks_of(m.file, m.out.prefix + from);
    for (const int64_t n : blocks) {
        const std::string block = std::to_string(n) + ".";
        const auto place = [&](const FluxModule& f, bool swap) {
            std::vector<std::string> names;
            for (const char* t : f.to) names.push_back(to + block + t);
            m.place(from + block + f.from, names, width, swap);
        };
        for (const FluxModule& f : modules) place(f, false);
        if (halved) place(*halved, n == *blocks.rbegin());
    }
}

// What the file holds under the component's prefix beyond its tensors is named by single_file_problem.
void mark_unplaced(const CheckpointTensors& file, SingleFileLayout& out, const std::set<std::string>& used) {
    for (const auto& [name, info] : file)
        if (starts_with(name, out.prefix) && !used.count(name) && name != "scaled_fp8")
            out.tensors["(unplaced) " + name] = StoredTensor{name, {}, {}};
}

void map_flux_original(const CheckpointTensors& file, SingleFileLayout& out) {
    out.layout = "Black Forest Labs' original (FLUX.1)";
    Mapper m{file, out, {}};
    const CheckpointTensor* img_in = m.find("img_in.weight");
    if (!img_in || img_in->shape.size() != 2)
        throw ModelError(out.path + ": a FLUX.1 file in Black Forest Labs' layout must have a 2-D '" + out.prefix +
                         "img_in.weight' (the model's width comes from it)");
    const int64_t width = img_in->shape[0];
    for (const FluxModule& f : kFluxTop) m.place(f.from, f.to, width);
    m.place("final_layer.adaLN_modulation.1.", std::vector<std::string>{"norm_out.linear."}, width, /*swap_halves=*/true);
    place_blocks(m, width, "double_blocks.", "transformer_blocks.", kFluxDouble);
    place_blocks(m, width, "single_blocks.", "single_transformer_blocks.", kFluxSingle);
    mark_unplaced(file, out, m.used);
}

// SD3's original names, as Stability AI publish sd3_medium, sd3.5_medium and sd3.5_large, and where
// each goes in diffusers' SD3Transformer2DModel. The fused q, k, v rows are three equal parts.
const FluxModule kSd3Top[] = {
    {"pos_embed", {"pos_embed.pos_embed"}},
    {"x_embedder.proj.", {"pos_embed.proj."}},
    {"context_embedder.", {"context_embedder."}},
    {"t_embedder.mlp.0.", {"time_text_embed.timestep_embedder.linear_1."}},
    {"t_embedder.mlp.2.", {"time_text_embed.timestep_embedder.linear_2."}},
    {"y_embedder.mlp.0.", {"time_text_embed.text_embedder.linear_1."}},
    {"y_embedder.mlp.2.", {"time_text_embed.text_embedder.linear_2."}},
    {"final_layer.linear.", {"proj_out."}},
};
const FluxModule kSd3Joint[] = {
    {"x_block.attn.qkv.", {"attn.to_q.", "attn.to_k.", "attn.to_v."}},
    {"context_block.attn.qkv.", {"attn.add_q_proj.", "attn.add_k_proj.", "attn.add_v_proj."}},
    {"x_block.attn.ln_q.weight", {"attn.norm_q.weight"}},
    {"x_block.attn.ln_k.weight", {"attn.norm_k.weight"}},
    {"context_block.attn.ln_q.weight", {"attn.norm_added_q.weight"}},
    {"context_block.attn.ln_k.weight", {"attn.norm_added_k.weight"}},
    {"x_block.attn.proj.", {"attn.to_out.0."}},
    {"context_block.attn.proj.", {"attn.to_add_out."}},
    {"x_block.attn2.qkv.", {"attn2.to_q.", "attn2.to_k.", "attn2.to_v."}},
    {"x_block.attn2.ln_q.weight", {"attn2.norm_q.weight"}},
    {"x_block.attn2.ln_k.weight", {"attn2.norm_k.weight"}},
    {"x_block.attn2.proj.", {"attn2.to_out.0."}},
    {"x_block.adaLN_modulation.1.", {"norm1.linear."}},
    {"x_block.mlp.fc1.", {"ff.net.0.proj."}},
    {"x_block.mlp.fc2.", {"ff.net.2."}},
    {"context_block.mlp.fc1.", {"ff_context.net.0.proj."}},
    {"context_block.mlp.fc2.", {"ff_context.net.2."}},
};

void map_sd3_original(const CheckpointTensors& file, SingleFileLayout& out) {
    out.layout = "Stability AI's original (SD3)";
    Mapper m{file, out, {}};
    for (const FluxModule& f : kSd3Top) m.place(f.from, f.to, 0);
    m.place("final_layer.adaLN_modulation.1.", std::vector<std::string>{"norm_out.linear."}, 0, /*swap_halves=*/true);
    // The last block's context modulation (its context stream ends there) is shift then scale.
    static const FluxModule kContextModulation = {"context_block.adaLN_modulation.1.", {"norm1_context.linear."}};
    place_blocks(m, 0, "joint_blocks.", "transformer_blocks.", kSd3Joint, &kContextModulation);
    mark_unplaced(file, out, m.used);
}

std::vector<std::string> split_name(const std::string& name) {
    std::vector<std::string> parts;
    std::size_t at = 0;
    while (true) {
        const std::size_t dot = name.find('.', at);
        parts.push_back(name.substr(at, dot - at));
        if (dot == std::string::npos) return parts;
        at = dot + 1;
    }
}

bool is_index(const std::string& s) {
    return !s.empty() && s.size() <= 6 && std::all_of(s.begin(), s.end(), ::isdigit);
}

// The diffusers AutoencoderKL name of the original VAE layout's `name` (a decoder with `up` up
// blocks, numbered from the bottom there, from the top in diffusers), or empty.
std::string ldm_vae_name(const std::string& name, int64_t up, bool& squeeze) {
    const std::vector<std::string> p = split_name(name);
    const auto rest = [&](std::size_t from) {
        std::string r;
        for (std::size_t i = from; i < p.size(); ++i) r += (r.empty() ? "" : ".") + (p[i] == "nin_shortcut" ? "conv_shortcut" : p[i]);
        return r;
    };
    squeeze = false;
    if (p.size() == 2 && (p[0] == "quant_conv" || p[0] == "post_quant_conv")) return name;
    if (p.size() < 3 || (p[0] != "encoder" && p[0] != "decoder")) return {};
    const std::string& side = p[0];
    if (p.size() == 3 && (p[1] == "conv_in" || p[1] == "conv_out")) return name;
    if (p.size() == 3 && p[1] == "norm_out") return side + ".conv_norm_out." + p[2];
    if (p[1] == "mid" && p.size() >= 4) {
        if (p[2] == "block_1" || p[2] == "block_2")
            return side + ".mid_block.resnets." + (p[2] == "block_1" ? "0." : "1.") + rest(3);
        if (p[2] == "attn_1" && p.size() == 5) {
            static const std::map<std::string, std::string> kAttn = {
                {"norm", "group_norm"}, {"q", "to_q"}, {"k", "to_k"}, {"v", "to_v"}, {"proj_out", "to_out.0"}};
            const auto it = kAttn.find(p[3]);
            if (it == kAttn.end()) return {};
            squeeze = p[3] != "norm" && p[4] == "weight";
            return side + ".mid_block.attentions.0." + it->second + "." + p[4];
        }
        return {};
    }
    const bool down = side == "encoder" && p[1] == "down", upward = side == "decoder" && p[1] == "up";
    if ((!down && !upward) || p.size() < 5 || !is_index(p[2])) return {};
    const int64_t k = std::stoll(p[2]);
    const std::string block = down ? side + ".down_blocks." + p[2] : side + ".up_blocks." + std::to_string(up - 1 - k);
    if (p[3] == "block" && p.size() >= 6 && is_index(p[4])) return block + ".resnets." + p[4] + "." + rest(5);
    if ((p[3] == "downsample" || p[3] == "upsample") && p.size() == 6 && p[4] == "conv")
        return block + (down ? ".downsamplers.0.conv." : ".upsamplers.0.conv.") + p[5];
    return {};
}

void map_ldm_vae(const CheckpointTensors& file, SingleFileLayout& out) {
    out.layout = "the original latent-diffusion VAE";
    const std::set<int64_t> up = blocks_of(file, out.prefix + "decoder.up.");
    const int64_t ups = up.empty() ? 0 : *up.rbegin() + 1;
    for (const auto& [name, info] : file) {
        if (!starts_with(name, out.prefix) || name == "scaled_fp8") continue;
        bool squeeze = false;
        const std::string target = ldm_vae_name(name.substr(out.prefix.size()), ups, squeeze);
        if (target.empty()) {
            out.tensors["(unplaced) " + name] = StoredTensor{name, {}, {}};
            continue;
        }
        std::vector<int64_t> shape = info.shape;
        if (squeeze) {
            const bool ones = shape.size() >= 3 && std::all_of(shape.begin() + 2, shape.end(), [](int64_t d) { return d == 1; });
            if (!ones)
                throw ModelError(out.path + ": '" + name + "' must be a 1x1 convolution's weight (the VAE's attention)");
            shape.resize(2);
        }
        StoredTensor t{name, {}, {}};
        t.squeeze = squeeze && info.shape.size() > 2;
        out.tensors[target] = t;
        out.shapes[target] = shape;
    }
}

// A file in diffusers' own names (a component's diffusion_pytorch_model.safetensors, renamed).
void map_diffusers(const CheckpointTensors& file, SingleFileLayout& out) {
    out.layout = "diffusers";
    for (const auto& [name, info] : file) {
        if (!starts_with(name, out.prefix) || name == "scaled_fp8" || ends_with(name, ".scale_weight")) continue;
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
    static const std::map<std::string, std::map<std::string, std::string>> kEncoders = {
        {"sd3", {{"text_encoder", "clip_l"}, {"text_encoder_2", "clip_g"}, {"text_encoder_3", "t5xxl"}}},
        {"flux", {{"text_encoder", "clip_l"}, {"text_encoder_2", "t5xxl"}}}};
    const auto family = kEncoders.find(spec.family);
    if (family == kEncoders.end()) return {};
    const auto it = family->second.find(component);
    return it == family->second.end() ? std::string() : it->second;
}

// The prefix `component`'s tensors have in the bundle `file`, or empty when it holds none.
std::string bundle_prefix(const CheckpointTensors& file, const ParallelSpec& spec, const std::string& component) {
    std::vector<std::string> candidates;
    if (component == spec.transformer) candidates.push_back(kTransformerPrefix);
    if (component == "vae") candidates.assign(std::begin(kVaePrefixes), std::end(kVaePrefixes));
    if (const std::string encoder = bundled_encoder(spec, component); !encoder.empty())
        candidates.push_back("text_encoders." + encoder + ".transformer.");
    for (const std::string& prefix : candidates)
        if (std::any_of(file.begin(), file.end(), [&](const auto& t) { return starts_with(t.first, prefix); }))
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
// weights of their own; SD3's CLIP-L from a bundle has the identity for its text projection.
void text_encoder_fixes(const ParallelSpec& spec, const std::string& component, bool bundle, SingleFileLayout& out) {
    for (auto it = out.tensors.begin(); it != out.tensors.end();) {
        const bool position_ids = ends_with(it->first, "embeddings.position_ids");
        const bool second_embedding = it->first == "encoder.embed_tokens.weight" && out.tensors.count("shared.weight");
        if (position_ids || second_embedding) {
            out.shapes.erase(it->first);
            it = out.tensors.erase(it);
        } else {
            ++it;
        }
    }
    if (bundled_encoder(spec, component) != "clip_l" || spec.family != "sd3") return;
    const auto norm = out.shapes.find("text_model.final_layer_norm.weight");
    if (norm == out.shapes.end() || norm->second.size() != 1) return;  // single_file_problem names what is missing
    if (!bundle && out.tensors.count("text_projection.weight")) return;  // a CLIP-L file of its own keeps its projection
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
                    const double b = 8.0 * static_cast<double>(t->block_bytes) / static_cast<double>(t->block_elements);
                    if (b < bits) bits = b, main = dtype;
                }
        std::string others;
        for (const auto& [dtype, n] : bytes)
            if (dtype != main) others += (others.empty() ? "" : ", ") + dtype;
        return "GGUF " + main + (others.empty() ? "" : " (and " + others + ")");
    }
    const bool scaled = file.count("scaled_fp8") ||
                        std::any_of(layout.tensors.begin(), layout.tensors.end(),
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
            throw ModelError(layout.path + ": '" + t.scale + "' must be one number (the scale of '" + t.tensor +
                             "'), not " + std::to_string(n));
        if (s.dtype != "F32" && s.dtype != "BF16" && s.dtype != "F16")
            throw ModelError(layout.path + ": '" + t.scale + "' has dtype " + s.dtype +
                             "; a weight's scale is F32, BF16 or F16");
    }
}

}  // namespace

CheckpointTensors checkpoint_tensors(const SafetensorsFile& file) {
    CheckpointTensors out;
    for (const auto& [name, info] : file.tensors()) out[name] = {info.shape, st_dtype_name(info.dtype), info.nbytes};
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
            throw ModelError(path + ": holds no " + component + " (it holds " + (held.empty() ? "none of " + spec.display_name + "'s components" : held) + ")");
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
    if (!guess.empty() && guess != spec.display_name)
        throw ModelError(path + ": its tensor names look made for " + guess + ", not " + spec.display_name +
                         " (the model of --model's folder)");
    const auto has_name = [&](const char* marker) {
        return std::any_of(names.begin(), names.end(),
                           [&](const std::string& n) { return n.find(marker) != std::string::npos; });
    };
    if (component == spec.transformer && spec.family == "flux" &&
        file.count(out.prefix + "double_blocks.0.img_attn.qkv.weight")) {
        map_flux_original(file, out);
    } else if (component == spec.transformer && spec.family == "sd3" && has_name("joint_blocks.")) {
        map_sd3_original(file, out);
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
        if (info.dtype != "F32" && info.dtype != "F16" && info.dtype != "BF16") out.quantized_bytes += info.nbytes;
    }
    return out;
}

SingleFileLayout read_single_file_layout(const SafetensorsFile& file, const ParallelSpec& spec,
                                         const std::string& component) {
    SingleFileLayout layout = read_single_file_layout(file.path(), checkpoint_tensors(file), spec, component, false);
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

SingleFileLayout read_single_file_layout(const GgufFile& file, const ParallelSpec& spec, const std::string& component) {
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
    const auto has = [&](const std::string& suffix) {
        return std::any_of(names.begin(), names.end(), [&](const std::string& n) { return ends_with(n, suffix); });
    };
    const std::string guess = adapter_family_guess(names);
    if (guess == "FLUX.1" && has("double_blocks.0.img_attn.qkv.weight"))
        return has("guidance_in.in_layer.weight") ? "flux.1-dev" : "flux.1-schnell";
    if (guess == "FLUX.1" && has("transformer_blocks.0.attn.to_q.weight"))
        return has("guidance_embedder.linear_1.weight") ? "flux.1-dev" : "flux.1-schnell";
    if (guess == "Qwen-Image") return "qwen-image";
    // SD3 in Stability AI's names: 3.5 medium has the second attention (MMDiT-X), 3.5 large the
    // q/k norms alone, 3 medium neither.
    if (guess == "SD3" && has("joint_blocks.0.x_block.attn.qkv.weight"))
        return has("x_block.attn2.qkv.weight") ? "sd3.5-medium" : has("x_block.attn.ln_q.weight") ? "sd3.5-large" : "sd3-medium";
    throw ModelError(path + ": cannot tell which model this file is from its tensor names" +
                     (guess.empty() ? std::string() : " (they look made for " + guess + ")") +
                     "; dp-launch reads FLUX.1, SD3 and Qwen-Image from one file: pass the model's "
                     "diffusers folder as --model and the file as --transformer FILE, or --config FOLDER");
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
        for (std::size_t i = 0; i < names.size() && i < 4; ++i) s += (i ? ", " : "") + std::string("'") + names[i] + "'";
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
            return layout.path + ": '" + it->second.tensor + "' gives '" + name + "' the shape " + shape_text(have) +
                   " but the model's config implies " + shape_text(shape) + " (is the file for another size of the model?)";
    }
    for (const auto& [name, t] : layout.tensors)
        if (!expected.count(name)) extra.push_back(t.tensor);
    if (!missing.empty() && layout.layout != "diffusers") {
        // Named as the file would name them: a missing block is the usual cause.
        const bool sd3 = layout.layout == "Stability AI's original (SD3)";
        const std::vector<std::pair<std::string, std::string>> blocks =
            sd3 ? std::vector<std::pair<std::string, std::string>>{{"transformer_blocks.", "joint_blocks."}}
                : std::vector<std::pair<std::string, std::string>>{{"transformer_blocks.", "double_blocks."},
                                                                   {"single_transformer_blocks.", "single_blocks."}};
        for (std::string& name : missing)
            for (const auto& [ours, theirs] : blocks)
                if (starts_with(name, ours)) {
                    const std::size_t dot = name.find('.', ours.size());
                    name = layout.prefix + theirs + name.substr(ours.size(), dot - ours.size()) + " (" + name + ")";
                    break;
                }
    }
    if (!missing.empty())
        return layout.path + ": has no tensor for " + list(missing) + " of the model's " +
               std::to_string(expected.size()) + " (a block missing, or a file for a model with fewer layers?)";
    if (!extra.empty())
        return layout.path + ": holds " + list(extra) +
               ", which the model's config has no place for (a file for a model with more layers?)";
    return {};
}

}  // namespace dp::strategies
