#include "runtime/models/flux/flux_transformer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <set>

#include "runtime/io/config_json.h"
#include "runtime/io/errors.h"
#include "runtime/models/common/fused_ops.h"
#include "runtime/parallel/attention.h"
#include "runtime/parallel/sequence_shard.h"
#include "strategies/family.h"

namespace dp::runtime {
namespace {

constexpr double kEps = 1e-6;       // every LayerNorm and qk-norm of the model
constexpr double kTheta = 10000.0;  // RoPE's base

// The config keys FluxTransformer2DModel takes; any other one set is a variant this code does not run.
const std::set<std::string>& known_keys() {
    static const std::set<std::string> keys = {
        "patch_size",          "in_channels",         "out_channels",
        "num_layers",          "num_single_layers",   "attention_head_dim",
        "num_attention_heads", "joint_attention_dim", "pooled_projection_dim",
        "guidance_embeds",     "axes_dims_rope"};
    return keys;
}

}  // namespace

FluxRope flux_image_rope(const std::array<int64_t, 3>& axes, int64_t grid_h, int64_t grid_w, int64_t first) {
    const int64_t n = grid_h * grid_w;
    const at::Tensor index = at::arange(n, at::kLong);
    const at::Tensor ids = at::stack(
        {at::full({n}, first, at::kLong), at::floor_divide(index, grid_w), at::remainder(index, grid_w)}, 1);
    return rope_table_from_ids(ids, {axes.begin(), axes.end()}, kTheta);
}

at::Tensor apply_flux_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    return apply_interleaved_rope(x, cos, sin);
}

FluxTransformerConfig FluxTransformerConfig::from_json_text(const std::string& text,
                                                            const std::string& path) {
    const ConfigJson c(text, path);
    c.require_class("transformer", "FluxTransformer2DModel");
    for (const auto& [key, value] : c.raw().items()) {
        if (key.empty() || key[0] == '_' || known_keys().count(key)) continue;
        if (value.is_null() || (value.is_boolean() && !value.get<bool>())) continue;
        c.fail(key.c_str(),
               "is set, and FLUX.1's text-to-image FluxTransformer2DModel has no such key; only " +
                   std::string("patch_size, in_channels, out_channels, num_layers, num_single_layers, ") +
                   "attention_head_dim, num_attention_heads, joint_attention_dim, "
                   "pooled_projection_dim, guidance_embeds and axes_dims_rope are supported");
    }
    FluxTransformerConfig cfg;
    const strategies::ParallelSpec& spec = strategies::family_spec("flux");
    const strategies::TransformerShape& shape = spec.transformer_defaults;
    cfg.patch_size = c.integer("patch_size", shape.patch_size, 1, 64);
    if (cfg.patch_size != 1)
        c.fail("patch_size", "is " + std::to_string(cfg.patch_size) +
                                 "; only 1 is supported (FluxPipeline packs the latents 2 x 2 itself)");
    cfg.in_channels = c.integer("in_channels", shape.in_channels, 1, 1 << 16);
    cfg.out_channels = c.integer("out_channels", cfg.in_channels, 1, 1 << 16);  // null or absent: in_channels
    cfg.num_layers = c.integer("num_layers", shape.layers, 1, 1024);
    int64_t single_default = cfg.num_single_layers;
    for (const auto& [key, layers] : spec.more_layers_keys)
        if (key == "num_single_layers") single_default = layers;
    cfg.num_single_layers = c.integer("num_single_layers", single_default, 0, 1024);
    cfg.attention_head_dim = c.integer("attention_head_dim", shape.head_dim, 2, 4096);
    cfg.num_attention_heads = c.integer("num_attention_heads", shape.heads, 1, 1024);
    cfg.joint_attention_dim = c.integer("joint_attention_dim", cfg.joint_attention_dim, 1, 1 << 16);
    cfg.pooled_projection_dim = c.integer("pooled_projection_dim", cfg.pooled_projection_dim, 1, 1 << 16);
    cfg.guidance_embeds = c.boolean("guidance_embeds", false);
    const std::vector<int64_t> axes =
        rope_axes_dims(c, {16, 56, 56}, cfg.attention_head_dim, "index, row, column");
    std::copy(axes.begin(), axes.end(), cfg.axes_dims_rope.begin());
    return cfg;
}

