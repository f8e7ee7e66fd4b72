#include "runtime/models/sd3_transformer.h"

#include <ATen/ATen.h>

#include <cmath>

#include "runtime/communicator.h"
#include "runtime/device_mapping.h"
#include "runtime/errors.h"
#include "runtime/models/config_json.h"

namespace dp::runtime {
namespace {

at::Tensor sincos_1d(int64_t dim, const at::Tensor& pos) {
    at::Tensor omega = at::arange(dim / 2, at::kDouble) / (dim / 2.0);
    omega = 1.0 / at::pow(10000.0, omega);
    at::Tensor out = at::outer(pos.reshape(-1).to(at::kDouble), omega);
    return at::cat({at::sin(out), at::cos(out)}, 1);
}

// x -> norm(x) * (1 + scale) + shift, with shift and scale [B, dim].
at::Tensor modulate(const at::Tensor& normed, const at::Tensor& shift, const at::Tensor& scale) {
    return normed * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
}

at::Tensor plain_layer_norm(const at::Tensor& x) { return at::layer_norm(x, {x.size(-1)}, {}, {}, 1e-6); }

}  // namespace

at::Tensor sincos_pos_embed_2d(int64_t dim, int64_t grid, int64_t base_size) {
    const at::Tensor coords =
        at::arange(grid, at::kFloat) / (static_cast<double>(grid) / static_cast<double>(base_size));
    std::vector<at::Tensor> mesh = at::meshgrid({coords, coords}, "xy");  // w first
    const at::Tensor emb_h = sincos_1d(dim / 2, mesh[0]);
    const at::Tensor emb_w = sincos_1d(dim / 2, mesh[1]);
    return at::cat({emb_h, emb_w}, 1).to(at::kFloat);
}

at::Tensor timestep_embedding(const at::Tensor& timesteps, int64_t dim) {
    const int64_t half = dim / 2;
    at::Tensor exponent = -std::log(10000.0) * at::arange(0, half, timesteps.options().dtype(at::kFloat));
    exponent = exponent / static_cast<double>(half);
    at::Tensor emb = timesteps.unsqueeze(1).to(at::kFloat) * at::exp(exponent).unsqueeze(0);
    emb = at::cat({at::cos(emb), at::sin(emb)}, -1);  // flip_sin_to_cos
    return emb;
}

at::Tensor FeedForward::operator()(const at::Tensor& x) const { return out(at::gelu(in(x), "tanh")); }

Sd3TransformerConfig Sd3TransformerConfig::from_json_text(const std::string& text, const std::string& path) {
    const ConfigJson c(text, path);
    const std::string cls = c.string("_class_name", "SD3Transformer2DModel");
    if (cls != "SD3Transformer2DModel")
        throw ModelError(path + ": transformer class '" + cls +
                         "' is not supported (supported: SD3Transformer2DModel)");
    Sd3TransformerConfig cfg;
    cfg.sample_size = c.integer("sample_size", cfg.sample_size, 1, 1 << 16);
    cfg.patch_size = c.integer("patch_size", cfg.patch_size, 1, 64);
    cfg.in_channels = c.integer("in_channels", cfg.in_channels, 1, 4096);
    cfg.out_channels =
        c.has("out_channels") ? c.integer("out_channels", cfg.in_channels, 1, 4096) : cfg.in_channels;
    cfg.num_layers = c.integer("num_layers", cfg.num_layers, 1, 1024);
    cfg.attention_head_dim = c.integer("attention_head_dim", cfg.attention_head_dim, 1, 4096);
    cfg.num_attention_heads = c.integer("num_attention_heads", cfg.num_attention_heads, 1, 1024);
    cfg.joint_attention_dim = c.integer("joint_attention_dim", cfg.joint_attention_dim, 1, 1 << 16);
    cfg.caption_projection_dim = c.integer("caption_projection_dim", cfg.caption_projection_dim, 1, 1 << 16);
    cfg.pooled_projection_dim = c.integer("pooled_projection_dim", cfg.pooled_projection_dim, 1, 1 << 16);
    cfg.pos_embed_max_size = c.integer("pos_embed_max_size", cfg.pos_embed_max_size, 1, 4096);
    const std::string qk = c.string("qk_norm", "");
    if (!qk.empty() && qk != "rms_norm") c.fail("qk_norm", "is '" + qk + "'; supported: null, rms_norm");
    cfg.qk_rms_norm = qk == "rms_norm";
    if (c.has("dual_attention_layers") && !c.raw()["dual_attention_layers"].empty())
        c.fail("dual_attention_layers", "is not empty: SD3.5's dual-attention blocks are not supported yet");
    if (cfg.caption_projection_dim != cfg.inner_dim())
        c.fail("caption_projection_dim", "must equal num_attention_heads x attention_head_dim (" +
                                             std::to_string(cfg.inner_dim()) + ")");
    return cfg;
}

Sd3TransformerConfig Sd3TransformerConfig::from_json_file(const std::string& path) {
    const ConfigJson j = ConfigJson::from_file(path);
    return from_json_text(j.raw().dump(), path);
}

Sd3Transformer::Sd3Transformer(const Sd3TransformerConfig& config, WeightStore& w, int tp_rank, int tp_size,
                               std::shared_ptr<const DeviceMapping> mapping)
    : mapping_(std::move(mapping)), tp_size_(tp_size), config_(config) {
    if (mapping_ && static_cast<int64_t>(mapping_->transformer_blocks.size()) != config.num_layers)
        throw ModelError("device_map places " + std::to_string(mapping_->transformer_blocks.size()) +
                         " transformer blocks but the model has " + std::to_string(config.num_layers));
    if (mapping_) w.set_device(mapping_->devices[static_cast<std::size_t>(mapping_->transformer_blocks[0])]);
    const int64_t d = config.inner_dim(), p = config.patch_size, hd = config.attention_head_dim;
    if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size)
        throw ModelError("tensor parallel rank " + std::to_string(tp_rank) + " of " +
                         std::to_string(tp_size));
    if (config.num_attention_heads % tp_size != 0)
        throw ModelError("--tp " + std::to_string(tp_size) + ": the model has " +
                         std::to_string(config.num_attention_heads) +
                         " attention heads; tp must divide them");
    // The projections this rank keeps: all of them without tensor parallelism.
    auto column = [&](const std::string& name, int64_t in, int64_t out) {
        return tp_size > 1 ? Linear::load_column_shard(w, name, in, out, tp_rank, tp_size)
                           : Linear::load(w, name, in, out);
    };
    auto row = [&](const std::string& name, int64_t in, int64_t out) {
        return tp_size > 1 ? Linear::load_row_shard(w, name, in, out, tp_rank, tp_size)
                           : Linear::load(w, name, in, out);
    };
    patch_weight_ = w.take("pos_embed.proj.weight", {d, config.in_channels, p, p});
    patch_bias_ = w.take("pos_embed.proj.bias", {d});
    const int64_t max = config.pos_embed_max_size;
    if (w.has("pos_embed.pos_embed") && w.where().rfind("random", 0) != 0) {
        pos_embed_ = w.take("pos_embed.pos_embed", {1, max * max, d});
    } else {
        pos_embed_ =
            sincos_pos_embed_2d(d, max, config.sample_size / p).unsqueeze(0).to(w.device(), w.dtype());
    }
    time_1_ = Linear::load(w, "time_text_embed.timestep_embedder.linear_1", 256, d);
    time_2_ = Linear::load(w, "time_text_embed.timestep_embedder.linear_2", d, d);
    text_1_ = Linear::load(w, "time_text_embed.text_embedder.linear_1", config.pooled_projection_dim, d);
    text_2_ = Linear::load(w, "time_text_embed.text_embedder.linear_2", d, d);
    context_embedder_ = Linear::load(w, "context_embedder", config.joint_attention_dim, d);
    for (int64_t i = 0; i < config.num_layers; ++i) {
        if (mapping_)
            w.set_device(mapping_->devices[static_cast<std::size_t>(mapping_->transformer_blocks[i])]);
        const std::string b = "transformer_blocks." + std::to_string(i);
        JointBlock blk;
        blk.context_pre_only = i == config.num_layers - 1;
        blk.norm1.linear = Linear::load(w, b + ".norm1.linear", d, 6 * d);
        blk.norm1_context =
            Linear::load(w, b + ".norm1_context.linear", d, (blk.context_pre_only ? 2 : 6) * d);
        JointAttention& a = blk.attn;
        a.to_q = column(b + ".attn.to_q", d, d);
        a.to_k = column(b + ".attn.to_k", d, d);
        a.to_v = column(b + ".attn.to_v", d, d);
        a.to_out = row(b + ".attn.to_out.0", d, d);
        a.add_q = column(b + ".attn.add_q_proj", d, d);
        a.add_k = column(b + ".attn.add_k_proj", d, d);
        a.add_v = column(b + ".attn.add_v_proj", d, d);
        if (!blk.context_pre_only) a.to_add_out = row(b + ".attn.to_add_out", d, d);
        if (config.qk_rms_norm) {
            a.norm_q = RMSNorm::load(w, b + ".attn.norm_q", hd, 1e-6);
            a.norm_k = RMSNorm::load(w, b + ".attn.norm_k", hd, 1e-6);
            a.norm_added_q = RMSNorm::load(w, b + ".attn.norm_added_q", hd, 1e-6);
            a.norm_added_k = RMSNorm::load(w, b + ".attn.norm_added_k", hd, 1e-6);
        }
        blk.ff.in = column(b + ".ff.net.0.proj", d, 4 * d);
        blk.ff.out = row(b + ".ff.net.2", 4 * d, d);
        if (!blk.context_pre_only) {
            blk.ff_context.in = column(b + ".ff_context.net.0.proj", d, 4 * d);
            blk.ff_context.out = row(b + ".ff_context.net.2", 4 * d, d);
        }
        blocks_.push_back(std::move(blk));
    }
    if (mapping_) w.set_device(mapping_->devices[static_cast<std::size_t>(mapping_->transformer_blocks[0])]);
    norm_out_ = Linear::load(w, "norm_out.linear", d, 2 * d);
    proj_out_ = Linear::load(w, "proj_out", d, p * p * config.out_channels);
}

