#include "strategies/original_layouts.h"
#include "strategies/text.h"

#include <algorithm>
#include <set>

#include "protocol/errors.h"

namespace dp::strategies {
namespace {

using protocol::ModelError;

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

}  // namespace

const CheckpointTensor* LayoutMapper::find(const std::string& name) const {
    const auto it = file.find(out.prefix + name);
    return it == file.end() ? nullptr : &it->second;
}

void LayoutMapper::place(const ModuleRename& module, int64_t width, bool swap_halves) {
    place(module.from, std::vector<std::string>(module.to.begin(), module.to.end()), width, swap_halves);
}

void LayoutMapper::place(const std::string& from, const std::vector<std::string>& to, int64_t width,
                         bool swap_halves) {
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

void place_blocks(LayoutMapper& m, int64_t width, const std::string& from, const std::string& to,
                  const std::vector<ModuleRename>& modules, const ModuleRename* halved) {
    const std::set<int64_t> blocks = blocks_of(m.file, m.out.prefix + from);
    for (const int64_t n : blocks) {
        const std::string block = std::to_string(n) + ".";
        const auto place = [&](const ModuleRename& f, bool swap) {
            std::vector<std::string> names;
            for (const char* t : f.to) names.push_back(to + block + t);
            m.place(from + block + f.from, names, width, swap);
        };
        for (const ModuleRename& f : modules) place(f, false);
        if (halved) place(*halved, n == *blocks.rbegin());
    }
}

std::vector<LoraPart> stacked_parts(const std::vector<std::string>& modules,
                                    const std::map<std::string, std::vector<int64_t>>& weights) {
    std::vector<LoraPart> parts;
    int64_t first = 0;
    for (const std::string& m : modules) {
        const auto it = weights.find(m + ".weight");
        if (it == weights.end() || it->second.size() != 2) return {};
        parts.push_back({m, {{first, it->second[0]}}});
        first += it->second[0];
    }
    return parts;
}

void mark_unplaced(const LayoutMapper& m) {
    for (const auto& [name, info] : m.file)
        if (starts_with(name, m.out.prefix) && !m.used.count(name) && name != "scaled_fp8")
            m.out.tensors["(unplaced) " + name] = StoredTensor{name, {}, {}};
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