FluxTransformer::FluxTransformer(const FluxTransformerConfig& config, WeightStore& w,
                                 const ParallelContext& parallel,
                                 std::shared_ptr<const DeviceMapping> mapping)
    : TransformerBase(config, w, parallel, std::move(mapping),
                      static_cast<std::size_t>(config.num_layers + config.num_single_layers), "flux") {
    const int64_t d = config.inner_dim(), hd = config.attention_head_dim;
    if (!text_split_)
        throw InternalError(
            "FLUX.1's single blocks run text and image as one stream: its spec must split the text");
    // The MLPs' and modulations' features as evenly as tp allows; attention by whole heads.
    const LinearLoader linear = linear_loader(w);
    x_embedder_ = linear("x_embedder", config.in_channels, d);
    context_embedder_ = linear("context_embedder", config.joint_attention_dim, d);
    time_1_ = linear("time_text_embed.timestep_embedder.linear_1", 256, d);
    time_2_ = linear("time_text_embed.timestep_embedder.linear_2", d, d);
    if (config.guidance_embeds) {
        guidance_1_ = linear("time_text_embed.guidance_embedder.linear_1", 256, d);
        guidance_2_ = linear("time_text_embed.guidance_embedder.linear_2", d, d);
    }
    text_1_ = linear("time_text_embed.text_embedder.linear_1", config.pooled_projection_dim, d);
    text_2_ = linear("time_text_embed.text_embedder.linear_2", d, d);
    DualStreamLayout layout;
    layout.qk_rounding = RmsRounding::kTorch;       // torch.nn.RMSNorm
    layout.clamp = DualStreamLayout::Clamp::kText;  // as diffusers: the text stream only
    devices_.load_blocks(w, [&](std::size_t block) {
        const auto i = static_cast<int64_t>(block);
        if (i < config.num_layers) {
            double_blocks_.emplace_back(linear, spec_->block_prefixes[0] + std::to_string(i), d, hd, layout);
            return;
        }
        const std::string b = spec_->block_prefixes[1] + std::to_string(i - config.num_layers);
        FluxSingleBlock blk;
        blk.norm = linear(b + ".norm.linear", d, 3 * d);
        blk.to_q = linear(b + ".attn.to_q", d, d, hd);
        blk.to_k = linear(b + ".attn.to_k", d, d, hd);
        blk.to_v = linear(b + ".attn.to_v", d, d, hd);
        // proj_out's input is [attention, MLP]: its two segments split in head_dim blocks, as to_q's
        // heads and proj_mlp's features are, so that each rank's slices meet.
        blk.proj_mlp = linear(b + ".proj_mlp", d, 4 * d, hd);
        blk.proj_out = linear(b + ".proj_out", 5 * d, d, hd);
        blk.norm_q = RMSNorm::load(w, b + ".attn.norm_q", hd, kEps, true, RmsRounding::kTorch);
        blk.norm_k = RMSNorm::load(w, b + ".attn.norm_k", hd, kEps, true, RmsRounding::kTorch);
        single_blocks_.push_back(std::move(blk));
    });
    norm_out_ = linear("norm_out.linear", d, 2 * d);
    proj_out_ = linear("proj_out", d, config.patch_size * config.patch_size * config.out_channels);
    loaded(w);
}

at::Tensor FluxTransformer::conditioning(const at::Tensor& timestep, const at::Tensor& guidance,
                                         const at::Tensor& pooled, int64_t batch) const {
    const at::ScalarType dtype = x_embedder_.weight().scalar_type();
    const at::Device device = x_embedder_.weight().device();
    // As diffusers: the value times 1000 in the model's dtype, the sinusoid in fp32, then the
    // embedder in the model's dtype.
    auto embed = [&](const at::Tensor& value, const ParallelLinear& l1, const ParallelLinear& l2) {
        const at::Tensor v = value.reshape({-1}).to(device, dtype).expand({batch}) * 1000;
        return l2(at::silu(l1(timestep_embedding(v, 256).to(dtype))));
    };
    at::Tensor temb = embed(timestep, time_1_, time_2_);
    if (config_.guidance_embeds) temb = temb + embed(guidance, guidance_1_, guidance_2_);
    return temb + text_2_(at::silu(text_1_(pooled.to(device, dtype))));
}

