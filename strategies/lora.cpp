#include "strategies/lora.h"
#include "strategies/text.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "protocol/errors.h"
#include "strategies/family.h"
#include "strategies/model_files.h"
#include "strategies/model_sizes.h"
#include "strategies/safetensors.h"

namespace dp::strategies {
namespace {

using protocol::ModelError;

std::string underscored(std::string s) {
    std::replace(s.begin(), s.end(), '.', '_');
    return s;
}

// Formats that are not plain LoRA, by a marker in a tensor's name.
struct Refused {
    const char* marker;
    const char* format;
};
constexpr Refused kRefused[] = {
    {"dora_scale", "DoRA (weight-decomposed LoRA)"},
    {"lora_magnitude_vector", "DoRA (weight-decomposed LoRA)"},
    {"lokr_w1", "LoKr"},
    {"lokr_w2", "LoKr"},
    {"hada_w1", "LoHa"},
    {"hada_w2", "LoHa"},
    {"lora_mid", "LoCon with Tucker mid weights"},
    {".oft_", "OFT"},
    {"oft_blocks", "OFT"},
    {".diff_b", "full weight differences (diff_b)"},
    {".diff", "full weight differences (diff)"},
    {"lora_B.bias", "LoRA with bias terms"},
    {"lora_up.bias", "LoRA with bias terms"},
};

// One LoRA pair of the file, by the module name it gives; each half's style (kSuffixes' index).
struct Pair {
    std::string down, up, alpha;
    int down_style = -1, up_style = -1;
};

// The suffixes of a pair's tensors, each format's.
struct Suffixes {
    const char* down;
    const char* up;
};
constexpr Suffixes kSuffixes[] = {
    {".lora_A.weight", ".lora_B.weight"},
    {".lora_down.weight", ".lora_up.weight"},
    {".lora.down.weight", ".lora.up.weight"},
    {".lora_A.default.weight", ".lora_B.default.weight"},
};

// Where a module name of the file points: a component, and the name inside it in the form given.
struct Target {
    std::string component;
    std::string module;     // dotted (diffusers' or the original layout's), or underscored (kohya)
    bool kohya = false;     // `module` has '_' for '.'
    bool original = false;  // diffusion_model.: the family's original layout, else diffusers' names
};

// Where the file's module name `name` points, by its prefix; false when no prefix or form fits.
bool target_of(const std::string& name, Target& t) {
    struct Prefix {
        const char* prefix;
        const char* component;
        bool kohya, original;
    };
    static const Prefix prefixes[] = {
        {"transformer.", "transformer", false, false},
        {"text_encoder.", "text_encoder", false, false},
        {"text_encoder_2.", "text_encoder_2", false, false},
        {"text_encoder_3.", "text_encoder_3", false, false},
        {"lora_unet_", "transformer", true, false},
        {"lora_transformer_", "transformer", true, false},
        {"lora_te1_", "text_encoder", true, false},
        {"lora_te_", "text_encoder", true, false},
        {"lora_te2_", "text_encoder_2", true, false},
        {"lora_te3_", "text_encoder_3", true, false},
        {"diffusion_model.", "transformer", false, true},
        {"base_model.model.", "transformer", false, false},
    };
    for (const Prefix& p : prefixes)
        if (starts_with(name, p.prefix)) {
            t = {p.component, name.substr(std::strlen(p.prefix)), p.kohya, p.original};
            return !t.module.empty();
        }
    t = {"transformer", name, false, false};  // an older diffusers file: the transformer's names bare
    return true;
}

// The base weights module `t` changes in `model`, or empty when it names none.
std::vector<LoraPart> parts_of(
    const Target& t, const FamilyFacts& family, const ModelTensors& model,
    const std::map<std::string, std::map<std::string, std::string>>& by_underscored) {
    const auto comp = model.find(t.component);
    if (comp == model.end()) return {};
    const auto& weights = comp->second;
    const bool original_names = family.lora_original_parts && t.component == "transformer";
    if (t.kohya) {
        if (original_names && family.lora_kohya_original) {
            const std::string original = family.lora_kohya_original(t.module);
            if (!original.empty()) return family.lora_original_parts(original, weights);
        }
        const auto& index = by_underscored.at(t.component);
        const auto it = index.find(t.module);
        if (it != index.end()) return {{it->second, {}}};
        return {};
    }
    if (t.original && family.lora_original_parts) {
        std::vector<LoraPart> parts = family.lora_original_parts(t.module, weights);
        if (!parts.empty()) return parts;
    }
    if (weights.count(t.module + ".weight")) return {{t.module, {}}};
    // transformers 5 names a bare CLIPTextModel's modules without "text_model." (FLUX's), which its
    // files may still hold, and the other way round.
    const std::string other =
        starts_with(t.module, "text_model.") ? t.module.substr(11) : "text_model." + t.module;
    if (t.component != "transformer" && weights.count(other + ".weight")) return {{other, {}}};
    return {};
}

// A scalar tensor's value (kohya's alpha), read from the file.
double scalar_value(const SafetensorsFile& file, const std::string& name) {
    const StTensorInfo& info = file.info(name);
    int64_t n = 1;
    for (int64_t d : info.shape) n *= d;
    if (n != 1)
        throw ModelError(file.path() + ": '" + name + "' must be one number (the alpha of its LoRA pair)");
    const std::byte* p = file.data(name);
    switch (info.dtype) {
        case StDType::kF64: {
            double v;
            std::memcpy(&v, p, 8);
            return v;
        }
        case StDType::kF32: {
            float v;
            std::memcpy(&v, p, 4);
            return v;
        }
        case StDType::kF16: {
            uint16_t h;
            std::memcpy(&h, p, 2);
            const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
            const double sign = (h & 0x8000) ? -1 : 1;
            if (exp == 0) return sign * std::ldexp(mant, -24);
            if (exp == 31) return mant ? NAN : sign * INFINITY;
            return sign * std::ldexp(mant + 1024, exp - 25);
        }
        case StDType::kBF16: {
            uint16_t h;
            std::memcpy(&h, p, 2);
            const uint32_t bits = static_cast<uint32_t>(h) << 16;
            float v;
            std::memcpy(&v, &bits, 4);
            return v;
        }
        case StDType::kI64: {
            int64_t v;
            std::memcpy(&v, p, 8);
            return static_cast<double>(v);
        }
        case StDType::kI32: {
            int32_t v;
            std::memcpy(&v, p, 4);
            return v;
        }
        default:
            throw ModelError(file.path() + ": '" + name + "' has dtype " + st_dtype_name(info.dtype) +
                             "; an alpha must be a float or an integer");
    }
}

// peft's adapter configuration of one component, from the header's metadata.
struct PeftConfig {
    bool given = false;
    double r = 0, alpha = 0;
    bool rslora = false;
    std::vector<std::pair<std::string, double>> rank_pattern, alpha_pattern;
};

// A switch of the adapter's metadata (use_rslora, use_dora): true or false, as peft writes it, or
// the text "true"/"false" ("True"/"False" as Python prints them). Anything else is refused naming
// the key and the file: read as false, "yes" would scale the adapter by another factor silently.
bool metadata_switch(const std::string& path, const std::string& key, const nlohmann::json& value) {
    if (value.is_boolean()) return value.get<bool>();
    const std::string text = value.is_string() ? value.get<std::string>() : "";
    if (text == "true" || text == "True") return true;
    if (text == "false" || text == "False") return false;
    throw ModelError(path + ": lora_adapter_metadata '" + key.substr(0, 80) + "' is " +
                     value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).substr(0, 40) +
                     "; expected true or false");
}

// diffusers writes the adapter configs as JSON under "lora_adapter_metadata", each key prefixed
// with its component ("transformer.r", "transformer.lora_alpha", ...).
std::map<std::string, PeftConfig> peft_configs(const SafetensorsFile& file) {
    std::map<std::string, PeftConfig> out;
    const auto it = file.metadata().find("lora_adapter_metadata");
    if (it == file.metadata().end()) return out;
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(it->second);
    } catch (const std::exception&) {
        throw ModelError(file.path() + ": its lora_adapter_metadata is not valid JSON");
    }
    if (!j.is_object()) throw ModelError(file.path() + ": its lora_adapter_metadata is not a JSON object");
    const auto bad = [&](const std::string& key) {
        return ModelError(file.path() + ": lora_adapter_metadata '" + key.substr(0, 80) + "' is not valid");
    };
    const auto patterns = [&](const std::string& key, const nlohmann::json& v) {
        if (!v.is_object()) throw bad(key);
        std::vector<std::pair<std::string, double>> p;
        for (const auto& [k, x] : v.items()) {
            if (!x.is_number() || !std::isfinite(x.get<double>())) throw bad(key);
            p.emplace_back(k, x.get<double>());
        }
        return p;
    };
    for (const auto& [key, value] : j.items()) {
        const auto dot = key.rfind('.');
        if (dot == std::string::npos) continue;
        PeftConfig& c = out[key.substr(0, dot)];
        c.given = true;
        const std::string field = key.substr(dot + 1);
        if (field == "r" || field == "lora_alpha") {
            if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() <= 0)
                throw bad(key);
            (field == "r" ? c.r : c.alpha) = value.get<double>();
        } else if (field == "use_rslora") {
            c.rslora = metadata_switch(file.path(), key, value);
        } else if (field == "use_dora" && metadata_switch(file.path(), key, value)) {
            throw ModelError(file.path() +
                             ": a DoRA adapter (use_dora); dp-launch runs plain LoRA adapters only");
        } else if (field == "rank_pattern") {
            c.rank_pattern = patterns(key, value);
        } else if (field == "alpha_pattern") {
            c.alpha_pattern = patterns(key, value);
        }
    }
    return out;
}

