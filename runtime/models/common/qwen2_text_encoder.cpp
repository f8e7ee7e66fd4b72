#include "runtime/models/common/qwen2_text_encoder.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "runtime/io/config_json.h"
#include "runtime/io/errors.h"
#include "runtime/models/common/layers.h"
#include "runtime/parallel/attention.h"
#include "runtime/parallel/sequence_shard.h"

namespace dp::runtime {
namespace {

// The additive attention bias [B or 1, heads, L, L]: 0 where a query may see a key (the key is
// not after it and, with a mask, not a pad), -inf elsewhere, as transformers masks: a pad query
// after real tokens sees them (FLUX.2-klein reads its pads' states). A query that would see no key
// at all (a pad with only pads before it: left padding) sees itself, so that nothing is NaN; its
// output is then zeroed (Note [blind queries]).
at::Tensor attention_bias(const at::Tensor& mask, int64_t tokens, int64_t heads,
                          const at::TensorOptions& options) {
    const at::TensorOptions longs = options.dtype(at::kLong);
    const at::Tensor query = at::arange(tokens, longs).unsqueeze(1),
                     key = at::arange(tokens, longs).unsqueeze(0);
    at::Tensor allowed = (key <= query).view({1, 1, tokens, tokens});
    if (mask.defined()) {
        allowed = allowed.logical_and(mask.to(options.device()).ne(0).view({mask.size(0), 1, 1, tokens}));
        const at::Tensor blind = allowed.any(-1, /*keepdim=*/true).logical_not();
        allowed = allowed.logical_or(blind.logical_and((key == query).view({1, 1, tokens, tokens})));
    }
    const at::Tensor bias = at::where(allowed, at::scalar_tensor(0.0, options),
                                      at::scalar_tensor(-std::numeric_limits<double>::infinity(), options));
    return bias.expand({bias.size(0), heads, tokens, tokens});
}

// The object holding the text model's keys: `text_config` when present (transformers 5, as
// Qwen2_5_VLConfig reads it), else the top level.
ConfigJson text_part(const ConfigJson& top) {
    if (!top.has("text_config")) return top;
    const nlohmann::json& t = top.raw()["text_config"];
    if (!t.is_object()) top.fail("text_config", "must be an object");
    return ConfigJson(t.dump(), top.path() + ": text_config");
}

}  // namespace

namespace {

// Qwen3Config's and MistralConfig's own keys (Note [Qwen3 text encoders]): head_dim,
// attention_bias; Qwen3's qk-norm; every layer of full attention (Mistral: a sliding window, if
// any, of at least the 1024 tokens a prompt may have, where it changes nothing).
void read_given_heads(const ConfigJson& c, Qwen2TextConfig& cfg, bool qwen3) {
    cfg.qwen3 = qwen3;
    cfg.mistral = !qwen3;
    cfg.qkv_bias = c.boolean("attention_bias", false);
    if (cfg.mistral && c.has("sliding_window") && !c.raw()["sliding_window"].is_null() &&
        c.integer("sliding_window", 0, 0, int64_t{1} << 40) < 1024)
        c.fail("sliding_window", "is below 1024 tokens; only attention over the whole prompt is supported");
    cfg.explicit_head_dim = c.integer("head_dim", cfg.hidden_size / cfg.num_attention_heads, 2, 4096);
    if (cfg.explicit_head_dim % 2 != 0)
        c.fail("head_dim", "is " + std::to_string(cfg.explicit_head_dim) + "; RoPE needs an even head size");
    if (c.has("layer_types") && c.raw()["layer_types"].is_array())
        for (const nlohmann::json& t : c.raw()["layer_types"])
            if (t != "full_attention")
                c.fail("layer_types",
                       "names " + t.dump() + "; only full_attention in every layer is supported");
}

}  // namespace

Qwen2TextConfig Qwen2TextConfig::from_json_text(const std::string& text, const std::string& path) {
    const ConfigJson top(text, path);
    const std::string top_type = top.string("model_type", "qwen2_5_vl");
    // The outer model_type and its text_config's: Qwen2.5-VL, Qwen3, Mistral 3 (Note [Qwen3 text encoders]).
    static const std::map<std::string, std::string> kinds = {{"qwen2_5_vl", "qwen2_5_vl_text"},
                                                             {"qwen2_5_vl_text", "qwen2_5_vl_text"},
                                                             {"qwen3", "qwen3"},
                                                             {"mistral3", "mistral"},
                                                             {"mistral", "mistral"}};
    const auto kind = kinds.find(top_type);
    if (kind == kinds.end())
        top.fail("model_type",
                 "is '" + top_type +
                     "'; supported: qwen2_5_vl (Qwen2.5-VL, Qwen-Image's text_encoder), qwen3 "
                     "(Qwen3, Z-Image's and FLUX.2-klein's) and mistral3 (Mistral 3, FLUX.2-dev's)");
    const bool nested = top.has("text_config");
    const ConfigJson c = text_part(top);
    if (nested && c.has("model_type") && c.string("model_type", "") != kind->second)
        c.fail("model_type", "is '" + c.string("model_type", "") + "'; supported: " + kind->second);
    Qwen2TextConfig cfg;
    cfg.vocab_size = c.integer("vocab_size", cfg.vocab_size, 1, 1 << 24);
    cfg.hidden_size = c.integer("hidden_size", cfg.hidden_size, 1, 1 << 17);
    cfg.intermediate_size = c.integer("intermediate_size", cfg.intermediate_size, 1, 1 << 20);
    cfg.num_hidden_layers = c.integer("num_hidden_layers", cfg.num_hidden_layers, 1, 1024);
    cfg.num_attention_heads = c.integer("num_attention_heads", cfg.num_attention_heads, 1, 4096);
    cfg.num_key_value_heads = c.integer("num_key_value_heads", cfg.num_attention_heads, 1, 4096);
    cfg.rms_norm_eps = c.number("rms_norm_eps", cfg.rms_norm_eps, 0, 1);
    cfg.hidden_act = c.string("hidden_act", cfg.hidden_act);
    if (cfg.hidden_act != "silu")
        c.fail("hidden_act", "is '" + cfg.hidden_act + "'; supported: silu (SwiGLU)");
    if (kind->second != "qwen2_5_vl_text") read_given_heads(c, cfg, kind->second == "qwen3");
    if ((!cfg.explicit_head_dim && cfg.hidden_size % cfg.num_attention_heads != 0) || cfg.head_dim() % 2 != 0)
        c.fail("num_attention_heads", "is " + std::to_string(cfg.num_attention_heads) +
                                          "; it must divide hidden_size " + std::to_string(cfg.hidden_size) +
                                          " into heads of an even size");
    if (cfg.num_attention_heads % cfg.num_key_value_heads != 0)
        c.fail("num_key_value_heads", "is " + std::to_string(cfg.num_key_value_heads) +
                                          "; it must divide num_attention_heads " +
                                          std::to_string(cfg.num_attention_heads));
    if (c.boolean("use_sliding_window", false))
        c.fail("use_sliding_window", "is true; only full attention in every layer is supported");

    // As Qwen2_5_VLTextConfig reads RoPE: rope_scaling (older files) replaces rope_parameters;
    // rope_theta from that object, else the key beside it, else 1e6.
    const char* rope_key =
        c.has("rope_scaling") && !c.raw()["rope_scaling"].empty() ? "rope_scaling" : "rope_parameters";
    if (c.has(rope_key)) {
        if (!c.raw()[rope_key].is_object()) c.fail(rope_key, "must be an object");
        const ConfigJson rope(c.raw()[rope_key].dump(), c.path() + ": " + rope_key);
        const std::string type = rope.string("rope_type", rope.string("type", "default"));
        if (type != "default" && type != "mrope")
            rope.fail(rope.has("rope_type") ? "rope_type" : "type",
                      "is '" + type + "'; supported: default or mrope (Qwen2.5-VL's, without scaling)");
        cfg.rope_theta = rope.number("rope_theta", c.number("rope_theta", cfg.rope_theta, 1, 1e12), 1, 1e12);
        if (rope.has("mrope_section")) {
            const nlohmann::json& s = rope.raw()["mrope_section"];
            int64_t sum = 0;
            bool ints = s.is_array() && s.size() == 3;
            cfg.mrope_section.clear();
            for (const nlohmann::json& v : s) {
                ints = ints && v.is_number_integer() && v.get<int64_t>() >= 0;
                if (ints) sum += v.get<int64_t>(), cfg.mrope_section.push_back(v.get<int64_t>());
            }
            if (!ints || sum != cfg.head_dim() / 2)
                rope.fail("mrope_section", "is " + s.dump().substr(0, 60) +
                                               "; it must list 3 integers summing to "
                                               "head_dim / 2 = " +
                                               std::to_string(cfg.head_dim() / 2));
        }
    } else {
        cfg.rope_theta = c.number("rope_theta", cfg.rope_theta, 1, 1e12);
    }
    return cfg;
}

Qwen2TextEncoder::~Qwen2TextEncoder() = default;

Qwen2TextEncoder::Qwen2TextEncoder(const Qwen2TextConfig& config, WeightStore& w, const TensorGroup& tp,
                                   const strategies::ParallelSpec& spec, const Qwen2VisionConfig* vision,
                                   int64_t layers)
    : config_(config) {
    const int64_t d = config.hidden_size, hd = config.head_dim(), kv = config.num_key_value_heads;
    const int64_t heads = config.num_attention_heads, group = config.group_size(),
                  ff = config.intermediate_size;
    if (kv < tp.size)
        throw ModelError(std::string(config.qwen3     ? "Qwen3"
                                     : config.mistral ? "Mistral 3"
                                                      : "Qwen2.5-VL") +
                         " text encoder: " + std::to_string(kv) +
                         " key-value heads over a tensor-parallel degree of " + std::to_string(tp.size) +
                         ": a rank would hold none (each rank keeps whole GQA groups)");
    local_kv_heads_ = tp.share(kv);
    const int64_t loaded_before = w.taken_bytes();
    const double eps = config.rms_norm_eps;  // Qwen2's RMS norms (Note [Qwen2 dtypes])
    // transformers 5's module names, 4's (and what 5 still writes for Mistral 3), a bare model's.
    std::string base = "model.";
    for (const char* prefix : {"model.language_model.", "language_model.model.", ""})
        if (w.has(std::string(prefix) + "embed_tokens.weight")) {
            base = prefix;
            break;
        }
    const int64_t loaded = layers < 0 ? config.num_hidden_layers : std::min(layers, config.num_hidden_layers);
    if (vision) {
        vision_ = std::make_unique<Qwen2VisionTower>(*vision, w, tp);
    } else {
        w.skip_prefix("visual.");
        w.skip_prefix("model.visual.");
    }
    for (const char* unused : {"lm_head.", "language_model.lm_head.", "vision_tower.", "model.vision_tower.",
                               "multi_modal_projector.", "model.multi_modal_projector."})
        w.skip_prefix(unused);  // Mistral 3's vision side, and every model's head
    embedding_ = w.take(base + "embed_tokens.weight", {config.vocab_size, d});
    // Heads split by GQA groups: a unit of q's features is one group's query heads, k's and v's
    // one key-value head; the MLP by single features (Note [uneven heads]).
    const LinearLoader load(w, spec, tp);
    auto linear = [&](const std::string& name, int64_t in, int64_t out, bool bias, int64_t unit) {
        return load(name, in, out, unit, bias);
    };
    const bool bias = config.qkv_bias;
    for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
        const std::string p = base + "layers." + std::to_string(i) + ".";
        if (i >= loaded) {  // hidden states past the pipeline's: never read
            w.skip_prefix(p);
            continue;
        }
        Layer l;
        l.input_norm = RMSNorm::load(w, p + "input_layernorm", d, eps, true, RmsRounding::kQwen2);
        l.q = linear(p + "self_attn.q_proj", d, heads * hd, bias, group * hd);
        l.k = linear(p + "self_attn.k_proj", d, kv * hd, bias, hd);
        l.v = linear(p + "self_attn.v_proj", d, kv * hd, bias, hd);
        if (config.qwen3) {
            l.q_norm = RMSNorm::load(w, p + "self_attn.q_norm", hd, eps, true, RmsRounding::kQwen2);
            l.k_norm = RMSNorm::load(w, p + "self_attn.k_norm", hd, eps, true, RmsRounding::kQwen2);
        }
        l.o = linear(p + "self_attn.o_proj", heads * hd, d, false, group * hd);
        l.post_attention_norm =
            RMSNorm::load(w, p + "post_attention_layernorm", d, eps, true, RmsRounding::kQwen2);
        l.gate = linear(p + "mlp.gate_proj", d, ff, false, 1);
        l.up = linear(p + "mlp.up_proj", d, ff, false, 1);
        l.down = linear(p + "mlp.down_proj", ff, d, false, 1);
        layers_.push_back(std::move(l));
    }
    if (loaded == config.num_hidden_layers)
        final_norm_ = RMSNorm::load(w, base + "norm", d, eps, true, RmsRounding::kQwen2);
    else
        w.skip_prefix(base + "norm.");
    parameter_bytes_ = w.taken_bytes() - loaded_before;
    const at::TensorOptions floats = at::TensorOptions().dtype(at::kFloat).device(w.device());
    inv_freq_ = rope_frequencies(hd, config.rope_theta, floats);
}

