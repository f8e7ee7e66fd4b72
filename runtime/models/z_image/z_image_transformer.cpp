#include "runtime/models/z_image/z_image_transformer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "runtime/io/config_json.h"
#include "runtime/io/errors.h"
#include "runtime/models/common/fused_ops.h"
#include "runtime/parallel/attention.h"
#include "runtime/parallel/sequence_shard.h"

namespace dp::runtime {
namespace {

constexpr int64_t kSequenceMultiple = 32;  // diffusers' SEQ_MULTI_OF: both kinds of tokens padded to it
constexpr int64_t kAdaLnWidth = 256;       // the timestep embedding's width (min(dim, 256))
constexpr int64_t kTimeMid = 1024;         // TimestepEmbedder's hidden width

int64_t rounded_up(int64_t n) { return (n + kSequenceMultiple - 1) / kSequenceMultiple * kSequenceMultiple; }

// A list of three integers under `key`, each checked by `ok`.
std::array<int64_t, 3> three(const ConfigJson& c, const char* key, std::array<int64_t, 3> fallback,
                             const std::string& accepted, bool (*ok)(int64_t)) {
    if (!c.has(key)) return fallback;
    const nlohmann::json& list = c.raw().at(key);
    bool good = list.is_array() && list.size() == 3;
    for (std::size_t i = 0; good && i < 3; ++i) {
        good = list[i].is_number_integer() && ok(list[i].get<int64_t>());
        if (good) fallback[i] = list[i].get<int64_t>();
    }
    if (!good) c.fail(key, "is " + list.dump().substr(0, 40) + "; expected " + accepted);
    return fallback;
}

// A one-element list holding `value` (all_patch_size [2], all_f_patch_size [1]).
void require_one(const ConfigJson& c, const char* key, int64_t value) {
    if (!c.has(key)) return;
    const nlohmann::json& list = c.raw().at(key);
    if (list != nlohmann::json::array({value}))
        c.fail(key, "is " + list.dump().substr(0, 40) + "; only [" + std::to_string(value) +
                        "] (ZImagePipeline's patches) is supported");
}

}  // namespace

ZImageTransformerConfig ZImageTransformerConfig::from_json_text(const std::string& text,
                                                                const std::string& path) {
    const ConfigJson c(text, path);
    c.require_class("transformer", "ZImageTransformer2DModel");
    require_one(c, "all_patch_size", 2);
    require_one(c, "all_f_patch_size", 1);
    if (c.has("siglip_feat_dim") && !c.raw().at("siglip_feat_dim").is_null())
        c.fail("siglip_feat_dim",
               "is set (Z-Image-Omni's SigLIP inputs); only ZImagePipeline's text to image is supported");
    ZImageTransformerConfig cfg;
    cfg.in_channels = c.integer("in_channels", cfg.in_channels, 1, 1 << 12);
    cfg.dim = c.integer("dim", cfg.dim, 1, 1 << 16);
    cfg.n_layers = c.integer("n_layers", cfg.n_layers, 0, 1024);
    cfg.n_refiner_layers = c.integer("n_refiner_layers", cfg.n_refiner_layers, 0, 64);
    cfg.num_attention_heads = c.integer("n_heads", cfg.num_attention_heads, 1, 1024);
    cfg.norm_eps = c.number("norm_eps", cfg.norm_eps, 0, 1);
    cfg.qk_norm = c.boolean("qk_norm", cfg.qk_norm);
    cfg.cap_feat_dim = c.integer("cap_feat_dim", cfg.cap_feat_dim, 1, 1 << 17);
    cfg.rope_theta = c.number("rope_theta", cfg.rope_theta, 1, 1e12);
    cfg.t_scale = c.number("t_scale", cfg.t_scale, 0, 1e6);
    if (cfg.dim % cfg.num_attention_heads != 0)
        c.fail("n_heads", "is " + std::to_string(cfg.num_attention_heads) + "; it must divide dim " +
                              std::to_string(cfg.dim));
    const std::string sums =
        "3 even integers summing to the head size dim / n_heads (" + std::to_string(cfg.head_dim()) + ")";
    cfg.axes_dims =
        three(c, "axes_dims", cfg.axes_dims, sums, [](int64_t v) { return v >= 2 && v % 2 == 0; });
    if (cfg.axes_dims[0] + cfg.axes_dims[1] + cfg.axes_dims[2] != cfg.head_dim())
        c.fail("axes_dims", "sums to " +
                                std::to_string(cfg.axes_dims[0] + cfg.axes_dims[1] + cfg.axes_dims[2]) +
                                "; expected " + sums);
    cfg.axes_lens = three(c, "axes_lens", cfg.axes_lens, "3 positive integers (positions per axis)",
                          [](int64_t v) { return v >= 1 && v <= (1 << 20); });
    return cfg;
}

ZImageRope z_image_rope(const ZImageTransformerConfig& config, const at::Tensor& positions) {
    std::vector<at::Tensor> angles;
    for (int64_t a = 0; a < 3; ++a) {
        const at::Tensor pos = positions.select(1, a);
        const int64_t len = config.axes_lens[static_cast<std::size_t>(a)];
        if (pos.numel() > 0 && (pos.max().item<int64_t>() >= len || pos.min().item<int64_t>() < 0))
            throw ModelError("position " + std::to_string(pos.max().item<int64_t>()) + " on rotary axis " +
                             std::to_string(a) + " is past the transformer's axes_lens (" +
                             std::to_string(len) + "): a smaller image or a shorter prompt fits");
        const int64_t d = config.axes_dims[static_cast<std::size_t>(a)];
        const at::Tensor freqs =
            rope_frequencies(d, config.rope_theta, at::TensorOptions().dtype(at::kDouble));
        angles.push_back(at::outer(pos.to(at::kDouble), freqs).to(at::kFloat));
    }
    const at::Tensor all = at::cat(angles, 1).repeat_interleave(2, 1);
    return {at::cos(all), at::sin(all)};
}

ZImageBlock ZImageTransformer::load_block(const LinearLoader& linear, const std::string& p,
                                          bool modulated) const {
    const ZImageTransformerConfig& c = config_;
    const int64_t d = c.dim, hd = c.head_dim(), ff = static_cast<int64_t>(static_cast<double>(d) / 3.0 * 8.0);
    WeightStore& w = linear.weights();
    ZImageBlock b;
    b.to_q = linear(p + ".attention.to_q", d, d, hd, false);
    b.to_k = linear(p + ".attention.to_k", d, d, hd, false);
    b.to_v = linear(p + ".attention.to_v", d, d, hd, false);
    b.to_out = linear(p + ".attention.to_out.0", d, d, hd, false);
    if (c.qk_norm) {
        b.norm_q = RMSNorm::load(w, p + ".attention.norm_q", hd, 1e-5);  // diffusers' Attention eps
        b.norm_k = RMSNorm::load(w, p + ".attention.norm_k", hd, 1e-5);
    }
    b.w1 = linear(p + ".feed_forward.w1", d, ff, 1, false);
    b.w2 = linear(p + ".feed_forward.w2", ff, d, 1, false);
    b.w3 = linear(p + ".feed_forward.w3", d, ff, 1, false);
    b.attention_norm1 = RMSNorm::load(w, p + ".attention_norm1", d, c.norm_eps);
    b.attention_norm2 = RMSNorm::load(w, p + ".attention_norm2", d, c.norm_eps);
    b.ffn_norm1 = RMSNorm::load(w, p + ".ffn_norm1", d, c.norm_eps);
    b.ffn_norm2 = RMSNorm::load(w, p + ".ffn_norm2", d, c.norm_eps);
    if (modulated) b.modulation = linear(p + ".adaLN_modulation.0", std::min(d, kAdaLnWidth), 4 * d);
    return b;
}

ZImageTransformer::ZImageTransformer(const ZImageTransformerConfig& config, WeightStore& w,
                                     const ParallelContext& parallel,
                                     std::shared_ptr<const DeviceMapping> mapping)
    : TransformerBase(config, w, parallel, std::move(mapping), static_cast<std::size_t>(config.n_layers),
                      "z-image") {
    const int64_t d = config.dim, t = std::min(d, kAdaLnWidth), patch = 4 * config.in_channels;
    const LinearLoader linear = linear_loader(w);
    x_embedder_ = linear("all_x_embedder.2-1", patch, d);
    final_modulation_ = linear("all_final_layer.2-1.adaLN_modulation.1", t, d);
    final_linear_ = linear("all_final_layer.2-1.linear", d, patch);
    t_1_ = linear("t_embedder.mlp.0", 256, kTimeMid);
    t_2_ = linear("t_embedder.mlp.2", kTimeMid, t);
    cap_norm_ = RMSNorm::load(w, "cap_embedder.0", config.cap_feat_dim, config.norm_eps);
    cap_embedder_ = linear("cap_embedder.1", config.cap_feat_dim, d);
    x_pad_ = w.take("x_pad_token", {1, d}).view({d});
    cap_pad_ = w.take("cap_pad_token", {1, d}).view({d});
    for (int64_t i = 0; i < config.n_refiner_layers; ++i) {
        noise_refiner_.push_back(load_block(linear, "noise_refiner." + std::to_string(i), true));
        context_refiner_.push_back(load_block(linear, "context_refiner." + std::to_string(i), false));
    }
    devices_.load_blocks(w, [&](std::size_t block) {
        layers_.push_back(load_block(linear, spec_->block_prefixes[0] + std::to_string(block), true));
    });
    loaded(w);
}

at::Tensor ZImageTransformer::block(const ZImageBlock& b, const at::Tensor& tokens, const at::Tensor& cos,
                                    const at::Tensor& sin, const at::Tensor& modulation, const Streams& s,
                                    const BlockContext* context) const {
    const int64_t heads = parallel_->tensor().share(config_.num_attention_heads);
    at::Tensor scale_msa, gate_msa, scale_mlp, gate_mlp;
    if (modulation.defined()) {
        const std::vector<at::Tensor> m = modulation.unsqueeze(1).chunk(4, 2);
        scale_msa = 1.0 + m[0], gate_msa = m[1].tanh(), scale_mlp = 1.0 + m[2], gate_mlp = m[3].tanh();
    }
    const auto scaled = [](const at::Tensor& x, const at::Tensor& by) { return by.defined() ? x * by : x; };
    // residual + gate * y, in one pass where it can (Note [fused elementwise work]: the same bits).
    const auto gated = [](const at::Tensor& residual, const at::Tensor& y, const at::Tensor& by) {
        return by.defined() ? fused::gated_residual(residual, by, y) : residual + y;
    };
    const auto per_head = [](const RMSNorm& norm, const at::Tensor& x) {
        return norm.weight.defined() ? norm(x) : x;
    };
    const at::Tensor h = scaled(b.attention_norm1(tokens), scale_msa);
    const auto compute = [&] {
        const at::Tensor q =
            apply_interleaved_rope(per_head(b.norm_q, split_heads(b.to_q(h), heads)), cos, sin);
        const at::Tensor k =
            apply_interleaved_rope(per_head(b.norm_k, split_heads(b.to_k(h), heads)), cos, sin);
        const at::Tensor v = split_heads(b.to_v(h), heads);
        AttentionInputs in;
        in.shard = s.image;
        if (!s.words) {
            in.q = q, in.k = k, in.v = v;
            return std::vector<at::Tensor>{b.to_out(merge_heads(attend(in).out))};
        }
        const int64_t ni = s.split, nt = tokens.size(1) - ni;
        in.q = q.narrow(2, 0, ni), in.k = k.narrow(2, 0, ni), in.v = v.narrow(2, 0, ni);
        in.q2 = q.narrow(2, ni, nt), in.k2 = k.narrow(2, ni, nt), in.v2 = v.narrow(2, ni, nt);
        in.shard2 = s.words;
        in.bias2 = s.bias2;
        const AttentionOutputs o = attend(in);
        return std::vector<at::Tensor>{b.to_out(at::cat({merge_heads(o.out), merge_heads(o.out2)}, 1))};
    };
    const at::Tensor attn = context ? context->attention(compute)[0] : compute()[0];
    const at::Tensor x = gated(tokens, b.attention_norm2(attn), gate_msa);
    const at::Tensor f = scaled(b.ffn_norm1(x), scale_mlp);
    return gated(x, b.ffn_norm2(b.w2(at::silu(b.w1(f)) * b.w3(f))), gate_mlp);
}

void ZImageTransformer::check_inputs(const at::Tensor& latents, const at::Tensor& text,
                                     const at::Tensor& mask, const at::Tensor& timestep) const {
    const ZImageTransformerConfig& c = config_;
    if (!latents.defined() || latents.dim() != 4 || latents.size(1) != c.in_channels || latents.size(2) < 2 ||
        latents.size(3) < 2 || latents.size(2) % 2 != 0 || latents.size(3) % 2 != 0)
        throw ModelError("the transformer takes latents [batch, " + std::to_string(c.in_channels) +
                         ", height, width] of even sides; got " +
                         (latents.defined() ? c10::str(latents.sizes()) : std::string("none")));
    const int64_t batch = latents.size(0);
    if (!text.defined() || text.dim() != 3 || text.size(0) != batch || text.size(1) < 1 ||
        text.size(2) != c.cap_feat_dim)
        throw ModelError("the transformer takes text features [" + std::to_string(batch) + ", tokens >= 1, " +
                         std::to_string(c.cap_feat_dim) + "]; got " +
                         (text.defined() ? c10::str(text.sizes()) : std::string("none")));
    if (mask.defined() && (mask.dim() != 2 || mask.size(0) != batch || mask.size(1) != text.size(1)))
        throw ModelError("the text mask must be [" + std::to_string(batch) + ", " +
                         std::to_string(text.size(1)) + "]; got " + c10::str(mask.sizes()));
    if (!timestep.defined() || (timestep.numel() != batch && timestep.numel() != 1))
        throw ModelError("the transformer takes one timestep per prompt (" + std::to_string(batch) + ")");
}

at::Tensor ZImageTransformer::captions(const at::Tensor& text, const std::vector<int64_t>& lengths,
                                       std::vector<int64_t>& padded) const {
    const int64_t longest = rounded_up(*std::max_element(lengths.begin(), lengths.end()));
    const at::Tensor embedded = cap_embedder_(cap_norm_(text));
    at::Tensor out = at::zeros({text.size(0), longest, config_.dim}, embedded.options());
    const SequenceShard whole(longest, SequenceGroups{});
    for (int64_t k = 0; k < text.size(0); ++k) {  // Note [Z-Image text stream]: each prompt alone
        const int64_t len = lengths[static_cast<std::size_t>(k)], c = rounded_up(len);
        padded.push_back(c);
        at::Tensor row = at::cat({embedded[k].narrow(0, 0, len), cap_pad_.expand({c - len, config_.dim})}, 0);
        const ZImageRope rope = z_image_rope(
            config_,
            at::stack({at::arange(1, c + 1, at::kLong), at::zeros({c}, at::kLong), at::zeros({c}, at::kLong)},
                      1));
        const at::Tensor cos = rope.cos.to(row.device()), sin = rope.sin.to(row.device());
        const SequenceShard one(c, SequenceGroups{});
        Streams s;
        s.image = &one;
        row = row.unsqueeze(0);
        for (const ZImageBlock& b : context_refiner_) row = block(b, row, cos, sin, at::Tensor(), s);
        out[k].narrow(0, 0, c).copy_(row[0]);
    }
    return out;
}

at::Tensor ZImageTransformer::forward(const at::Tensor& latents, const at::Tensor& text,
                                      const at::Tensor& mask, const at::Tensor& timestep,
                                      const BlockRunner& runner) const {
    const ZImageTransformerConfig& c = config_;
    check_inputs(latents, text, mask, timestep);
    const at::ScalarType dtype = x_embedder_.weight().scalar_type();
    const at::Device device = x_embedder_.weight().device();
    const int64_t batch = latents.size(0), channels = c.in_channels;
    const int64_t gh = latents.size(2) / 2, gw = latents.size(3) / 2, n = gh * gw, ni = rounded_up(n);

    // The timestep's embedding: t * t_scale, the sinusoid in fp32, the MLP in the model's dtype.
    const at::Tensor t = timestep.reshape({-1}).to(device, at::kFloat).expand({batch}) * c.t_scale;
    const at::Tensor adaln = t_2_(at::silu(t_1_(timestep_embedding(t, 256).to(dtype))));

    // Each prompt's caption (Note [Z-Image sequences]), refined whole.
    std::vector<int64_t> lengths(static_cast<std::size_t>(batch), text.size(1)), padded;
    if (mask.defined()) {
        const at::Tensor sums = mask.to(at::kCPU, at::kLong).sum(1);
        for (int64_t k = 0; k < batch; ++k) lengths[static_cast<std::size_t>(k)] = sums[k].item<int64_t>();
    }
    if (*std::min_element(lengths.begin(), lengths.end()) < 1)
        throw ModelError("every prompt needs at least one text token");
    at::Tensor ctx = captions(text.to(device, dtype), lengths, padded);
    const int64_t nt = ctx.size(1);

    // The image's tokens in diffusers' patch order (row, column; then within a patch row, column,
    // channel), its pads after them; each prompt's rotary table (its image's first position after its
    // caption).
    const at::Tensor patches = latents.to(device, dtype)
                                   .view({batch, channels, gh, 2, gw, 2})
                                   .permute({0, 2, 4, 3, 5, 1})
                                   .reshape({batch, n, 4 * channels});
    at::Tensor x = at::cat({x_embedder_(patches), x_pad_.to(dtype).expand({batch, ni - n, c.dim})}, 1);
    const at::Tensor index = at::arange(n, at::kLong);
    std::vector<at::Tensor> cos_rows, sin_rows;
    for (int64_t k = 0; k < batch; ++k) {
        const at::Tensor own = at::stack({at::full({n}, padded[static_cast<std::size_t>(k)] + 1, at::kLong),
                                          at::floor_divide(index, gw), at::remainder(index, gw)},
                                         1);
        const ZImageRope r = z_image_rope(c, at::cat({own, at::zeros({ni - n, 3}, at::kLong)}, 0));
        cos_rows.push_back(r.cos), sin_rows.push_back(r.sin);
    }
    const SequenceShard image(ni, parallel_->sequence()), words(nt, parallel_->sequence());
    at::Tensor image_cos = image.shard(at::stack(cos_rows, 0), 1).unsqueeze(1).to(device);
    at::Tensor image_sin = image.shard(at::stack(sin_rows, 0), 1).unsqueeze(1).to(device);
    x = image.shard(x);

    Streams alone;
    alone.image = &image;
    for (const ZImageBlock& b : noise_refiner_)
        x = block(b, x, image_cos, image_sin, b.modulation(adaln), alone);

    // The main blocks: one stream of [image; caption], each part split by its own shard.
    const ZImageRope caption_rope = z_image_rope(
        c,
        at::stack({at::arange(1, nt + 1, at::kLong), at::zeros({nt}, at::kLong), at::zeros({nt}, at::kLong)},
                  1));
    at::Tensor ctx_cos = words.shard(caption_rope.cos, 0).to(device).expand({batch, 1, -1, -1});
    at::Tensor ctx_sin = words.shard(caption_rope.sin, 0).to(device).expand({batch, 1, -1, -1});
    ctx = words.shard(ctx);
    Streams joint;
    joint.image = &image;
    joint.words = &words;
    joint.split = x.size(1);
    if (*std::min_element(padded.begin(), padded.end()) < nt) {  // a batch of captions of several lengths
        joint.bias2 = at::zeros({batch, nt}, at::TensorOptions().dtype(dtype).device(device));
        for (int64_t k = 0; k < batch; ++k)
            joint.bias2[k]
                .narrow(0, padded[static_cast<std::size_t>(k)], nt - padded[static_cast<std::size_t>(k)])
                .fill_(-INFINITY);
    }
    at::Tensor one, cos, sin;  // the stream, made as the pass enters block 0
    BlockPass pass;
    pass.blocks = layers_.size();
    pass.image = &x;
    pass.image_shard = &image;
    at::Tensor conditioning = adaln;
    pass.conditioning = &conditioning;
    pass.activations = {&ctx, &image_cos, &image_sin, &ctx_cos, &ctx_sin, &one, &cos, &sin, &joint.bias2};
    runner.run(pass, devices_, [&](const BlockContext& context) {
        if (context.index() == 0) {
            one = at::cat({x, ctx}, 1);
            cos = at::cat({image_cos, ctx_cos}, 2), sin = at::cat({image_sin, ctx_sin}, 2);
        }
        const ZImageBlock& b = layers_[context.index()];
        one = block(b, one, cos, sin, b.modulation(conditioning), joint, &context);
        x = one.narrow(1, 0, joint.split);
    });

    // The head, over the image's tokens; their pads dropped and the patches put back.
    const at::Tensor scale = 1.0 + final_modulation_(at::silu(conditioning));
    const at::Tensor out =
        image.gather(final_linear_(adaln::plain_layer_norm(x, 1e-6) * scale.unsqueeze(1))).narrow(1, 0, n);
    return out.reshape({batch, gh, gw, 2, 2, channels}).permute({0, 5, 1, 3, 2, 4}).reshape(latents.sizes());
}

}  // namespace dp::runtime
