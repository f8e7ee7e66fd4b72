#include "runtime/models/common/clip_text_encoder.h"

#include <ATen/ATen.h>

#include "runtime/io/config_json.h"
#include "runtime/io/errors.h"

namespace dp::runtime {

ClipTextConfig ClipTextConfig::from_json_text(const std::string& text, const std::string& path) {
    const ConfigJson j(text, path);
    // A full CLIPConfig nests the text model's settings.
    const ConfigJson c = j.has("text_config") && !j.has("hidden_size")
                             ? ConfigJson(j.raw()["text_config"].dump(), path + " text_config")
                             : j;
    const std::string arch = c.raw().contains("architectures") && c.raw()["architectures"].is_array() &&
                                     !c.raw()["architectures"].empty() &&
                                     c.raw()["architectures"][0].is_string()
                                 ? c.raw()["architectures"][0].get<std::string>()
                                 : "CLIPTextModelWithProjection";
    if (arch != "CLIPTextModelWithProjection" && arch != "CLIPTextModel")
        throw ModelError(path + ": architecture '" + arch +
                         "' is not supported here (supported: CLIPTextModelWithProjection, CLIPTextModel)");
    ClipTextConfig cfg;
    cfg.projection = arch == "CLIPTextModelWithProjection";
    cfg.vocab_size = c.integer("vocab_size", cfg.vocab_size, 1, 1 << 24);
    cfg.hidden_size = c.integer("hidden_size", cfg.hidden_size, 1, 1 << 16);
    cfg.intermediate_size = c.integer("intermediate_size", cfg.intermediate_size, 1, 1 << 18);
    cfg.num_hidden_layers = c.integer("num_hidden_layers", cfg.num_hidden_layers, 1, 1024);
    cfg.num_attention_heads = c.integer("num_attention_heads", cfg.num_attention_heads, 1, 1024);
    cfg.max_position_embeddings =
        c.integer("max_position_embeddings", cfg.max_position_embeddings, 1, 1 << 16);
    cfg.projection_dim = c.integer("projection_dim", cfg.projection_dim, 1, 1 << 16);
    cfg.eos_token_id = c.integer("eos_token_id", cfg.eos_token_id, 0, 1 << 24);
    cfg.layer_norm_eps = c.number("layer_norm_eps", cfg.layer_norm_eps, 0, 1);
    const std::string act = c.string("hidden_act", "quick_gelu");
    if (act != "quick_gelu" && act != "gelu")
        c.fail("hidden_act", "is '" + act + "'; supported: quick_gelu, gelu");
    cfg.quick_gelu = act == "quick_gelu";
    if (cfg.hidden_size % cfg.num_attention_heads != 0)
        c.fail("num_attention_heads", "must divide hidden_size " + std::to_string(cfg.hidden_size));
    return cfg;
}

namespace {

// Where the text model's tensors are named from: "text_model." (CLIPTextModelWithProjection, and
// CLIPTextModel as the hub's checkpoints store it), or "" (CLIPTextModel as transformers 5 saves it).
std::string text_model_prefix(const WeightStore& w) {
    if (w.is_random() || w.has("text_model.embeddings.token_embedding.weight")) return "text_model.";
    return w.has("embeddings.token_embedding.weight") ? "" : "text_model.";
}

}  // namespace

ClipTextEncoder::ClipTextEncoder(const ClipTextConfig& config, WeightStore& w) : config_(config) {
    const int64_t h = config.hidden_size, ff = config.intermediate_size;
    const std::string m = text_model_prefix(w);
    token_embedding_ = w.take(m + "embeddings.token_embedding.weight", {config.vocab_size, h});
    position_embedding_ =
        w.take(m + "embeddings.position_embedding.weight", {config.max_position_embeddings, h});
    for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
        const std::string p = m + "encoder.layers." + std::to_string(i);
        Layer l;
        l.norm1 = LayerNorm::load(w, p + ".layer_norm1", h, config.layer_norm_eps);
        l.q = Linear::load(w, p + ".self_attn.q_proj", h, h);
        l.k = Linear::load(w, p + ".self_attn.k_proj", h, h);
        l.v = Linear::load(w, p + ".self_attn.v_proj", h, h);
        l.out = Linear::load(w, p + ".self_attn.out_proj", h, h);
        l.norm2 = LayerNorm::load(w, p + ".layer_norm2", h, config.layer_norm_eps);
        l.fc1 = Linear::load(w, p + ".mlp.fc1", h, ff);
        l.fc2 = Linear::load(w, p + ".mlp.fc2", ff, h);
        layers_.push_back(std::move(l));
    }
    final_norm_ = LayerNorm::load(w, m + "final_layer_norm", h, config.layer_norm_eps);
    if (config.projection) {
        projection_ = Linear::load(w, "text_projection", h, config.projection_dim, /*bias=*/false);
    } else if (!w.is_random() && w.has("text_projection.weight")) {
        throw ModelError(
            w.where() +
            ": the weights hold text_projection.weight but config.json's architectures names "
            "CLIPTextModel (no projection); name CLIPTextModelWithProjection there, or use the text "
            "encoder saved without one");
    }
}

ClipTextOutput ClipTextEncoder::forward(const at::Tensor& input_ids, int clip_skip) const {
    const int64_t seq = input_ids.size(1);
    if (seq > config_.max_position_embeddings)
        throw ModelError("text encoder: " + std::to_string(seq) + " tokens but only " +
                         std::to_string(config_.max_position_embeddings) + " positions");
    if (clip_skip < 0 || clip_skip + 1 > static_cast<int>(layers_.size()))
        throw ModelError("clip_skip " + std::to_string(clip_skip) + " is out of range for " +
                         std::to_string(layers_.size()) + " layers");
    const int64_t heads = config_.num_attention_heads;
    at::Tensor ids = input_ids.to(token_embedding_.device(), at::kLong);
    at::Tensor x = at::embedding(token_embedding_, ids) + position_embedding_.slice(0, 0, seq).unsqueeze(0);
    // hidden_states[-(clip_skip + 2)] is the output of layer L - 1 - clip_skip (1-based).
    const std::size_t keep_after = layers_.size() - 1 - static_cast<std::size_t>(clip_skip);
    at::Tensor kept = keep_after == 0 ? x : at::Tensor();
    for (std::size_t i = 0; i < layers_.size(); ++i) {
        const Layer& l = layers_[i];
        at::Tensor h = l.norm1(x);
        at::Tensor a = attention(split_heads(l.q(h), heads), split_heads(l.k(h), heads),
                                 split_heads(l.v(h), heads), /*causal=*/true);
        x = x + l.out(merge_heads(a));
        h = l.fc1(l.norm2(x));
        h = config_.quick_gelu ? h * at::sigmoid(1.702 * h) : at::gelu(h);
        x = x + l.fc2(h);
        if (i + 1 == keep_after) kept = x;
    }
    x = final_norm_(x);
    // The pooled token: the first end-of-text token, or (configs from before transformers fixed
    // eos_token_id, where it is 2) the highest id.
    at::Tensor where = config_.eos_token_id == 2
                           ? ids.to(at::kInt).argmax(-1)
                           : (ids.to(at::kInt) == config_.eos_token_id).to(at::kInt).argmax(-1);
    const int64_t batch = x.size(0);
    at::Tensor rows = at::arange(batch, where.options().dtype(at::kLong)) * seq + where.to(at::kLong);
    at::Tensor pooled = x.reshape({batch * seq, x.size(2)}).index_select(0, rows);
    return {kept, config_.projection ? projection_(pooled) : pooled};
}

}  // namespace dp::runtime
