#include "strategies/original_layouts.h"
#include "strategies/text.h"

#include <algorithm>
#include <set>

#include "protocol/errors.h"

namespace dp::strategies {
namespace {

using protocol::ModelError;

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
    void place(const std::string& from, const std::vector<const char*>& to, int64_t width,
               bool swap_halves = false) {
        place(from, std::vector<std::string>(to.begin(), to.end()), width, swap_halves);
    }
    void place(const std::string& from, const std::vector<std::string>& to, int64_t width,
               bool swap_halves = false) {
        const bool module = ends_with(from, ".");
        for (const char* suffix :
             module ? std::vector<const char*>{"weight", "bias"} : std::vector<const char*>{""}) {
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
        for (std::size_t i = from; i < p.size(); ++i)
            r += (r.empty() ? "" : ".") + (p[i] == "nin_shortcut" ? "conv_shortcut" : p[i]);
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
            static const std::map<std::string, std::string> kAttn = {{"norm", "group_norm"},
                                                                     {"q", "to_q"},
                                                                     {"k", "to_k"},
                                                                     {"v", "to_v"},
                                                                     {"proj_out", "to_out.0"}};
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
    const std::string block =
        down ? side + ".down_blocks." + p[2] : side + ".up_blocks." + std::to_string(up - 1 - k);
    if (p[3] == "block" && p.size() >= 6 && is_index(p[4])) return block + ".resnets." + p[4] + "." + rest(5);
    if ((p[3] == "downsample" || p[3] == "upsample") && p.size() == 6 && p[4] == "conv")
        return block + (down ? ".downsamplers.0.conv." : ".upsamplers.0.conv.") + p[5];
    return {};
}

}  // namespace

void map_flux_original(const CheckpointTensors& file, SingleFileLayout& out) {
    out.layout = "Black Forest Labs' original (FLUX.1)";
    Mapper m{file, out, {}};
    const CheckpointTensor* img_in = m.find("img_in.weight");
    if (!img_in || img_in->shape.size() != 2)
        throw ModelError(out.path + ": a FLUX.1 file in Black Forest Labs' layout must have a 2-D '" +
                         out.prefix + "img_in.weight' (the model's width comes from it)");
    const int64_t width = img_in->shape[0];
    for (const FluxModule& f : kFluxTop) m.place(f.from, f.to, width);
    m.place("final_layer.adaLN_modulation.1.", std::vector<std::string>{"norm_out.linear."}, width,
            /*swap_halves=*/true);
    place_blocks(m, width, "double_blocks.", "transformer_blocks.", kFluxDouble);
    place_blocks(m, width, "single_blocks.", "single_transformer_blocks.", kFluxSingle);
    mark_unplaced(file, out, m.used);
}

void map_sd3_original(const CheckpointTensors& file, SingleFileLayout& out) {
    out.layout = "Stability AI's original (SD3)";
    Mapper m{file, out, {}};
    for (const FluxModule& f : kSd3Top) m.place(f.from, f.to, 0);
    m.place("final_layer.adaLN_modulation.1.", std::vector<std::string>{"norm_out.linear."}, 0,
            /*swap_halves=*/true);
    // The last block's context modulation (its context stream ends there) is shift then scale.
    static const FluxModule kContextModulation = {"context_block.adaLN_modulation.1.",
                                                  {"norm1_context.linear."}};
    place_blocks(m, 0, "joint_blocks.", "transformer_blocks.", kSd3Joint, &kContextModulation);
    mark_unplaced(file, out, m.used);
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
            const bool ones = shape.size() >= 3 &&
                              std::all_of(shape.begin() + 2, shape.end(), [](int64_t d) { return d == 1; });
            if (!ones)
                throw ModelError(out.path + ": '" + name +
                                 "' must be a 1x1 convolution's weight (the VAE's attention)");
            shape.resize(2);
        }
        StoredTensor t{name, {}, {}};
        t.squeeze = squeeze && info.shape.size() > 2;
        out.tensors[target] = t;
        out.shapes[target] = shape;
    }
}

}  // namespace dp::strategies