// Note [FLUX single blocks, one stream] (mmdit.h).
void FluxTransformer::single_block(const BlockContext& block, OneStream& stream, const at::Tensor& temb_act,
                                   const SequenceShard& image_shard, const SequenceShard& words,
                                   at::Tensor& image) const {
    const FluxSingleBlock& blk = single_blocks_[block.index() - double_blocks_.size()];
    const int64_t nt = stream.text, ni = stream.tokens.size(1) - nt;
    const int64_t heads = parallel_->tensor().share(config_.num_attention_heads);
    const bool last = block.last();  // the image alone: its text feeds nothing
    at::Tensor& joint = stream.tokens;
    const std::vector<at::Tensor> m = blk.norm(temb_act).chunk(3, 1);  // shift, scale, gate
    const at::Tensor h = adaln::norm_modulate(joint, m[0], m[1], kEps);
    // The stream's attention output: [text; image], or the image's on the last block.
    const at::Tensor attn = block.attention([&] {
        const at::Tensor q =
            apply_flux_rope(blk.norm_q(split_heads(blk.to_q(h), heads)), stream.cos, stream.sin);
        const at::Tensor k =
            apply_flux_rope(blk.norm_k(split_heads(blk.to_k(h), heads)), stream.cos, stream.sin);
        const at::Tensor v = split_heads(blk.to_v(h), heads);
        return std::vector<at::Tensor>{
            one_stream_attention(q, k, v, nt, last, image_shard, words, parallel_->sequence())};
    })[0];
    const at::Tensor gate = m[2].unsqueeze(1);
    // proj_out's input [attention, GELU(MLP)], each part written straight into its place (no cat).
    const at::Tensor mlp = blk.proj_mlp(last ? h.narrow(1, nt, ni) : h);
    const int64_t width = attn.size(2);
    at::Tensor both = at::empty({mlp.size(0), mlp.size(1), width + mlp.size(2)}, mlp.options());
    both.narrow(2, 0, width).copy_(attn);
    fused::gelu_tanh_into(mlp, both.narrow(2, width, mlp.size(2)));
    const at::Tensor residual = last ? joint.narrow(1, nt, ni) : joint;
    (last ? image : joint) = clamp_half(fused::gated_residual(residual, gate, blk.proj_out(both)));
}

void FluxTransformer::check_inputs(const at::Tensor& latents, const at::Tensor& text,
                                   const at::Tensor& pooled, const at::Tensor& timestep,
                                   const at::Tensor& guidance, int64_t grid_h, int64_t grid_w,
                                   const FluxReference& reference) const {
    const FluxTransformerConfig& c = config_;
    if (grid_h < 1 || grid_w < 1 || !latents.defined() || latents.dim() != 3 ||
        latents.size(1) != grid_h * grid_w || latents.size(2) != c.in_channels)
        throw ModelError("the transformer takes packed latents [batch, grid_h * grid_w, " +
                         std::to_string(c.in_channels) + "] for a " + std::to_string(grid_h) + " x " +
                         std::to_string(grid_w) + " grid; got " +
                         (latents.defined() ? c10::str(latents.sizes()) : std::string("none")));
    const int64_t batch = latents.size(0);
    if (!text.defined() || text.dim() != 3 || text.size(0) != batch || text.size(1) < 1 ||
        text.size(2) != c.joint_attention_dim)
        throw ModelError("the transformer takes text [" + std::to_string(batch) + ", tokens >= 1, " +
                         std::to_string(c.joint_attention_dim) + "]; got " +
                         (text.defined() ? c10::str(text.sizes()) : std::string("none")));
    if (!pooled.defined() || pooled.dim() != 2 || pooled.size(0) != batch ||
        pooled.size(1) != c.pooled_projection_dim)
        throw ModelError("the transformer takes the pooled text [" + std::to_string(batch) + ", " +
                         std::to_string(c.pooled_projection_dim) + "]; got " +
                         (pooled.defined() ? c10::str(pooled.sizes()) : std::string("none")));
    check_time_inputs(timestep, guidance, batch, c.guidance_embeds, "FLUX.1-dev", "FLUX.1-schnell");
    const at::Tensor& ref = reference.latents;
    const int64_t refs = ref.defined() ? reference.grid_h * reference.grid_w : 0;
    if (ref.defined() && (reference.grid_h < 1 || reference.grid_w < 1 || ref.dim() != 3 ||
                          ref.size(0) != batch || ref.size(1) != refs || ref.size(2) != c.in_channels))
        throw ModelError("the transformer takes a reference image's packed latents [" +
                         std::to_string(batch) + ", " + std::to_string(refs) + ", " +
                         std::to_string(c.in_channels) + "]; got " + c10::str(ref.sizes()));
}

