#include "runtime/models/sd3/sd3_transformer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "runtime/io/config_json.h"
#include "runtime/io/errors.h"
#include "runtime/parallel/attention.h"
#include "runtime/parallel/sequence_shard.h"
#include "strategies/family.h"

namespace dp::runtime {
namespace {

at::Tensor sincos_1d(int64_t dim, const at::Tensor& pos) {
    at::Tensor omega = at::arange(dim / 2, at::kDouble) / (dim / 2.0);
    omega = 1.0 / at::pow(10000.0, omega);
    at::Tensor out = at::outer(pos.reshape(-1).to(at::kDouble), omega);
    return at::cat({at::sin(out), at::cos(out)}, 1);
}

// One axis of diffusers' square sin-cos table: each of the `grid` coordinates (i / (grid / base))
// embedded over dim / 2 features, [grid, dim / 2], computed in double and rounded to float.
at::Tensor sincos_axis(int64_t dim, int64_t grid, int64_t base_size) {
    if (dim % 4 != 0)
        throw ModelError("the sin-cos position table needs a width divisible by 4, not " +
                         std::to_string(dim));
    const at::Tensor coords =
        at::arange(grid, at::kFloat) / (static_cast<double>(grid) / static_cast<double>(base_size));
    return sincos_1d(dim / 2, coords).to(at::kFloat);
}

// Note [position table from its axis]: diffusers' table row for patch (i, j) is the column's axis
// embedding followed by the row's, [axis(j), axis(i)], the same axis for both (the grid is
// square). So any crop is two slices of the axis table, and SD3.5-medium's 384 x 384 table
// (0.9 GB at width 1536 in fp32) is never built when the checkpoint does not store it.
at::Tensor crop_from_axis(const at::Tensor& axis, int64_t top, int64_t left, int64_t height, int64_t width) {
    const int64_t half = axis.size(1);
    const at::Tensor cols = axis.narrow(0, left, width).unsqueeze(0).expand({height, width, half});
    const at::Tensor rows = axis.narrow(0, top, height).unsqueeze(1).expand({height, width, half});
    return at::cat({cols, rows}, 2).reshape({height * width, 2 * half});
}

}  // namespace

at::Tensor sincos_pos_embed_2d(int64_t dim, int64_t grid, int64_t base_size) {
    return crop_from_axis(sincos_axis(dim, grid, base_size), 0, 0, grid, grid);
}

at::Tensor sincos_pos_embed_crop(int64_t dim, int64_t grid, int64_t base_size, int64_t height,
                                 int64_t width) {
    if (height < 1 || width < 1 || height > grid || width > grid)
        throw ModelError("a " + std::to_string(height) + "x" + std::to_string(width) + " crop of a " +
                         std::to_string(grid) + "x" + std::to_string(grid) + " position table");
    return crop_from_axis(sincos_axis(dim, grid, base_size), (grid - height) / 2, (grid - width) / 2, height,
                          width);
}

bool Sd3TransformerConfig::dual_attention(int64_t block) const {
    return std::binary_search(dual_attention_layers.begin(), dual_attention_layers.end(), block);
}

Sd3TransformerConfig Sd3TransformerConfig::from_json_text(const std::string& text, const std::string& path) {
    const ConfigJson c(text, path);
    c.require_class("transformer", "SD3Transformer2DModel");
    Sd3TransformerConfig cfg;
    const strategies::TransformerShape& shape = strategies::family_spec("sd3").transformer_defaults;
    cfg.sample_size = c.integer("sample_size", shape.sample_size, 1, 1 << 16);
    cfg.patch_size = c.integer("patch_size", shape.patch_size, 1, 64);
    cfg.in_channels = c.integer("in_channels", shape.in_channels, 1, 4096);
    cfg.out_channels =
        c.has("out_channels") ? c.integer("out_channels", cfg.in_channels, 1, 4096) : cfg.in_channels;
    cfg.num_layers = c.integer("num_layers", shape.layers, 1, 1024);
    cfg.attention_head_dim = c.integer("attention_head_dim", shape.head_dim, 1, 4096);
    cfg.num_attention_heads = c.integer("num_attention_heads", shape.heads, 1, 1024);
    cfg.joint_attention_dim = c.integer("joint_attention_dim", cfg.joint_attention_dim, 1, 1 << 16);
    cfg.caption_projection_dim = c.integer("caption_projection_dim", cfg.caption_projection_dim, 1, 1 << 16);
    cfg.pooled_projection_dim = c.integer("pooled_projection_dim", cfg.pooled_projection_dim, 1, 1 << 16);
    cfg.pos_embed_max_size = c.integer("pos_embed_max_size", cfg.pos_embed_max_size, 1, 4096);
    const std::string qk = c.string("qk_norm", "");
    if (!qk.empty() && qk != "rms_norm") c.fail("qk_norm", "is '" + qk + "'; supported: null, rms_norm");
    cfg.qk_rms_norm = qk == "rms_norm";
    // SD3.5's MMDiT-X blocks: a list of block indices (diffusers' tuple), null or [] for none.
    if (c.has("dual_attention_layers") && !c.raw().at("dual_attention_layers").is_null()) {
        const nlohmann::json& list = c.raw().at("dual_attention_layers");
        const std::string accepted =
            "a list of block indices from 0 to num_layers - 1 (" + std::to_string(cfg.num_layers - 1) + ")";
        if (!list.is_array())
            c.fail("dual_attention_layers", "is " + list.dump().substr(0, 40) + "; expected " + accepted);
        for (const nlohmann::json& v : list) {
            if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= cfg.num_layers)
                c.fail("dual_attention_layers", "holds " + v.dump().substr(0, 40) + "; expected " + accepted);
            cfg.dual_attention_layers.push_back(v.get<int64_t>());
        }
        std::vector<int64_t>& l = cfg.dual_attention_layers;
        std::sort(l.begin(), l.end());
        l.erase(std::unique(l.begin(), l.end()), l.end());
    }
    if (cfg.caption_projection_dim != cfg.inner_dim())
        c.fail("caption_projection_dim", "must equal num_attention_heads x attention_head_dim (" +
                                             std::to_string(cfg.inner_dim()) + ")");
    return cfg;
}

