#include "runtime/models/flux2/flux2_transformer.h"

#include <ATen/ATen.h>

#include <set>

#include "runtime/io/config_json.h"
#include "runtime/io/errors.h"
#include "runtime/parallel/sequence_shard.h"
#include "strategies/family.h"

namespace dp::runtime {
namespace {

constexpr double kEps = 1e-6;  // the shared blocks' (mmdit.h): the only eps this code runs

const std::set<std::string>& known_keys() {
    static const std::set<std::string> keys = {"patch_size",
                                               "in_channels",
                                               "out_channels",
                                               "num_layers",
                                               "num_single_layers",
                                               "attention_head_dim",
                                               "num_attention_heads",
                                               "joint_attention_dim",
                                               "timestep_guidance_channels",
                                               "mlp_ratio",
                                               "axes_dims_rope",
                                               "rope_theta",
                                               "eps",
                                               "guidance_embeds"};
    return keys;
}

std::string shape_of(const at::Tensor& t) { return t.defined() ? c10::str(t.sizes()) : std::string("none"); }

}  // namespace

Flux2TransformerConfig Flux2TransformerConfig::from_json_text(const std::string& text,
                                                              const std::string& path) {
    const ConfigJson c(text, path);
    c.require_class("transformer", "Flux2Transformer2DModel");
    for (const auto& [key, value] : c.raw().items()) {
        if (key.empty() || key[0] == '_' || known_keys().count(key)) continue;
        if (value.is_null() || (value.is_boolean() && !value.get<bool>())) continue;
        c.fail(key.c_str(), "is set, and Flux2Transformer2DModel as this code runs it has no such key");
    }
    Flux2TransformerConfig cfg;
    const strategies::TransformerShape& shape = strategies::family_spec("flux2-klein").transformer_defaults;
    if (c.integer("patch_size", 1, 1, 64) != 1)
        c.fail("patch_size", "must be 1 (the pipeline patchifies the latents 2 x 2 itself)");
    cfg.in_channels = c.integer("in_channels", shape.in_channels, 1, 1 << 16);
    if (c.integer("out_channels", cfg.in_channels, 1, 1 << 16) != cfg.in_channels)
        c.fail("out_channels", "must be null or in_channels (" + std::to_string(cfg.in_channels) + ")");
    cfg.num_layers = c.integer("num_layers", shape.layers, 0, 1024);
    cfg.num_single_layers = c.integer("num_single_layers", cfg.num_single_layers, 0, 1024);
    if (cfg.num_layers + cfg.num_single_layers < 1) c.fail("num_layers", "the model needs a block");
    cfg.attention_head_dim = c.integer("attention_head_dim", shape.head_dim, 2, 4096);
    cfg.num_attention_heads = c.integer("num_attention_heads", shape.heads, 1, 1024);
    cfg.joint_attention_dim = c.integer("joint_attention_dim", cfg.joint_attention_dim, 1, 1 << 20);
    cfg.timestep_guidance_channels =
        c.integer("timestep_guidance_channels", cfg.timestep_guidance_channels, 2, 1 << 16);
    if (cfg.timestep_guidance_channels % 2)
        c.fail("timestep_guidance_channels", "must be even (cosines, then sines)");
    cfg.mlp_ratio = c.number("mlp_ratio", cfg.mlp_ratio, 0.0, 64.0);
    if (cfg.mlp_ratio != 3.0)
        c.fail("mlp_ratio",
               "must be 3.0, as every FLUX.2 release has it (the parallel spec splits the fused "
               "projections as widths 1 : 3)");
    cfg.axes_dims_rope = rope_axes_dims(c, cfg.axes_dims_rope, cfg.attention_head_dim, "T, H, W, L");
    cfg.rope_theta = c.number("rope_theta", cfg.rope_theta, 1.0, 1e9);
    cfg.eps = c.number("eps", cfg.eps, 0.0, 1.0);
    if (cfg.eps != kEps) c.fail("eps", "must be 1e-6, as every FLUX.2 release has it");
    cfg.guidance_embeds = c.boolean("guidance_embeds", cfg.guidance_embeds);
    return cfg;
}

Flux2Transformer::Flux2Transformer(const Flux2TransformerConfig& config, WeightStore& w,
                                   const ParallelContext& parallel,
                                   std::shared_ptr<const DeviceMapping> mapping)
    : TransformerBase(config, w, parallel, std::move(mapping),
                      static_cast<std::size_t>(config.num_layers + config.num_single_layers), "flux2-klein") {
    const int64_t d = config.inner_dim(), hd = config.attention_head_dim, mlp = config.mlp_hidden();
    const int64_t f = config.timestep_guidance_channels;
    if (!text_split_)
        throw InternalError(
            "FLUX.2's single blocks run text and image as one stream: its spec must split the text");
    const LinearLoader linear = linear_loader(w);
    x_embedder_ = linear("x_embedder", config.in_channels, d, 1, false);
    context_embedder_ = linear("context_embedder", config.joint_attention_dim, d, 1, false);
    time_1_ = linear("time_guidance_embed.timestep_embedder.linear_1", f, d, 1, false);
    time_2_ = linear("time_guidance_embed.timestep_embedder.linear_2", d, d, 1, false);
    if (config.guidance_embeds) {
        guidance_1_ = linear("time_guidance_embed.guidance_embedder.linear_1", f, d, 1, false);
        guidance_2_ = linear("time_guidance_embed.guidance_embedder.linear_2", d, d, 1, false);
    }
    modulation_image_ = linear("double_stream_modulation_img.linear", d, 6 * d, 1, false);
    modulation_text_ = linear("double_stream_modulation_txt.linear", d, 6 * d, 1, false);
    modulation_single_ = linear("single_stream_modulation.linear", d, 3 * d, 1, false);
    DualStreamLayout layout;
    layout.image_modulation.clear();  // the model's, shared
    layout.text_modulation.clear();
    layout.swiglu = true;
    layout.mlp_hidden = mlp;
    layout.bias = false;
    layout.qk_rounding = RmsRounding::kTorch;       // torch.nn.RMSNorm
    layout.clamp = DualStreamLayout::Clamp::kText;  // as diffusers: the text stream only
    devices_.load_blocks(w, [&](std::size_t block) {
        const auto i = static_cast<int64_t>(block);
        if (i < config.num_layers) {
            double_blocks_.emplace_back(linear, spec_->block_prefixes[0] + std::to_string(i), d, hd, layout);
            return;
        }
        const std::string b = spec_->block_prefixes[1] + std::to_string(i - config.num_layers);
        Flux2SingleBlock blk;
        // q, k, v by whole heads, the MLP's halves in head_dim blocks too, so that to_out's two
        // input segments meet them.
        blk.to_qkv_mlp_proj = linear(b + ".attn.to_qkv_mlp_proj", d, 3 * d + 2 * mlp, hd, false);
        blk.to_out = linear(b + ".attn.to_out", d + mlp, d, hd, false);
        blk.norm_q = RMSNorm::load(w, b + ".attn.norm_q", hd, kEps, true, RmsRounding::kTorch);
        blk.norm_k = RMSNorm::load(w, b + ".attn.norm_k", hd, kEps, true, RmsRounding::kTorch);
        single_blocks_.push_back(std::move(blk));
    });
    norm_out_ = linear("norm_out.linear", d, 2 * d, 1, false);
    proj_out_ = linear("proj_out", d, config.in_channels, 1, false);
    loaded(w);
}

at::Tensor Flux2Transformer::time_embedding(const at::Tensor& timestep, const at::Tensor& guidance,
                                            int64_t batch) const {
    const at::ScalarType dtype = x_embedder_.weight().scalar_type();
    const at::Device device = x_embedder_.weight().device();
    const int64_t f = config_.timestep_guidance_channels;
    // As diffusers: the value times 1000 in the model's dtype, the sinusoid in fp32, then the
    // embedder in the model's dtype.
    auto embed = [&](const at::Tensor& value, const ParallelLinear& l1, const ParallelLinear& l2) {
        const at::Tensor v = value.reshape({-1}).to(device, dtype).expand({batch}) * 1000;
        return l2(at::silu(l1(timestep_embedding(v, f).to(dtype))));
    };
    at::Tensor temb = embed(timestep, time_1_, time_2_);
    if (config_.guidance_embeds) temb = temb + embed(guidance, guidance_1_, guidance_2_);
    return temb;
}

void Flux2Transformer::single_block(const BlockContext& block, OneStream& stream,
                                    const SequenceShard& image_shard, const SequenceShard& words,
                                    at::Tensor& image) const {
    const Flux2SingleBlock& blk = single_blocks_[block.index() - double_blocks_.size()];
    const int64_t nt = stream.text, ni = stream.tokens.size(1) - nt;
    const int64_t heads = parallel_->tensor().share(config_.num_attention_heads);
    const int64_t width = heads * config_.attention_head_dim;
    const bool last = block.last();  // the image alone: its text feeds nothing
    at::Tensor& joint = stream.tokens;
    const std::vector<at::Tensor> m = stream.modulation.chunk(3, 1);  // shift, scale, gate
    const at::Tensor h = adaln::norm_modulate(joint, m[0], m[1], kEps);
    const at::Tensor p = blk.to_qkv_mlp_proj(h);
    const int64_t mlp = (p.size(2) - 3 * width) / 2;  // this rank's share of each MLP half
    const at::Tensor attn = block.attention([&] {
        const at::Tensor q = apply_interleaved_rope(blk.norm_q(split_heads(p.narrow(2, 0, width), heads)),
                                                    stream.cos, stream.sin);
        const at::Tensor k = apply_interleaved_rope(blk.norm_k(split_heads(p.narrow(2, width, width), heads)),
                                                    stream.cos, stream.sin);
        const at::Tensor v = split_heads(p.narrow(2, 2 * width, width), heads);
        return std::vector<at::Tensor>{
            one_stream_attention(q, k, v, nt, last, image_shard, words, parallel_->sequence())};
    })[0];
    const auto rows = [&](const at::Tensor& x) { return last ? x.narrow(1, nt, ni) : x; };
    const at::Tensor mixed =
        at::silu(rows(p.narrow(2, 3 * width, mlp))) * rows(p.narrow(2, 3 * width + mlp, mlp));
    const at::Tensor out = m[2].unsqueeze(1) * blk.to_out(at::cat({attn, mixed}, 2));
    if (last)
        image = clamp_half(joint.narrow(1, nt, ni) + out);
    else
        joint = clamp_half(joint + out);
}

void Flux2Transformer::check_inputs(const at::Tensor& tokens, const at::Tensor& image_ids,
                                    const at::Tensor& text, const at::Tensor& text_ids,
                                    const at::Tensor& timestep, const at::Tensor& guidance) const {
    const Flux2TransformerConfig& c = config_;
    const int64_t axes = static_cast<int64_t>(c.axes_dims_rope.size());
    if (!tokens.defined() || tokens.dim() != 3 || tokens.size(1) < 1 || tokens.size(2) != c.in_channels)
        throw ModelError("the transformer takes tokens [batch, tokens >= 1, " +
                         std::to_string(c.in_channels) + "]; got " + shape_of(tokens));
    const int64_t batch = tokens.size(0);
    if (!text.defined() || text.dim() != 3 || text.size(0) != batch || text.size(1) < 1 ||
        text.size(2) != c.joint_attention_dim)
        throw ModelError("the transformer takes text [" + std::to_string(batch) + ", tokens >= 1, " +
                         std::to_string(c.joint_attention_dim) + "]; got " + shape_of(text));
    const auto ids_fit = [&](const at::Tensor& ids, int64_t n) {
        return ids.defined() && ids.dim() == 2 && ids.size(0) == n && ids.size(1) == axes;
    };
    if (!ids_fit(image_ids, tokens.size(1)) || !ids_fit(text_ids, text.size(1)))
        throw ModelError("the transformer takes position ids [tokens, " + std::to_string(axes) +
                         "] for the image and the text tokens; got " + shape_of(image_ids) + " and " +
                         shape_of(text_ids));
    check_time_inputs(timestep, guidance, batch, c.guidance_embeds, "FLUX.2-dev", "FLUX.2 klein");
}

at::Tensor Flux2Transformer::forward(const at::Tensor& tokens, const at::Tensor& image_ids,
                                     const at::Tensor& text, const at::Tensor& text_ids,
                                     const at::Tensor& timestep, const at::Tensor& guidance,
                                     const BlockRunner& runner) const {
    const Flux2TransformerConfig& c = config_;
    check_inputs(tokens, image_ids, text, text_ids, timestep, guidance);
    const int64_t batch = tokens.size(0);
    const at::ScalarType dtype = x_embedder_.weight().scalar_type();
    const at::Device device = x_embedder_.weight().device();

    // Both streams split over the sequence groups (Note [FLUX text stream]).
    const SequenceShard image(tokens.size(1), parallel_->sequence()),
        words(text.size(1), parallel_->sequence());
    at::Tensor x = x_embedder_(image.shard(tokens.to(device, dtype)));
    at::Tensor ctx = context_embedder_(words.shard(text.to(device, dtype)));
    const at::Tensor temb = time_embedding(timestep, guidance, batch);
    at::Tensor temb_act = at::silu(temb);
    DualStreamStep step;
    step.heads = parallel_->tensor().share(c.num_attention_heads);
    step.image = &image;
    step.text = &words;
    step.image_modulation = modulation_image_(temb_act);
    step.text_modulation = modulation_text_(temb_act);
    OneStream one;  // the single blocks' [text; image], made as the pass enters the first of them
    one.modulation = modulation_single_(temb_act);
    const RopeTable ri = rope_table_from_ids(image_ids.to(at::kCPU), c.axes_dims_rope, c.rope_theta);
    const RopeTable rt = rope_table_from_ids(text_ids.to(at::kCPU), c.axes_dims_rope, c.rope_theta);
    at::Tensor cos = image.shard(ri.cos, 0).to(device), sin = image.shard(ri.sin, 0).to(device);
    at::Tensor text_cos = words.shard(rt.cos, 0).to(device), text_sin = words.shard(rt.sin, 0).to(device);
    step.rotate_image = [&](const at::Tensor& q) { return apply_interleaved_rope(q, cos, sin); };
    step.rotate_text = [&](const at::Tensor& q) { return apply_interleaved_rope(q, text_cos, text_sin); };

    const std::size_t doubles = double_blocks_.size();
    BlockPass pass;
    pass.blocks = doubles + single_blocks_.size();
    pass.image = &x;
    pass.image_shard = &image;
    pass.conditioning = &temb_act;
    pass.activations = {&ctx,
                        &cos,
                        &sin,
                        &text_cos,
                        &text_sin,
                        &step.image_modulation,
                        &step.text_modulation,
                        &one.modulation,
                        &one.tokens,
                        &one.cos,
                        &one.sin};
    runner.run(pass, devices_, [&](const BlockContext& block) {
        if (block.index() < doubles) {
            step.last = block.last();  // the text's output then feeds nothing
            step.block = &block;
            double_blocks_[block.index()].forward(x, ctx, temb_act, step);
            return;
        }
        if (block.index() == doubles) {  // one stream from here: the text, then the image
            one.text = ctx.size(1);
            one.tokens = at::cat({ctx, x}, 1);
            one.cos = at::cat({text_cos, cos}, 0);
            one.sin = at::cat({text_sin, sin}, 0);
            x = ctx = cos = sin = text_cos = text_sin = at::Tensor();  // the one stream holds them now
        }
        single_block(block, one, image, words, x);
    });

    const std::vector<at::Tensor> sc = norm_out_(temb_act).chunk(2, 1);  // scale, shift
    return image.gather(proj_out_(adaln::norm_modulate(x, sc[1], sc[0], kEps)));
}

}  // namespace dp::runtime