at::Tensor Qwen2TextEncoder::forward(const at::Tensor& input_ids, const at::Tensor& mask) const {
    return forward(input_ids, mask, {}, {}, -1);
}

at::Tensor Qwen2TextEncoder::forward(const at::Tensor& input_ids, const at::Tensor& mask,
                                     const at::Tensor& position_streams, const at::Tensor& images,
                                     int64_t image_token) const {
    if (!final_norm_.weight.defined())
        throw InternalError("Qwen2TextEncoder::forward: the final norm was not loaded (layers)");
    return run(input_ids, mask, position_streams, images, image_token, {}).front();
}

std::vector<at::Tensor> Qwen2TextEncoder::hidden_states(const at::Tensor& ids, const at::Tensor& mask,
                                                        const std::vector<int64_t>& indices) const {
    const int64_t all = config_.num_hidden_layers, loaded = static_cast<int64_t>(layers_.size());
    std::vector<int64_t> wanted;
    for (int64_t i : indices) {
        const int64_t at = i < 0 ? all + 1 + i : i;
        if (at < 0 || at > all || (at > loaded && at != all) || (at == all && loaded < all))
            throw ModelError("the text encoder's hidden_states[" + std::to_string(i) + "]: it has " +
                             std::to_string(all) + " layers, " + std::to_string(loaded) + " of them loaded");
        wanted.push_back(at);
    }
    std::vector<int64_t> sorted = wanted;
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    const std::vector<at::Tensor> got = run(ids, mask, {}, {}, -1, sorted);
    std::vector<at::Tensor> out;
    for (int64_t at : wanted)
        out.push_back(got[static_cast<std::size_t>(std::lower_bound(sorted.begin(), sorted.end(), at) -
                                                   sorted.begin())]);
    return out;
}