Sd3Transformer::Sd3Transformer(const Sd3TransformerConfig& config, WeightStore& w,
                               const ParallelContext& parallel, std::shared_ptr<const DeviceMapping> mapping)
    : TransformerBase(config, w, parallel, std::move(mapping), static_cast<std::size_t>(config.num_layers),
                      "sd3") {
    const int64_t d = config.inner_dim(), p = config.patch_size, hd = config.attention_head_dim;
    // Every linear layer as SD3's parallel spec splits it; the MLPs' features as evenly as tp allows.
    const LinearLoader linear = linear_loader(w);
    patch_weight_ = w.take("pos_embed.proj.weight", {d, config.in_channels, p, p});
    patch_bias_ = w.take("pos_embed.proj.bias", {d});
    // As diffusers: the checkpoint's table when it stores one, else the sin-cos table (base size
    // sample_size / patch), kept as its axis (Note [position table from its axis]).
    const int64_t max = config.pos_embed_max_size;
    if (w.has("pos_embed.pos_embed") && w.where().rfind("random", 0) != 0) {
        pos_embed_ = w.take("pos_embed.pos_embed", {1, max * max, d});
    } else {
        pos_embed_1d_ = sincos_axis(d, max, config.sample_size / p).to(w.device(), w.dtype());
    }
    time_1_ = linear("time_text_embed.timestep_embedder.linear_1", 256, d);
    time_2_ = linear("time_text_embed.timestep_embedder.linear_2", d, d);
    text_1_ = linear("time_text_embed.text_embedder.linear_1", config.pooled_projection_dim, d);
    text_2_ = linear("time_text_embed.text_embedder.linear_2", d, d);
    context_embedder_ = linear("context_embedder", config.joint_attention_dim, d);
    DualStreamLayout layout;
    layout.qk_norm = config.qk_rms_norm;
    devices_.load_blocks(w, [&](std::size_t block) {
        const auto i = static_cast<int64_t>(block);
        // The last block's text only gives keys and values; SD3.5's MMDiT-X blocks add attn2.
        blocks_.emplace_back(linear, spec_->block_prefixes.front() + std::to_string(i), d, hd, layout,
                             /*context_pre_only=*/i == config.num_layers - 1, config.dual_attention(i));
    });
    norm_out_ = linear("norm_out.linear", d, 2 * d);
    proj_out_ = linear("proj_out", d, p * p * config.out_channels);
    loaded(w);
}

