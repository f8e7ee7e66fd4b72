#include "runtime/models/common/t5_encoder.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "runtime/io/config_json.h"
#include "runtime/io/errors.h"
#include "runtime/models/common/layers.h"
#include "runtime/parallel/attention.h"
#include "runtime/parallel/sequence_shard.h"

namespace dp::runtime {
namespace {

constexpr double kPi = 3.14159265358979323846;

// transformers' gelu_new (the tanh approximation), op for op, so that half precision rounds alike.
at::Tensor gelu_new(const at::Tensor& x) {
    return 0.5 * x * (1.0 + at::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * at::pow(x, 3.0))));
}

// The feed-forward's activation by its ACT2FN name (T5Config::from_json_text accepts these only).
at::Tensor activate(const std::string& act, const at::Tensor& x) {
    if (act == "gelu_new") return gelu_new(x);
    if (act == "gelu") return at::gelu(x);
    if (act == "silu") return at::silu(x);
    return at::relu(x);
}

// The bidirectional relative-position bucket of each (query, key) pair, [T, T] int64: half the
// buckets for keys after the query; within each half, exact distances below half of it, then
// logarithmic bins up to max_distance, beyond which all share the last bucket.
at::Tensor position_buckets(int64_t tokens, int64_t num_buckets, int64_t max_distance,
                            const at::Device& device) {
    const at::TensorOptions longs = at::TensorOptions().dtype(at::kLong).device(device);
    const at::Tensor context = at::arange(tokens, longs).unsqueeze(1);
    const at::Tensor memory = at::arange(tokens, longs).unsqueeze(0);
    at::Tensor relative = memory - context;
    const int64_t half = num_buckets / 2;
    at::Tensor buckets = (relative > 0).to(at::kLong) * half;
    relative = relative.abs();
    const int64_t max_exact = half / 2;
    const at::Tensor is_small = relative < max_exact;
    at::Tensor large =
        max_exact + (at::log(relative.to(at::kFloat) / static_cast<double>(max_exact)) /
                     std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)) *
                     static_cast<double>(half - max_exact))
                        .to(at::kLong);
    large = at::minimum(large, at::full_like(large, half - 1));
    return buckets + at::where(is_small, relative, large);
}

}  // namespace

std::string T5Config::activation() const {
    if (feed_forward_proj == "gated-gelu") return "gelu_new";
    return gated() ? feed_forward_proj.substr(6) : feed_forward_proj;
}

T5Config T5Config::from_json_text(const std::string& text, const std::string& path) {
    const ConfigJson c(text, path);
    const std::string model_type = c.string("model_type", "t5");
    if (model_type != "t5")
        c.fail("model_type",
               "is '" + model_type + "'; supported: t5 (T5 v1.1, as SD3's and FLUX's text_encoder_3)");
    T5Config cfg;
    cfg.vocab_size = c.integer("vocab_size", cfg.vocab_size, 1, 1 << 24);
    cfg.d_model = c.integer("d_model", cfg.d_model, 1, 1 << 16);
    cfg.d_kv = c.integer("d_kv", cfg.d_kv, 1, 1 << 12);
    cfg.d_ff = c.integer("d_ff", cfg.d_ff, 1, 1 << 18);
    cfg.num_layers = c.integer("num_layers", cfg.num_layers, 1, 1024);
    cfg.num_heads = c.integer("num_heads", cfg.num_heads, 1, 1024);
    cfg.relative_attention_num_buckets =
        c.integer("relative_attention_num_buckets", cfg.relative_attention_num_buckets, 4, 1 << 12);
    cfg.relative_attention_max_distance =
        c.integer("relative_attention_max_distance", cfg.relative_attention_max_distance, 1, 1 << 20);
    cfg.layer_norm_epsilon = c.number("layer_norm_epsilon", cfg.layer_norm_epsilon, 0, 1);
    cfg.feed_forward_proj = c.string("feed_forward_proj", "relu");  // transformers' default (T5 v1.0)
    const std::string act = cfg.activation();
    if (act != "relu" && act != "gelu" && act != "gelu_new" && act != "silu")
        c.fail("feed_forward_proj",
               "is '" + cfg.feed_forward_proj +
                   "'; supported: gated-gelu (T5 v1.1, T5-XXL), relu (T5 v1.0), or ACT and "
                   "gated-ACT for ACT relu, gelu, gelu_new, silu");
    if (c.boolean("is_decoder", false)) c.fail("is_decoder", "is true; only T5's encoder is supported");
    // Below 2 exact distances per direction, the logarithmic bins would divide by log(1).
    if (cfg.relative_attention_num_buckets / 4 < 2 ||
        cfg.relative_attention_max_distance <= cfg.relative_attention_num_buckets / 4)
        c.fail("relative_attention_max_distance", "must exceed relative_attention_num_buckets / 4 = " +
                                                      std::to_string(cfg.relative_attention_num_buckets / 4) +
                                                      ", which must be at least 2");
    return cfg;
}