// peft's pattern lookup: the first key that matches the end of the module's name at a dot.
const double* pattern_value(const std::vector<std::pair<std::string, double>>& pattern,
                            const std::string& module, const std::string& path) {
    for (const auto& [key, value] : pattern) {
        if (module == key || ends_with(module, "." + key)) return &value;
        try {
            if (std::regex_match(module, std::regex("(.*\\.)?(" + key + ")"))) return &value;
        } catch (const std::regex_error&) {
            throw ModelError(path + ": lora_adapter_metadata pattern '" + key.substr(0, 80) +
                             "' is not a valid pattern");
        }
    }
    return nullptr;
}

std::string shape_text(const std::vector<int64_t>& shape) {
    std::string out = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
    return out + "]";
}

}  // namespace

ModelTensors adapter_targets(const std::string& model_dir, const ParallelSpec& spec,
                             const std::string& variant) {
    ModelTensors out;
    for (const std::string& component : spec.components) {
        if (component != "transformer" && !starts_with(component, "text_encoder")) continue;
        const std::string dir = model_dir + "/" + component;
        if (!is_directory(dir)) continue;
        try {
            out[component] = tensor_shapes(dir, variant);
        } catch (const protocol::Error&) {
            throw;
        } catch (const std::exception& e) {
            throw ModelError(e.what());
        }
    }
    return out;
}