at::Tensor FluxTransformer::forward(const at::Tensor& latents, const at::Tensor& text,
                                    const at::Tensor& pooled, const at::Tensor& timestep,
                                    const at::Tensor& guidance, int64_t grid_h, int64_t grid_w,
                                    const BlockRunner& runner, const FluxReference& reference) const {
    const FluxTransformerConfig& c = config_;
    check_inputs(latents, text, pooled, timestep, guidance, grid_h, grid_w, reference);
    const int64_t batch = latents.size(0), own = grid_h * grid_w;
    const at::Tensor& ref = reference.latents;
    const int64_t refs = ref.defined() ? reference.grid_h * reference.grid_w : 0;
    const at::ScalarType dtype = x_embedder_.weight().scalar_type();
    const at::Device device = x_embedder_.weight().device();
    const int64_t heads = parallel_->tensor().share(c.num_attention_heads);

    // Both streams split over the sequence groups (Note [FLUX text stream]); a reference's tokens
    // follow the latents' in the image stream, as diffusers' Kontext concatenates them.
    const SequenceShard image(own + refs, parallel_->sequence()), words(text.size(1), parallel_->sequence());
    const at::Tensor tokens =
        refs ? at::cat({latents.to(device, dtype), ref.to(device, dtype)}, 1) : latents.to(device, dtype);
    at::Tensor x = x_embedder_(image.shard(tokens));
    at::Tensor ctx = context_embedder_(words.shard(text.to(device, dtype)));
    at::Tensor temb_act = at::silu(conditioning(timestep, guidance, pooled, batch));
    // The text's ids are all zero: its rotation is x * 1 + rotated * 0, exactly x, so it is skipped.
    FluxRope rope = flux_image_rope(c.axes_dims_rope, grid_h, grid_w);
    if (refs) {
        const FluxRope r = flux_image_rope(c.axes_dims_rope, reference.grid_h, reference.grid_w, 1);
        rope = {at::cat({rope.cos, r.cos}, 0), at::cat({rope.sin, r.sin}, 0)};
    }
    at::Tensor cos = image.shard(rope.cos, 0).to(device), sin = image.shard(rope.sin, 0).to(device);

    DualStreamStep step;
    step.heads = heads;
    step.image = &image;
    step.text = &words;
    step.rotate_image = [&](const at::Tensor& q) { return apply_flux_rope(q, cos, sin); };
    OneStream one;  // the single blocks' [text; image], made as the pass enters the first of them
    const std::size_t doubles = double_blocks_.size();
    BlockPass pass;
    pass.blocks = doubles + single_blocks_.size();
    pass.image = &x;
    pass.image_shard = &image;
    pass.conditioning = &temb_act;
    pass.activations = {&ctx, &cos, &sin, &one.tokens, &one.cos, &one.sin};
    runner.run(pass, devices_, [&](const BlockContext& block) {
        if (block.index() < doubles) {
            step.last = block.last();  // the text's output then feeds nothing
            step.block = &block;
            double_blocks_[block.index()].forward(x, ctx, temb_act, step);
            if (block.last()) x = clamp_half(x);  // no single blocks: as after them
            return;
        }
        if (block.index() == doubles) {  // one stream from here: the text, then the image
            const int64_t nt = ctx.size(1), hd = c.attention_head_dim;
            one.text = nt;
            one.tokens = at::cat({ctx, x}, 1);
            one.cos = at::cat({at::ones({nt, hd}, cos.options()), cos}, 0);
            one.sin = at::cat({at::zeros({nt, hd}, sin.options()), sin}, 0);
            x = ctx = cos = sin = at::Tensor();  // the one stream holds them now
        }
        single_block(block, one, temb_act, image, words, x);
    });

    const std::vector<at::Tensor> sc = norm_out_(temb_act).chunk(2, 1);  // scale, shift
    const at::Tensor out = image.gather(proj_out_(adaln::norm_modulate(x, sc[1], sc[0], kEps)));
    return refs ? out.narrow(1, 0, own).contiguous() : out;  // the latents' tokens alone
}

}  // namespace dp::runtime