T5Encoder::T5Encoder(const T5Config& config, WeightStore& w, const TensorGroup& tp,
                     const strategies::ParallelSpec& spec)
    : config_(config) {
    const int64_t d = config.d_model, inner = config.inner_dim(), ff = config.d_ff;
    // Heads and feed-forward features split as evenly as tp allows (Note [uneven heads]).
    if (config.num_heads < tp.size)
        throw ModelError("T5 encoder: " + std::to_string(config.num_heads) +
                         " attention heads over a tensor-parallel degree of " + std::to_string(tp.size) +
                         ": a rank would hold none");
    local_heads_ = tp.share(config.num_heads);
    // Tied embeddings: transformers saves shared.weight, encoder.embed_tokens.weight or both.
    const bool shared = w.has("shared.weight");
    embedding_ = w.take(shared ? "shared.weight" : "encoder.embed_tokens.weight", {config.vocab_size, d});
    if (shared) w.skip_prefix("encoder.embed_tokens.weight");
    w.skip_prefix("decoder.");  // a T5ForConditionalGeneration's checkpoint, as T5EncoderModel loads it
    w.skip_prefix("lm_head.");
    const at::Tensor bias = w.take("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                                   {config.relative_attention_num_buckets, config.num_heads});
    relative_bias_ = bias.narrow(1, tp.share_start(config.num_heads), local_heads_).contiguous();
    const LinearLoader load(w, spec, tp);
    auto linear = [&](const std::string& name, int64_t in, int64_t out, int64_t unit) {
        return load(name, in, out, unit, /*bias=*/false);
    };
    // T5LayerNorm: the mean square in fp32; a half-precision weight brings the result back to its
    // dtype before the scale (Note [T5 dtypes]).
    const double eps = config.layer_norm_epsilon;
    auto norm = [&](const std::string& name) {
        return RMSNorm::load_weight(w, name, d, eps, RmsRounding::kT5);
    };
    const at::ScalarType run_dtype = w.dtype();
    for (int64_t i = 0; i < config.num_layers; ++i) {
        const std::string p = "encoder.block." + std::to_string(i) + ".layer.";
        Block b;
        b.attention_norm = norm(p + "0.layer_norm.weight");
        b.q = linear(p + "0.SelfAttention.q", d, inner, config.d_kv);
        b.k = linear(p + "0.SelfAttention.k", d, inner, config.d_kv);
        b.v = linear(p + "0.SelfAttention.v", d, inner, config.d_kv);
        b.o = linear(p + "0.SelfAttention.o", inner, d, config.d_kv);
        b.ff_norm = norm(p + "1.layer_norm.weight");
        if (config.gated()) {
            b.wi_0 = linear(p + "1.DenseReluDense.wi_0", d, ff, 1);
            b.wi_1 = linear(p + "1.DenseReluDense.wi_1", d, ff, 1);
        } else {
            b.wi_0 = linear(p + "1.DenseReluDense.wi", d, ff, 1);
        }
        // Note [T5 dtypes]: wo stays fp32 in an fp16 run, loaded so from the file.
        if (run_dtype == at::kHalf) w.set_dtype(at::kFloat);
        try {
            b.wo = linear(p + "1.DenseReluDense.wo", ff, d, 1);
        } catch (...) {
            w.set_dtype(run_dtype);
            throw;
        }
        w.set_dtype(run_dtype);
        blocks_.push_back(std::move(b));
    }
    final_norm_ = norm("encoder.final_layer_norm.weight");
}

at::Tensor T5Encoder::position_bias(int64_t tokens) const {
    const at::Tensor buckets =
        position_buckets(tokens, config_.relative_attention_num_buckets,
                         config_.relative_attention_max_distance, relative_bias_.device());
    return at::embedding(relative_bias_, buckets).permute({2, 0, 1}).unsqueeze(0);  // [1, heads, T, T]
}

at::Tensor T5Encoder::forward(const at::Tensor& input_ids) const {
    if (input_ids.dim() != 2) throw InternalError("T5Encoder::forward: input_ids must be [batch, tokens]");
    const at::Tensor ids = input_ids.to(embedding_.device(), at::kLong);
    const int64_t tokens = ids.size(1);
    const at::Tensor bias = position_bias(tokens);
    const SequenceShard whole(tokens, SequenceGroups{});  // a text encoder: every rank holds all tokens
    const std::string act = config_.activation();
    at::Tensor x = at::embedding(embedding_, ids);
    for (const Block& b : blocks_) {
        at::Tensor h = b.attention_norm(x);
        AttentionInputs in;
        in.q = split_heads(b.q(h), local_heads_);
        in.k = split_heads(b.k(h), local_heads_);
        in.v = split_heads(b.v(h), local_heads_);
        in.shard = &whole;
        in.scale = 1.0;  // T5 attends unscaled
        in.logits_bias = bias;
        x = clamp_half(x + b.o(merge_heads(attend(in).out)), HalfClamp::kBelowOverflow);
        h = b.ff_norm(x);
        h = b.wi_1.defined() ? activate(act, b.wi_0(h)) * b.wi_1(h) : activate(act, b.wi_0(h));
        x = clamp_half(x + b.wo(h.to(b.wo.weight().scalar_type())), HalfClamp::kBelowOverflow);
    }
    return final_norm_(x);
}

int64_t T5Encoder::parameter_bytes() const {
    auto bytes = [](const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : int64_t{0}; };
    int64_t total = bytes(embedding_) + bytes(relative_bias_) + bytes(final_norm_.weight);
    for (const Block& b : blocks_) {
        total += bytes(b.attention_norm.weight) + bytes(b.ff_norm.weight);
        for (const ParallelLinear* l : {&b.q, &b.k, &b.v, &b.o, &b.wi_0, &b.wi_1, &b.wo})
            total += l->parameter_bytes();
    }
    return total;
}

}  // namespace dp::runtime