std::string adapter_family_guess(const std::vector<std::string>& names) {
    const auto any = [&](const std::vector<const char*>& markers) {
        for (const std::string& n : names)
            for (const char* m : markers)
                if (n.find(m) != std::string::npos) return true;
        return false;
    };
    if (any({"down_blocks", "up_blocks", "mid_block", "input_blocks", "output_blocks", "lora_unet_down",
             "lora_unet_up", "lora_unet_mid"}))
        return "a UNet model (SD 1.x / SDXL)";
    std::vector<const FamilyFacts*> order = families();
    std::stable_sort(order.begin(), order.end(), [](const FamilyFacts* a, const FamilyFacts* b) {
        return a->guess_order < b->guess_order;
    });
    for (const FamilyFacts* f : order)
        if (!f->name_markers.empty() && any(f->name_markers)) return f->spec.display_name;
    return {};
}

namespace {

// How messages name a pair style: "lora_A/lora_B".
std::string style_name(int style) {
    const auto part = [](const char* suffix) {
        const std::string s = suffix;
        return s.substr(1, s.size() - 1 - std::strlen(".weight"));
    };
    return part(kSuffixes[style].down) + "/" + part(kSuffixes[style].up);
}

// Half `name` (`down` or not) of style `style` into `pair`. Two halves for one place, or halves of
// two styles (lora_A/lora_B beside lora_down/lora_up), are refused naming the module and both
// styles: which one was meant cannot be told, and taking one would drop the other without a word.
void place_half(const std::string& path, const std::string& module, const std::string& name, bool down,
                int style, Pair& pair) {
    std::string& half = down ? pair.down : pair.up;
    int& half_style = down ? pair.down_style : pair.up_style;
    const int other_style = down ? pair.up_style : pair.down_style;
    const std::string& other = down ? pair.up : pair.down;
    const std::string& clash = !half.empty() ? half : other_style >= 0 && other_style != style ? other : "";
    if (!clash.empty())
        throw ModelError(path + ": layer '" + module.substr(0, 120) +
                         "' has LoRA tensors in two pair styles, " +
                         style_name(!half.empty() ? half_style : other_style) + " ('" + clash.substr(0, 160) +
                         "') and " + style_name(style) + " ('" + name.substr(0, 160) +
                         "'); a layer takes one pair (remove the other, or convert the file)");
    half = name;
    half_style = style;
}

// The file's LoRA pairs by module name, and the tensors that belong to no complete pair. Throws
// ModelError naming `path` for a layer with pairs in two styles.
void pair_tensors(const std::string& path, const std::vector<std::string>& names,
                  std::map<std::string, Pair>& pairs, std::vector<std::string>& strays) {
    for (const std::string& name : names) {
        bool placed = false;
        for (int style = 0; style < static_cast<int>(std::size(kSuffixes)) && !placed; ++style) {
            const Suffixes& s = kSuffixes[style];
            for (const bool down : {true, false}) {
                const char* suffix = down ? s.down : s.up;
                if (placed || !ends_with(name, suffix)) continue;
                const std::string module = name.substr(0, name.size() - std::strlen(suffix));
                place_half(path, module, name, down, style, pairs[module]);
                placed = true;
            }
        }
        if (!placed && ends_with(name, ".alpha")) {
            pairs[name.substr(0, name.size() - 6)].alpha = name;
            placed = true;
        }
        if (!placed) strays.push_back(name);
    }
    for (const auto& [module, p] : pairs)
        if (p.down.empty() || p.up.empty())
            strays.push_back(p.down.empty() && p.up.empty() ? p.alpha : (p.down.empty() ? p.up : p.down));
}

// Each component's 2-D weights by their underscored module names (kohya's), to the dotted ones.
std::map<std::string, std::map<std::string, std::string>> underscored_modules(const ModelTensors& model) {
    std::map<std::string, std::map<std::string, std::string>> by_underscored;
    for (const auto& [component, weights] : model) {
        auto& index = by_underscored[component];
        for (const auto& [name, shape] : weights)
            if (ends_with(name, ".weight") && shape.size() == 2) {
                const std::string module = name.substr(0, name.size() - 7);
                index[underscored(module)] = module;
                // kohya names a CLIP encoder's modules with "text_model_" whichever way its files do.
                if (component != "transformer") {
                    if (starts_with(module, "text_model."))
                        index[underscored(module.substr(11))] = module;
                    else
                        index.emplace("text_model_" + underscored(module), module);
                }
            }
    }
    return by_underscored;
}

// A pair of the file and the base weights it changes.
struct Mapped {
    const Pair* pair;
    std::string module;
    Target target;
    std::vector<LoraPart> parts;
};

// alpha / rank of pair `m` (use_rslora: alpha / sqrt(rank)): kohya's scalar, peft's config (with
// its patterns), else diffusers' default (alpha = rank). Throws ModelError naming the file.
double alpha_scale(const SafetensorsFile& file, const Mapped& m, int64_t rank,
                   const std::map<std::string, PeftConfig>& configs) {
    const std::string& path = file.path();
    const Pair& p = *m.pair;
    double alpha = static_cast<double>(rank);
    bool rslora = false;
    const auto config = configs.find(m.target.component);
    if (!p.alpha.empty()) {
        alpha = scalar_value(file, p.alpha);
    } else if (config != configs.end() && config->second.given) {
        const PeftConfig& c = config->second;
        const double* a = pattern_value(c.alpha_pattern, m.target.module, path);
        alpha = a ? *a : (c.alpha > 0 ? c.alpha : static_cast<double>(rank));
        rslora = c.rslora;
        const double* r = pattern_value(c.rank_pattern, m.target.module, path);
        const double config_rank = r ? *r : c.r;
        if (config_rank > 0 && config_rank != static_cast<double>(rank))
            throw ModelError(path + ": '" + p.down + "' has rank " + std::to_string(rank) +
                             " but the adapter's metadata says " +
                             std::to_string(static_cast<int64_t>(config_rank)));
    }
    if (!std::isfinite(alpha))
        throw ModelError(path + ": the alpha of '" + m.module.substr(0, 120) + "' is not a finite number");
    return rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

// The terms of pair `m` into `layout`, each part's shape checked against its weight; `changed`
// holds the weights changed so far. `looks`: what the adapter looks made for, for messages.
void add_terms(const SafetensorsFile& file, const Mapped& m, const ModelTensors& model,
               const std::map<std::string, PeftConfig>& configs, const std::string& looks,
               std::set<std::string>& changed, LoraLayout& layout) {
    const std::string& path = file.path();
    const Pair& p = *m.pair;
    const Target& t = m.target;
    const StTensorInfo& down = file.info(p.down);
    const StTensorInfo& up = file.info(p.up);
    if (down.shape.size() != 2 || up.shape.size() != 2 || down.shape[0] != up.shape[1] || down.shape[0] < 1)
        throw ModelError(path + ": '" + p.down + "' " + shape_text(down.shape) + " and '" + p.up + "' " +
                         shape_text(up.shape) + " are no LoRA pair (down [rank, in], up [out, rank])");
    const int64_t rank = down.shape[0];
    const double scale = alpha_scale(file, m, rank, configs);
    const auto& weights = model.at(t.component);
    int64_t rows_taken = 0;
    for (const LoraPart& part : m.parts) {
        const std::string weight = part.module + ".weight";
        const std::vector<int64_t>& shape = weights.at(weight);
        int64_t rows = 0;
        for (const auto& [first, count] : part.rows) rows += count;
        if (part.rows.empty()) rows = up.shape[0];
        if (shape.size() != 2 || shape[1] != down.shape[1] || shape[0] != rows)
            throw ModelError(
                path + ": '" + p.up + "' x '" + p.down + "' changes " + t.component + " " + weight + " by [" +
                std::to_string(rows) + ", " + std::to_string(down.shape[1]) + "], but the weight is " +
                shape_text(shape) +
                (looks.empty() ? " (is the adapter made for another size of this model?)" : looks));
        for (const auto& [first, count] : part.rows)
            if (first < 0 || first + count > up.shape[0])
                throw ModelError(path + ": '" + p.up + "' " + shape_text(up.shape) +
                                 " has too few rows for " + t.component + " " + weight);
        rows_taken += rows;
        if (!changed.insert(t.component + "/" + weight).second)
            throw ModelError(path + ": changes " + t.component + " " + weight + " twice");
        layout.terms.push_back({t.component, weight, p.down, p.up, part.rows, rank, scale});
    }
    if (rows_taken != up.shape[0])
        throw ModelError(path + ": '" + p.up + "' has " + std::to_string(up.shape[0]) + " rows but " +
                         t.component + "'s weights it changes take " + std::to_string(rows_taken));
}

// A float dtype's exponent and mantissa bits: an element whose exponent bits are all set is NaN
// (mantissa not zero) or an infinity. F8_E4M3 (e4m3fn) has no infinity: only S.1111.111 is NaN.
struct FloatBits {
    StDType dtype;
    uint64_t exponent, mantissa;
};
constexpr FloatBits kFloatBits[] = {
    {StDType::kF64, 0x7ff0000000000000ull, 0x000fffffffffffffull},
    {StDType::kF32, 0x7f800000u, 0x007fffffu},
    {StDType::kF16, 0x7c00u, 0x03ffu},
    {StDType::kBF16, 0x7f80u, 0x007fu},
    {StDType::kF8E4M3, 0x7fu, 0x7fu},
    {StDType::kF8E5M2, 0x7cu, 0x03u},
};

// The index of the first element of the `n` elements of `data`, each a `Bits`, whose `exponent`
// bits are all set, or n. Blocks of elements are tested without an early exit, so that the
// compiler vectorizes the test (an adapter of 120 MB: about as long as its SHA-256).
template <class Bits>
std::size_t first_all_set(const std::byte* data, std::size_t n, uint64_t exponent) {
    constexpr std::size_t kBlock = 4096;
    const auto e = static_cast<Bits>(exponent);
    const auto element = [&](std::size_t i) {
        Bits b;
        std::memcpy(&b, data + i * sizeof(Bits), sizeof(Bits));
        return b;
    };
    for (std::size_t start = 0; start < n; start += kBlock) {
        const std::size_t end = std::min(n, start + kBlock);
        bool any = false;
        for (std::size_t i = start; i < end; ++i) any |= (element(i) & e) == e;
        if (!any) continue;
        for (std::size_t i = start; i < end; ++i)
            if ((element(i) & e) == e) return i;
    }
    return n;
}

// "NaN" or "an infinite value" for the first element of `info` that is not finite; empty when all
// are (and for integer dtypes, which hold no such value). `at`: its index.
std::string first_non_finite(const StTensorInfo& info, const std::byte* data, std::size_t& at) {
    for (const FloatBits& f : kFloatBits) {
        if (f.dtype != info.dtype) continue;
        const std::size_t size = st_dtype_size(info.dtype), n = info.nbytes / size;
        at = size == 8   ? first_all_set<uint64_t>(data, n, f.exponent)
             : size == 4 ? first_all_set<uint32_t>(data, n, f.exponent)
             : size == 2 ? first_all_set<uint16_t>(data, n, f.exponent)
                         : first_all_set<uint8_t>(data, n, f.exponent);
        if (at == n) return {};
        uint64_t b = 0;
        std::memcpy(&b, data + at * size, size);
        return b & f.mantissa ? "NaN" : "an infinite value";
    }
    return {};
}

}  // namespace

void check_lora_values(const LoraLayout& layout) {
    const std::shared_ptr<SafetensorsFile> file = SafetensorsFile::open(layout.path);
    std::set<std::string> seen;
    for (const LoraTerm& term : layout.terms)
        for (const std::string& name : {term.down, term.up}) {
            if (!seen.insert(name).second) continue;
            const StTensorInfo& info = file->info(name);
            std::size_t at = 0;
            const std::string what = first_non_finite(info, file->data(name), at);
            if (what.empty()) continue;
            throw ModelError(layout.path + ": tensor '" + name.substr(0, 160) + "' holds " + what +
                             " at element " + std::to_string(at) + " of " +
                             std::to_string(info.nbytes / st_dtype_size(info.dtype)) +
                             "; every image made with this adapter would be NaN (a broken or overflowed "
                             "file: export it again)");
        }
}

LoraLayout read_lora_layout(const std::string& path, const ParallelSpec& spec, const ModelTensors& model) {
    if (!model_file_exists(path))
        throw protocol::Error(
            path + ": " +
                missing_file_text(path, "no such adapter file (--lora or a prompt line's \"lora\")"),
            protocol::kExitNoInput);
    return read_lora_layout(*SafetensorsFile::open(path), spec, model);  // a valid safetensors file, or 65
}

LoraLayout read_lora_layout(const SafetensorsFile& file, const ParallelSpec& spec,
                            const ModelTensors& model) {
    const std::string& path = file.path();
    const FamilyFacts& family = facts_of(spec);
    LoraLayout layout;
    layout.path = path;
    std::vector<std::string> names;
    for (const auto& [name, info] : file.tensors()) names.push_back(name);
    if (names.empty()) throw ModelError(path + ": holds no tensors (is it a LoRA adapter?)");
    for (const std::string& name : names)
        for (const Refused& r : kRefused)
            if (name.find(r.marker) != std::string::npos)
                throw ModelError(
                    path + ": a " + r.format + " adapter ('" + name.substr(0, 120) +
                    "'); dp-launch runs plain LoRA adapters (lora_A/lora_B or lora_down/lora_up)");

    std::map<std::string, Pair> pairs;
    std::vector<std::string> unmapped;
    pair_tensors(path, names, pairs, unmapped);
    const auto by_underscored = underscored_modules(model);
    const std::map<std::string, PeftConfig> configs = peft_configs(file);
    // First where each pair points: keys of another model are named before any shape is compared.
    bool kohya = false, original = false;
    std::vector<Mapped> mapped;
    for (const auto& [module, p] : pairs) {
        if (p.down.empty() || p.up.empty()) continue;
        Target t;
        std::vector<LoraPart> parts;
        if (target_of(module, t)) parts = parts_of(t, family, model, by_underscored);
        if (parts.empty()) {
            unmapped.push_back(p.up);
            continue;
        }
        kohya = kohya || t.kohya;
        original = original || t.original;
        mapped.push_back({&p, module, t, std::move(parts)});
    }
    const std::string guess = adapter_family_guess(names);
    const std::string looks = names_fit(family, guess) ? "" : "; the adapter looks made for " + guess;
    if (!unmapped.empty()) {
        std::string list;
        for (std::size_t i = 0; i < unmapped.size() && i < 3; ++i)
            list += (i ? ", " : "") + std::string("'") + unmapped[i].substr(0, 120) + "'";
        if (unmapped.size() > 3) list += " and " + std::to_string(unmapped.size() - 3) + " more";
        throw ModelError(path + ": " + std::to_string(unmapped.size()) + " of its " +
                         std::to_string(names.size()) + " tensors change no weight of this " +
                         spec.display_name + " model: " + list + looks);
    }
    std::set<std::string> changed;  // component/weight: a weight changed twice by one file is a mistake
    for (const Mapped& m : mapped) add_terms(file, m, model, configs, looks, changed, layout);
    layout.format = kohya      ? family.kohya_format
                    : original ? "original layout (diffusion_model.)"
                               : "diffusers/PEFT";
    return layout;
}

}  // namespace dp::strategies