int64_t Sd3Transformer::parameter_bytes() const {
    int64_t total = 0;
    auto add = [&](const at::Tensor& t) {
        if (t.defined()) total += t.numel() * t.element_size();
    };
    auto add_linear = [&](const Linear& l) {
        add(l.weight);
        add(l.bias);
        add(l.row_parallel_bias);
    };
    add(patch_weight_);
    add(patch_bias_);
    add(pos_embed_);
    for (const Linear* l :
         {&time_1_, &time_2_, &text_1_, &text_2_, &context_embedder_, &norm_out_, &proj_out_})
        add_linear(*l);
    for (const JointBlock& b : blocks_) {
        const JointAttention& a = b.attn;
        for (const Linear* l :
             {&b.norm1.linear, &b.norm1_context, &a.to_q, &a.to_k, &a.to_v, &a.to_out, &a.add_q, &a.add_k,
              &a.add_v, &a.to_add_out, &b.ff.in, &b.ff.out, &b.ff_context.in, &b.ff_context.out})
            add_linear(*l);
        for (const auto* n : {&a.norm_q, &a.norm_k, &a.norm_added_q, &a.norm_added_k})
            if (*n) add((*n)->weight);
    }
    return total;
}

at::Tensor Sd3Transformer::forward(const at::Tensor& latents, const at::Tensor& text,
                                   const at::Tensor& pooled, const at::Tensor& timestep,
                                   int64_t tail_repeats) const {
    // With tensor parallelism this rank holds heads / tp of the attention heads.
    const int64_t p = config_.patch_size, heads = config_.num_attention_heads / tp_size_;
    if (tp_size_ > 1 && (!tensor_group_ || tensor_group_->size() != tp_size_))
        throw ModelError("a tensor-parallel shard needs its tensor group of " + std::to_string(tp_size_) +
                         " ranks (set_tensor_group)");
    // A row-parallel layer's output: the sum over the tp ranks, then the bias, once.
    auto reduced = [&](const Linear& layer, at::Tensor partial) {
        if (tp_size_ == 1) return partial;
        tensor_group_->all_reduce(partial);
        return partial + layer.row_parallel_bias;
    };
    const int64_t batch = latents.size(0), height = latents.size(2), width = latents.size(3);
    if (height % p != 0 || width % p != 0)
        throw ModelError("latent size " + std::to_string(height) + "x" + std::to_string(width) +
                         " is not a multiple of the patch size " + std::to_string(p));
    if (tail_repeats < 1 || text.dim() != 3 || text.size(1) < 1)
        throw ModelError("the text must hold at least one token and its last token at least one repeat");
    const int64_t gh = height / p, gw = width / p, max = config_.pos_embed_max_size;
    if (gh > max || gw > max)
        throw ModelError("latent size " + std::to_string(height) + "x" + std::to_string(width) + " needs " +
                         std::to_string(gh) + "x" + std::to_string(gw) +
                         " patches; this model's position table has " + std::to_string(max) + "x" +
                         std::to_string(max));

    // Patch embedding plus the centre crop of the position table.
    at::Tensor x = at::conv2d(latents, patch_weight_, patch_bias_, {p, p}).flatten(2).transpose(1, 2);
    const int64_t top = (max - gh) / 2, left = (max - gw) / 2;
    at::Tensor pos = pos_embed_.reshape({1, max, max, -1})
                         .slice(1, top, top + gh)
                         .slice(2, left, left + gw)
                         .reshape({1, gh * gw, -1});
    x = (x + pos).to(latents.scalar_type()).contiguous();

    // Conditioning: timestep and pooled text.
    at::Tensor t = timestep_embedding(timestep, 256).to(pooled.scalar_type());
    at::Tensor temb = time_2_(at::silu(time_1_(t))) + text_2_(at::silu(text_1_(pooled)));
    at::Tensor ctx = context_embedder_(text);
    at::Tensor temb_act = at::silu(temb);

    // Note [Ulysses with joint attention]: with a sequence group of size U, each rank keeps a
    // contiguous 1/U of the (padded) image tokens through every per-token layer. In attention,
    // the image q, k, v go through an all-to-all from [tokens/U, all heads] to [all tokens, heads/U];
    // the text tokens are replicated, so each rank just takes its heads of them, and the text
    // is counted once. Padded image positions are masked out as keys. The image output goes back
    // through the inverse all-to-all; the text output, [text, heads/U] on each rank, is gathered
    // over heads so every rank keeps the whole text stream.
    Communicator* ulysses = sequence_group_ && sequence_group_->size() > 1 ? sequence_group_ : nullptr;
    Communicator* ring = ring_group_ && ring_group_->size() > 1 ? ring_group_ : nullptr;
    const int64_t image_tokens = x.size(1);
    const int64_t nu = ulysses ? ulysses->size() : 1, nr = ring ? ring->size() : 1;
    // Tokens are split over ring x ulysses ranks, ring outermost: this rank's block of `local`
    // tokens is number ring_rank * nu + ulysses_rank, so a ring rank's ulysses group holds one
    // contiguous segment of `seg` tokens.
    const int64_t padded = (image_tokens + nu * nr - 1) / (nu * nr) * (nu * nr);
    const int64_t local = padded / (nu * nr), seg = local * nu;
    const int64_t block = (ring ? ring->rank() : 0) * nu + (ulysses ? ulysses->rank() : 0);
    // Note [constant text tail]: without a T5 encoder SD3's text is CLIP's tokens followed by 256
    // positions of zeros. Those stay identical through every block (text has no position
    // embedding, every per-token layer maps equal rows to equal rows, and as queries they meet the
    // same keys), so the caller passes one of them and tail_repeats. As a query it gives each copy's
    // output; as a key it stands for all copies: softmax weight n e^s, the same as logit s + ln n.
    // Exact up to rounding (the bias is rounded to the compute dtype); the built-in model (64
    // image tokens) trains 3x faster for it.
    const int64_t text_tokens = ctx.size(1);
    const double tail_bias = std::log(static_cast<double>(tail_repeats));
    // The additive bias over [image keys, padded to image_keys; text keys]: -inf on padding, the
    // tail's ln n on the last text key; undefined where neither applies.
    auto joint_key_bias = [&](int64_t image_keys, const at::TensorOptions& options) {
        at::Tensor bias;
        if (image_keys == image_tokens && tail_repeats == 1) return bias;
        bias = at::zeros({image_keys + text_tokens}, options);
        bias.slice(0, image_tokens, image_keys).fill_(-INFINITY);
        bias.narrow(0, image_keys + text_tokens - 1, 1).fill_(tail_bias);
        return bias.view({1, 1, 1, -1});
    };
    if (ulysses || ring) {
        if (ulysses && heads % nu != 0)
            throw ModelError("context parallelism: " + std::to_string(heads) +
                             " attention heads do not divide by " + std::to_string(nu));
        if (padded > image_tokens) x = at::constant_pad_nd(x, {0, 0, 0, padded - image_tokens}, 0);
        x = x.narrow(1, block * local, local).contiguous();
    }
    const int64_t hu = heads / nu;
    const int64_t first_head = ulysses ? ulysses->rank() * hu : 0;
    // Ulysses: [B, H, local, d] (all heads, my tokens) -> [B, H/U, seg, d] (my heads, my segment).
    auto tokens_to_heads = [&](const at::Tensor& t) {
        if (!ulysses) return t;
        const int64_t b = t.size(0), d = t.size(3);
        at::Tensor blocks = t.reshape({b, nu, hu, local, d}).permute({1, 0, 2, 3, 4});
        at::Tensor got = ulysses->all_to_all(blocks);  // block i: my heads of rank i's tokens
        return got.permute({1, 2, 0, 3, 4}).reshape({b, hu, seg, d});
    };
    // The inverse: [B, H/U, seg, d] -> [B, H, local, d].
    auto heads_to_tokens = [&](const at::Tensor& t) {
        if (!ulysses) return t;
        const int64_t b = t.size(0), d = t.size(3);
        at::Tensor blocks = t.reshape({b, hu, nu, local, d}).permute({2, 0, 1, 3, 4});
        at::Tensor got = ulysses->all_to_all(blocks);  // block i: rank i's heads of my tokens
        return got.permute({1, 0, 2, 3, 4}).reshape({b, heads, local, d});
    };
    // This rank's heads of the replicated text, and the text output gathered back over heads.
    auto my_heads = [&](const at::Tensor& t) { return ulysses ? t.narrow(1, first_head, hu) : t; };
    auto all_heads = [&](const at::Tensor& t) {
        return ulysses ? at::cat(ulysses->all_gather(t.contiguous()), 1) : t;
    };
    // Without ring, attention sees all `seg` (= padded) image keys at once.
    const at::Tensor key_bias = ring ? at::Tensor() : joint_key_bias(seg, x.options());

    // device_map: the activations follow the blocks from device to device (the head's first).
    const int head_slot = mapping_ ? mapping_->transformer_blocks.front() : 0;
    int slot = head_slot;
    auto move_to = [&](int to) {
        if (to == slot) return;
        x = mapping_->move(x, slot, to);
        ctx = mapping_->move(ctx, slot, to);
        temb_act = mapping_->move(temb_act, slot, to);
        slot = to;
    };
    for (std::size_t block = 0; block < blocks_.size(); ++block) {
        const JointBlock& blk = blocks_[block];
        if (mapping_) move_to(mapping_->transformer_blocks[block]);
        const std::vector<at::Tensor> m =
            blk.norm1.linear(temb_act).chunk(6, 1);  // shift, scale, gate (msa), shift, scale, gate (mlp)
        at::Tensor nx = modulate(plain_layer_norm(x), m[0], m[1]);
        std::vector<at::Tensor> mc;
        at::Tensor nctx;
        if (blk.context_pre_only) {
            const std::vector<at::Tensor> sc =
                blk.norm1_context(temb_act.to(ctx.scalar_type())).chunk(2, 1);  // scale, shift
            nctx = modulate(plain_layer_norm(ctx), sc[1], sc[0]);
        } else {
            mc = blk.norm1_context(temb_act).chunk(6, 1);
            nctx = modulate(plain_layer_norm(ctx), mc[0], mc[1]);
        }

        // Joint attention over [image tokens; text tokens].
        const JointAttention& a = blk.attn;
        at::Tensor q = split_heads(a.to_q(nx), heads), k = split_heads(a.to_k(nx), heads),
                   v = split_heads(a.to_v(nx), heads);
        at::Tensor cq = split_heads(a.add_q(nctx), heads), ck = split_heads(a.add_k(nctx), heads),
                   cv = split_heads(a.add_v(nctx), heads);
        if (a.norm_q) {
            q = (*a.norm_q)(q);
            k = (*a.norm_k)(k);
            cq = (*a.norm_added_q)(cq);
            ck = (*a.norm_added_k)(ck);
        }
        at::Tensor attn_x, attn_c;
        if (ring) {
            // Note [ring attention merge]: the queries here are this rank's image tokens (its
            // segment, with Ulysses) and all text tokens, for its heads. They meet the text keys
            // once, then each ring rank's image key/value segment as it comes round the ring; the
            // partial results are merged exactly by their log-sum-exps:
            // out = (out_a e^{lse_a} + out_b e^{lse_b}) / (e^{lse_a} + e^{lse_b}).
            const at::Tensor queries = at::cat({tokens_to_heads(q), my_heads(cq)}, 2);
            const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
            at::Tensor out, lse;
            // last_key_bias: added to the last key's logit (Note [constant text tail]).
            auto absorb = [&](const at::Tensor& keys, const at::Tensor& values, const at::Tensor& keep,
                              double last_key_bias = 0) {
                at::Tensor scores = at::matmul(queries, keys.transpose(-2, -1)) * scale;
                if (last_key_bias != 0) scores.narrow(-1, scores.size(-1) - 1, 1).add_(last_key_bias);
                if (keep.defined())
                    scores = scores.masked_fill(keep.logical_not().view({1, 1, 1, -1}), -INFINITY);
                const at::Tensor block_lse = at::logsumexp(scores, -1, true);
                const at::Tensor block_out = at::matmul(at::exp(scores - block_lse), values);
                if (!out.defined()) {
                    out = block_out;
                    lse = block_lse;
                    return;
                }
                const at::Tensor merged = at::logaddexp(lse, block_lse);
                out = out * at::exp(lse - merged) + block_out * at::exp(block_lse - merged);
                lse = merged;
            };
            absorb(my_heads(ck), my_heads(cv), {}, tail_bias);  // the replicated text keys, once
            at::Tensor block_k = tokens_to_heads(k), block_v = tokens_to_heads(v);
            for (int64_t step = 0; step < nr; ++step) {
                const int64_t owner = (ring->rank() - step + nr) % nr, start = owner * seg;
                if (start < image_tokens) {  // a segment of padding alone is skipped
                    at::Tensor keep;
                    if (start + seg > image_tokens)
                        keep = at::arange(start, start + seg,
                                          at::TensorOptions().dtype(at::kLong).device(x.device())) <
                               image_tokens;
                    absorb(block_k, block_v, keep);
                }
                if (step + 1 < nr) {
                    block_k = ring->ring_shift(block_k);
                    block_v = ring->ring_shift(block_v);
                }
            }
            attn_x =
                reduced(a.to_out, a.to_out(merge_heads(heads_to_tokens(out.narrow(2, 0, seg).contiguous()))));
            if (!blk.context_pre_only)
                attn_c = reduced(a.to_add_out,
                                 a.to_add_out(merge_heads(all_heads(out.narrow(2, seg, out.size(2) - seg)))));
        } else {  // one attention over all keys; with Ulysses, this rank's heads of all tokens
            at::Tensor joint = at::scaled_dot_product_attention(
                at::cat({tokens_to_heads(q), my_heads(cq)}, 2),
                at::cat({tokens_to_heads(k), my_heads(ck)}, 2),
                at::cat({tokens_to_heads(v), my_heads(cv)}, 2),
                key_bias.defined() ? std::optional<at::Tensor>(key_bias.to(q.scalar_type())) : std::nullopt);
            attn_x = reduced(a.to_out,
                             a.to_out(merge_heads(heads_to_tokens(joint.narrow(2, 0, seg).contiguous()))));
            if (!blk.context_pre_only)
                attn_c =
                    reduced(a.to_add_out,
                            a.to_add_out(merge_heads(all_heads(joint.narrow(2, seg, joint.size(2) - seg)))));
        }

        x = x + m[2].unsqueeze(1) * attn_x;
        x = x + m[5].unsqueeze(1) * reduced(blk.ff.out, blk.ff(modulate(plain_layer_norm(x), m[3], m[4])));
        if (!blk.context_pre_only) {
            ctx = ctx + mc[2].unsqueeze(1) * attn_c;
            ctx = ctx +
                  mc[5].unsqueeze(1) * reduced(blk.ff_context.out,
                                               blk.ff_context(modulate(plain_layer_norm(ctx), mc[3], mc[4])));
        }
    }

    if (mapping_ && slot != head_slot) {
        x = mapping_->move(x, slot, head_slot);
        temb_act = mapping_->move(temb_act, slot, head_slot);
    }
    const std::vector<at::Tensor> sc = norm_out_(temb_act.to(x.scalar_type())).chunk(2, 1);  // scale, shift
    x = proj_out_(modulate(plain_layer_norm(x), sc[1], sc[0]));
    // Every rank gets all tokens back, unpadded: the ulysses group's blocks make a segment, the
    // ring's segments the image.
    if (ulysses) x = at::cat(ulysses->all_gather(x.contiguous()), 1);
    if (ring) x = at::cat(ring->all_gather(x.contiguous()), 1);
    if (ulysses || ring) x = x.narrow(1, 0, image_tokens);
    // Unpatchify: [B, gh, gw, p, p, C] -> [B, C, gh * p, gw * p].
    x = x.reshape({batch, gh, gw, p, p, config_.out_channels}).permute({0, 5, 1, 3, 2, 4});
    return x.reshape({batch, config_.out_channels, gh * p, gw * p});
}

}  // namespace dp::runtime