std::vector<at::Tensor> Qwen2TextEncoder::run(const at::Tensor& input_ids, const at::Tensor& mask,
                                              const at::Tensor& position_streams, const at::Tensor& images,
                                              int64_t image_token, const std::vector<int64_t>& wanted) const {
    if (input_ids.dim() != 2) throw InternalError("Qwen2TextEncoder::forward: ids must be [batch, tokens]");
    if (mask.defined() && mask.sizes() != input_ids.sizes())
        throw InternalError("Qwen2TextEncoder::forward: the mask must have the ids' shape [batch, tokens]");
    const at::Tensor ids = input_ids.to(embedding_.device(), at::kLong);
    const int64_t tokens = ids.size(1), group = config_.group_size();
    const int64_t q_heads = local_kv_heads_ * group;
    at::Tensor x = at::embedding(embedding_, ids);
    if (images.defined()) {  // the vision tower's tokens in the image tokens' places, in order
        const at::Tensor places = ids.eq(image_token);
        if (places.sum().item<int64_t>() != images.size(0) || images.size(-1) != x.size(-1))
            throw ModelError("the prompt has " + std::to_string(places.sum().item<int64_t>()) +
                             " image tokens and the vision encoder made " + c10::str(images.sizes()));
        x = x.masked_scatter(places.unsqueeze(-1), images.to(x.device(), x.scalar_type()));
    }
    // Note [Qwen2.5-VL text positions]: positions 0 .. L-1 on every row, one rotary stream; with
    // images, each stream's section of the frequencies from its own positions.
    at::Tensor freqs;  // [L, head_dim / 2], or [B, 1, L, head_dim / 2]
    if (!position_streams.defined()) {
        freqs = at::arange(tokens, inv_freq_.options()).unsqueeze(1) * inv_freq_.unsqueeze(0);
    } else {
        const std::vector<int64_t>& sections = config_.mrope_section;
        if (sections[0] + sections[1] + sections[2] != config_.head_dim() / 2)
            throw ModelError(
                "the text encoder's config gives no rope_parameters.mrope_section summing to "
                "head_dim / 2 (" +
                std::to_string(config_.head_dim() / 2) + "), which a prompt with images needs");
        std::vector<at::Tensor> parts;
        int64_t first = 0;
        for (int64_t s = 0; s < 3; ++s) {
            const int64_t width = config_.mrope_section[static_cast<std::size_t>(s)];
            const at::Tensor pos = position_streams[s].to(inv_freq_.device(), at::kFloat);  // [B, L]
            parts.push_back(pos.unsqueeze(-1) * inv_freq_.narrow(0, first, width));
            first += width;
        }
        freqs = at::cat(parts, -1).unsqueeze(1);
    }
    const at::Tensor angles = at::cat({freqs, freqs}, -1);
    const at::Tensor cos = angles.cos().to(x.scalar_type()), sin = angles.sin().to(x.scalar_type());
    auto rotate = [&](const at::Tensor& t) { return t * cos + rotate_half(t) * sin; };
    const at::Tensor bias = attention_bias(mask, tokens, q_heads, x.options());
    // Note [blind queries]: 1 where a query sees some key, 0 where it sees none (its output zeroed).
    const at::Tensor sees =
        mask.defined() ? (mask.to(x.device(), at::kLong).cumsum(1) > 0).unsqueeze(-1).to(x.scalar_type())
                       : at::Tensor();
    const SequenceShard whole(tokens, SequenceGroups{});  // a text encoder: every rank holds all tokens
    std::vector<at::Tensor> out;
    const auto keep = [&](int64_t index) {
        if (std::binary_search(wanted.begin(), wanted.end(), index)) out.push_back(x);
    };
    const auto per_head = [](const RMSNorm& norm, const at::Tensor& t) {
        return norm.weight.defined() ? norm(t) : t;
    };
    const int64_t last = wanted.empty() ? static_cast<int64_t>(layers_.size()) : wanted.back();
    keep(0);
    for (int64_t i = 0; i < std::min<int64_t>(last, static_cast<int64_t>(layers_.size())); ++i) {
        const Layer& l = layers_[static_cast<std::size_t>(i)];
        at::Tensor h = l.input_norm(x);
        AttentionInputs in;
        in.q = rotate(per_head(l.q_norm, split_heads(l.q(h), q_heads)));
        // Each key-value head serves its group's query heads (transformers' repeat_kv).
        in.k = rotate(per_head(l.k_norm, split_heads(l.k(h), local_kv_heads_))).repeat_interleave(group, 1);
        in.v = split_heads(l.v(h), local_kv_heads_).repeat_interleave(group, 1);
        in.shard = &whole;
        in.logits_bias = bias;
        const at::Tensor attended = merge_heads(attend(in).out);
        x = x + l.o(sees.defined() ? attended * sees : attended);
        h = l.post_attention_norm(x);
        x = x + l.down(at::silu(l.gate(h)) * l.up(h));
        if (i + 1 < config_.num_hidden_layers) keep(i + 1);
    }
    if (wanted.empty() || wanted.back() == config_.num_hidden_layers) out.push_back(final_norm_(x));
    return out;
}

std::pair<at::Tensor, at::Tensor> padded_rows(const std::vector<std::vector<int64_t>>& rows, int64_t pad,
                                              const at::Device& device) {
    std::size_t longest = 0;
    for (const std::vector<int64_t>& row : rows) longest = std::max(longest, row.size());
    std::vector<int64_t> ids, mask;
    for (const std::vector<int64_t>& row : rows) {
        ids.insert(ids.end(), row.begin(), row.end());
        ids.insert(ids.end(), longest - row.size(), pad);
        mask.insert(mask.end(), row.size(), 1);
        mask.insert(mask.end(), longest - row.size(), 0);
    }
    const std::vector<int64_t> shape{static_cast<int64_t>(rows.size()), static_cast<int64_t>(longest)};
    return {at::tensor(ids, at::kLong).view(shape).to(device),
            at::tensor(mask, at::kLong).view(shape).to(device)};
}

}  // namespace dp::runtime