at::Tensor Sd3Transformer::forward(const at::Tensor& latents, const at::Tensor& text,
                                   const at::Tensor& pooled, const at::Tensor& timestep, int64_t tail_repeats,
                                   const std::vector<int>& skip_layers, const BlockRunner& runner) const {
    // With tensor parallelism this rank holds its share of the attention heads.
    const int64_t p = config_.patch_size, heads = parallel_->tensor().share(config_.num_attention_heads);
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
    std::vector<bool> skipped(blocks_.size(), false);
    for (int layer : skip_layers) {
        if (layer < 0 || static_cast<std::size_t>(layer) >= blocks_.size())
            throw ModelError("skip layer " + std::to_string(layer) + ": the transformer has " +
                             std::to_string(blocks_.size()) +
                             " blocks; skipped layers are block indices 0 to " +
                             std::to_string(blocks_.size() - 1));
        skipped[static_cast<std::size_t>(layer)] = true;
    }

    // Patch embedding plus the centre crop of the position table. Note [patch embedding as a
    // matmul]: the Conv2d(kernel = stride = patch) is computed as a linear layer over the
    // flattened patches, the same sum; oneDNN's convolution picks its algorithm by shape and
    // thread count, so as a convolution the latents changed in the last bits with the number of
    // intra-op threads (and so with the number of processes), while the matmul does not.
    const int64_t channels = latents.size(1);
    at::Tensor x = latents.reshape({batch, channels, gh, p, gw, p})
                       .permute({0, 2, 4, 1, 3, 5})
                       .reshape({batch, gh * gw, channels * p * p});
    x = at::linear(x, patch_weight_.reshape({patch_weight_.size(0), -1}), patch_bias_);
    const int64_t top = (max - gh) / 2, left = (max - gw) / 2;
    const at::Tensor pos = pos_embed_.defined()
                               ? pos_embed_.reshape({1, max, max, -1})
                                     .slice(1, top, top + gh)
                                     .slice(2, left, left + gw)
                                     .reshape({1, gh * gw, -1})
                               : crop_from_axis(pos_embed_1d_, top, left, gh, gw).unsqueeze(0);
    x = (x + pos).to(latents.scalar_type()).contiguous();

    // Conditioning: timestep and pooled text.
    at::Tensor t = timestep_embedding(timestep, 256).to(pooled.scalar_type());
    at::Tensor temb = time_2_(at::silu(time_1_(t))) + text_2_(at::silu(text_1_(pooled)));
    at::Tensor ctx = context_embedder_(text);
    at::Tensor temb_act = at::silu(temb);

    // The image tokens are split over the sequence groups; the text as the spec says (SD3's short
    // CLIP text is replicated, counted once).
    const SequenceShard image(x.size(1), parallel_->sequence());
    const SequenceShard words(ctx.size(1), text_split_ ? parallel_->sequence() : SequenceGroups{});
    x = image.shard(x);
    if (text_split_) ctx = words.shard(ctx);
    // Note [constant text tail]: without a T5 encoder SD3's text is CLIP's tokens followed by 256
    // positions of zeros. Those stay identical through every block (text has no position
    // embedding, every per-token layer maps equal rows to equal rows, and as queries they meet the
    // same keys), so the caller passes one of them and tail_repeats. As a query it gives each copy's
    // output; as a key it stands for all copies: softmax weight n e^s, the same as logit s + ln n.
    // Exact up to rounding (the bias is rounded to the compute dtype); the built-in model (64
    // image tokens) trains 3x faster for it.
    DualStreamStep step;
    step.heads = heads;
    step.image = &image;
    step.text = text_split_ ? &words : nullptr;
    if (tail_repeats > 1) {
        step.text_bias = at::zeros({1, text.size(1)}, x.options());
        step.text_bias.narrow(1, text.size(1) - 1, 1).fill_(std::log(static_cast<double>(tail_repeats)));
    }

    BlockPass pass;
    pass.blocks = blocks_.size();
    pass.image = &x;
    pass.image_shard = &image;
    pass.conditioning = &temb_act;
    pass.activations = {&ctx};
    pass.skipped = skipped;
    runner.run(pass, devices_, [&](const BlockContext& block) {
        step.last = block.last();
        step.block = &block;
        blocks_[block.index()].forward(x, ctx, temb_act, step);
    });
    const std::vector<at::Tensor> sc = norm_out_(temb_act.to(x.scalar_type())).chunk(2, 1);  // scale, shift
    x = image.gather(proj_out_(adaln::norm_modulate(x, sc[1], sc[0], 1e-6)));
    // Unpatchify: [B, gh, gw, p, p, C] -> [B, C, gh * p, gw * p].
    x = x.reshape({batch, gh, gw, p, p, config_.out_channels}).permute({0, 5, 1, 3, 2, 4});
    return x.reshape({batch, config_.out_channels, gh * p, gw * p});
}

}  // namespace dp::runtime
