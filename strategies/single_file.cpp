#include "strategies/single_file.h"

#include <algorithm>
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
        const bool module = ends_with(from, ".");
        for (const char* suffix : module ? std::vector<const char*>{"weight", "bias"} : std::vector<const char*>{""}) {
            const std::string source = from + suffix;
            const CheckpointTensor* info = find(source);
            if (!info) continue;
            used.insert(out.prefix + source);
            const int64_t rows = info->shape.empty() ? 0 : info->shape[0];
            int64_t first = 0;
            for (std::size_t k = 0; k < to.size(); ++k) {
                StoredTensor t;
                t.tensor = out.prefix + source;
                std::vector<int64_t> shape = info->shape;
                if (to.size() > 1) {
                    const int64_t count = k + 1 < to.size() ? width : rows - first;
                    if (count <= 0 || first + count > rows)
                        throw ModelError(out.path + ": '" + t.tensor + "' has " + std::to_string(rows) +
                                         " rows, too few for its " + std::to_string(to.size()) +
                                         " fused parts of the model's width " + std::to_string(width));
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
                const std::string target = module ? std::string(to[k]) + suffix : std::string(to[k]);
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

void map_flux_original(const CheckpointTensors& file, SingleFileLayout& out) {
    out.layout = "Black Forest Labs' original (FLUX.1)";
    Mapper m{file, out, {}};
    const CheckpointTensor* img_in = m.find("img_in.weight");
    if (!img_in || img_in->shape.size() != 2)
        throw ModelError(out.path + ": a FLUX.1 file in Black Forest Labs' layout must have a 2-D '" + out.prefix +
                         "img_in.weight' (the model's width comes from it)");
    const int64_t width = img_in->shape[0];
    for (const FluxModule& f : kFluxTop) m.place(f.from, f.to, width);
    m.place("final_layer.adaLN_modulation.1.", {"norm_out.linear."}, width, /*swap_halves=*/true);
    // Each block of each kind the file has, its modules renamed under the block's diffusers prefix.
    const auto place_blocks = [&](const std::string& from, const std::string& to, const auto& modules) {
        for (const int64_t n : blocks_of(file, out.prefix + from)) {
            const std::string block = std::to_string(n) + ".";
            for (const FluxModule& f : modules) {
                std::vector<std::string> names;
                for (const char* t : f.to) names.push_back(to + block + t);
                std::vector<const char*> ptrs;
                for (const std::string& s : names) ptrs.push_back(s.c_str());
                m.place(from + block + f.from, ptrs, width);
            }
        }
    };
    place_blocks("double_blocks.", "transformer_blocks.", kFluxDouble);
    place_blocks("single_blocks.", "single_transformer_blocks.", kFluxSingle);
    // What the file holds beyond the transformer's tensors is named by single_file_problem.
    for (const auto& [name, info] : file)
        if (starts_with(name, out.prefix) && !m.used.count(name) && name != "scaled_fp8")
            out.tensors["(unplaced) " + name] = StoredTensor{name, {}, {}};
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

std::string format_of(const CheckpointTensors& file, const SingleFileLayout& layout, bool gguf) {
    std::map<std::string, std::size_t> bytes;
    for (const auto& [target, t] : layout.tensors) bytes[file.at(t.tensor).dtype] += file.at(t.tensor).nbytes;
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

SingleFileLayout read_single_file_layout(const std::string& path, const CheckpointTensors& file,
                                         const ParallelSpec& spec, const std::string& component, bool gguf) {
    SingleFileLayout out;
    out.path = path;
    out.gguf = gguf;
    std::vector<std::string> names;
    for (const auto& [name, info] : file) names.push_back(name);
    if (names.empty()) throw ModelError(path + ": holds no tensors");
    for (const char* p : kPrefixes)
        if (std::all_of(names.begin(), names.end(),
                        [&](const std::string& n) { return starts_with(n, p) || n == "scaled_fp8"; }))
            out.prefix = p;
    // The family the names say, for the transformer (a text encoder's names say none).
    const std::string guess = component == spec.transformer ? adapter_family_guess(names) : std::string();
    if (!guess.empty() && guess != spec.display_name)
        throw ModelError(path + ": its tensor names look made for " + guess + ", not " + spec.display_name +
                         " (the model of --model's folder)");
    const bool flux = spec.family == "flux";
    if (component == spec.transformer && flux && file.count(out.prefix + "double_blocks.0.img_attn.qkv.weight")) {
        map_flux_original(file, out);
    } else if (component == spec.transformer && guess == "SD3" &&
               std::any_of(names.begin(), names.end(),
                           [](const std::string& n) { return n.find("joint_blocks.") != std::string::npos; })) {
        throw ModelError(path + ": SD3 in Stability's original layout (joint_blocks) is not read yet; "
                         "use the model's diffusers folder, or a transformer file in diffusers' names");
    } else {
        map_diffusers(file, out);
    }
    check_scales(file, out);
    out.format = format_of(file, out, gguf);
    return out;
}

SingleFileLayout read_single_file_layout(const SafetensorsFile& file, const ParallelSpec& spec,
                                         const std::string& component) {
    return read_single_file_layout(file.path(), checkpoint_tensors(file), spec, component, false);
}

SingleFileLayout read_single_file_layout(const GgufFile& file, const ParallelSpec& spec, const std::string& component) {
    return read_single_file_layout(file.path(), checkpoint_tensors(file), spec, component, true);
}

CheckpointTensors read_checkpoint_tensors(const std::string& path) {
    if (is_gguf_file(path)) return checkpoint_tensors(*GgufFile::open(path));
    return checkpoint_tensors(*SafetensorsFile::open(path));
}

std::string shipped_config_for(const std::string& path) {
    const CheckpointTensors tensors = read_checkpoint_tensors(path);
    std::vector<std::string> names;
    for (const auto& [name, t] : tensors) names.push_back(name);
    const auto has = [&](const std::string& suffix) {
        return std::any_of(names.begin(), names.end(), [&](const std::string& n) { return ends_with(n, suffix); });
    };
    const std::string guess = adapter_family_guess(names);
    if (guess == "FLUX.1" && has("double_blocks.0.img_attn.qkv.weight"))
        return has("guidance_in.in_layer.weight") ? "flux.1-dev" : "flux.1-schnell";
    if (guess == "FLUX.1" && has("transformer_blocks.0.attn.to_q.weight"))
        return has("guidance_embedder.linear_1.weight") ? "flux.1-dev" : "flux.1-schnell";
    if (guess == "Qwen-Image") return "qwen-image";
    throw ModelError(path + ": cannot tell which model this file is from its tensor names" +
                     (guess.empty() ? std::string() : " (they look made for " + guess + ")") +
                     "; dp-launch reads FLUX.1 and Qwen-Image transformers from one file: pass the model's "
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
        for (std::string& name : missing)
            for (const auto& [ours, theirs] : {std::pair<std::string, std::string>{"transformer_blocks.", "double_blocks."},
                                               {"single_transformer_blocks.", "single_blocks."}})
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
