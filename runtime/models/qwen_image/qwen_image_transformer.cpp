#include "runtime/models/qwen_image/qwen_image_transformer.h"

#include <ATen/ATen.h>

#include <cmath>
#include <utility>

#include "runtime/io/config_json.h"
#include "runtime/io/errors.h"
#include "runtime/models/common/fused_ops.h"
#include "runtime/parallel/attention.h"
#include "runtime/parallel/sequence_shard.h"
#include "strategies/family.h"

namespace dp::runtime {
namespace {

constexpr double kEps = 1e-6;       // every LayerNorm and RMSNorm of the model
constexpr double kTheta = 10000.0;  // RoPE's base

// diffusers' Timesteps(256, flip_sin_to_cos, shift 0, scale 1000) on timesteps already in the
// model's dtype: the frequencies rounded to that dtype, the product in fp32, then scaled.
at::Tensor timestep_projection(const at::Tensor& t) {
    const int64_t half = 128;
    const at::Tensor exponent =
        at::arange(0, half, t.options().dtype(at::kFloat)) * (-std::log(10000.0) / static_cast<double>(half));
    const at::Tensor freqs = at::exp(exponent).to(t.scalar_type()).to(at::kFloat);
    const at::Tensor emb = (t.to(at::kFloat).unsqueeze(1) * freqs.unsqueeze(0)) * 1000.0;
    return at::cat({at::cos(emb), at::sin(emb)}, -1);
}

// One axis' rotary angles: positions [N] (fp32) times the axis' dim / 2 frequencies, [N, dim / 2].
at::Tensor axis_angles(const at::Tensor& positions, int64_t dim) {
    return at::outer(positions, rope_frequencies(dim, kTheta, at::TensorOptions().dtype(at::kFloat)));
}

// Positions -(n - n / 2) ... n / 2 - 1 along one image axis (scale_rope's centring).
at::Tensor centred(int64_t n) { return at::arange(n, at::kFloat) - static_cast<double>(n - n / 2); }

}  // namespace

QwenRope qwen_image_rope(const std::array<int64_t, 3>& axes, int64_t grid_h, int64_t grid_w,
                         int64_t text_tokens) {
    return qwen_image_rope(axes, std::vector<std::array<int64_t, 2>>{{grid_h, grid_w}}, text_tokens);
}

QwenRope qwen_image_rope(const std::array<int64_t, 3>& axes, const std::vector<std::array<int64_t, 2>>& grids,
                         int64_t text_tokens) {
    const int64_t f2 = axes[0] / 2, h2 = axes[1] / 2, w2 = axes[2] / 2;
    std::vector<at::Tensor> images;
    int64_t text_start = 0;
    for (std::size_t k = 0; k < grids.size(); ++k) {
        const int64_t grid_h = grids[k][0], grid_w = grids[k][1];
        // Frame position k: 0 (no rotation) for the latents, 1, 2, ... for the references.
        const at::Tensor frame = axis_angles(at::full({1}, static_cast<double>(k), at::kFloat), axes[0])
                                     .view({1, 1, f2})
                                     .expand({grid_h, grid_w, f2});
        const at::Tensor rows =
            axis_angles(centred(grid_h), axes[1]).unsqueeze(1).expand({grid_h, grid_w, h2});
        const at::Tensor cols =
            axis_angles(centred(grid_w), axes[2]).unsqueeze(0).expand({grid_h, grid_w, w2});
        images.push_back(at::cat({frame, rows, cols}, 2).reshape({grid_h * grid_w, -1}));
        text_start = std::max({text_start, grid_h / 2, grid_w / 2});
    }
    const at::Tensor image = at::cat(images, 0);
    // The text continues after the images' largest index, the same position on every axis.
    const at::Tensor pos = at::arange(text_tokens, at::kFloat) + static_cast<double>(text_start);
    const at::Tensor text =
        at::cat({axis_angles(pos, axes[0]), axis_angles(pos, axes[1]), axis_angles(pos, axes[2])}, 1);
    return {at::cos(image), at::sin(image), at::cos(text), at::sin(text)};
}

at::Tensor apply_qwen_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    return apply_qwen_rope(x, at::complex(cos, sin));
}

at::Tensor apply_qwen_rope(const at::Tensor& x, const at::Tensor& rotation) {
    // (re + i im)(cos + i sin), one complex product as diffusers computes it (use_real=False).
    std::vector<int64_t> pairs = x.sizes().vec();
    pairs.back() /= 2;
    pairs.push_back(2);
    const at::Tensor xc = at::view_as_complex(x.to(at::kFloat).contiguous().view(pairs));
    return at::view_as_real(xc * rotation).flatten(-2).to(x.scalar_type());
}

namespace {

// A stream's rotation for one pass: diffusers' complex numbers and, for fp32 on the CPU, the same
// angles' cos and sin repeated for each pair, for the fused kernel (Note [fused elementwise work]),
// whose products re cos - im sin and im cos + re sin round as the complex product's do.
struct StreamRotation {
    at::Tensor complex, cos, sin;  // cos and sin undefined off the fused path
    StreamRotation(at::Tensor rotation, bool fused) : complex(std::move(rotation)) {
        if (!fused) return;
        cos = at::real(complex).repeat_interleave(2, -1);
        sin = at::imag(complex).repeat_interleave(2, -1);
    }
    at::Tensor operator()(const at::Tensor& q) const {
        return cos.defined() ? fused::interleaved_rope(q, cos, sin) : apply_qwen_rope(q, complex);
    }
};

}  // namespace

QwenImageTransformerConfig QwenImageTransformerConfig::from_json_text(const std::string& text,
                                                                      const std::string& path) {
    const ConfigJson c(text, path);
    c.require_class("transformer", "QwenImageTransformer2DModel");
    QwenImageTransformerConfig cfg;
    const strategies::TransformerShape& shape = strategies::family_spec("qwen-image").transformer_defaults;
    cfg.patch_size = c.integer("patch_size", shape.patch_size, 1, 64);
    cfg.in_channels = c.integer("in_channels", shape.in_channels, 1, 1 << 16);
    // diffusers: absent is 16, null is in_channels.
    const bool null_out = c.raw().contains("out_channels") && c.raw().at("out_channels").is_null();
    cfg.out_channels = c.integer("out_channels", null_out ? cfg.in_channels : 16, 1, 1 << 16);
    cfg.num_layers = c.integer("num_layers", shape.layers, 1, 1024);
    cfg.attention_head_dim = c.integer("attention_head_dim", shape.head_dim, 2, 4096);
    cfg.num_attention_heads = c.integer("num_attention_heads", shape.heads, 1, 1024);
    cfg.joint_attention_dim = c.integer("joint_attention_dim", cfg.joint_attention_dim, 1, 1 << 16);
    if (c.has("axes_dims_rope")) {
        const nlohmann::json& list = c.raw().at("axes_dims_rope");
        const std::string accepted =
            "expected 3 even integers (frame, height, width) summing to attention_head_dim (" +
            std::to_string(cfg.attention_head_dim) + ")";
        if (!list.is_array() || list.size() != 3)
            c.fail("axes_dims_rope", "is " + list.dump().substr(0, 40) + "; " + accepted);
        for (std::size_t i = 0; i < 3; ++i) {
            if (!list[i].is_number_integer() || list[i].get<int64_t>() < 2 || list[i].get<int64_t>() % 2 != 0)
                c.fail("axes_dims_rope", "is " + list.dump().substr(0, 40) + "; " + accepted);
            cfg.axes_dims_rope[i] = list[i].get<int64_t>();
        }
    }
    if (cfg.axes_dims_rope[0] + cfg.axes_dims_rope[1] + cfg.axes_dims_rope[2] != cfg.attention_head_dim)
        c.fail("axes_dims_rope",
               "sums to " +
                   std::to_string(cfg.axes_dims_rope[0] + cfg.axes_dims_rope[1] + cfg.axes_dims_rope[2]) +
                   "; it must sum to attention_head_dim (" + std::to_string(cfg.attention_head_dim) + ")");
    cfg.guidance_embeds = c.boolean("guidance_embeds", false);
    if (cfg.guidance_embeds)
        c.fail("guidance_embeds",
               "is true; only false is supported (diffusers' QwenImageTransformer2DModel has no "
               "guidance embedder to run it)");
    cfg.zero_cond_t = c.boolean("zero_cond_t", false);
    for (const char* key : {"use_additional_t_cond", "use_layer3d_rope"})
        if (c.boolean(key, false)) c.fail(key, "is true (Qwen-Image-Layered); only false is supported");
    return cfg;
}

QwenImageTransformer::QwenImageTransformer(const QwenImageTransformerConfig& config, WeightStore& w,
                                           const ParallelContext& parallel,
                                           std::shared_ptr<const DeviceMapping> mapping)
    : TransformerBase(config, w, parallel, std::move(mapping), static_cast<std::size_t>(config.num_layers),
                      "qwen-image") {
    const int64_t d = config.inner_dim(), p = config.patch_size, hd = config.attention_head_dim;
    // The MLPs' and modulations' features as evenly as tp allows; attention by whole heads,
    // unevenly where tp does not divide them (Note [uneven heads]).
    const LinearLoader linear = linear_loader(w);
    img_in_ = linear("img_in", config.in_channels, d);
    txt_norm_ = RMSNorm::load(w, "txt_norm", config.joint_attention_dim, kEps);
    txt_in_ = linear("txt_in", config.joint_attention_dim, d);
    time_1_ = linear("time_text_embed.timestep_embedder.linear_1", 256, d);
    time_2_ = linear("time_text_embed.timestep_embedder.linear_2", d, d);
    DualStreamLayout layout;
    layout.image_modulation = ".img_mod.1";
    layout.text_modulation = ".txt_mod.1";
    layout.image_mlp = ".img_mlp";
    layout.text_mlp = ".txt_mlp";
    layout.clamp = DualStreamLayout::Clamp::kBoth;  // as diffusers: keep fp16 activations finite
    devices_.load_blocks(w, [&](std::size_t i) {
        blocks_.emplace_back(linear, spec_->block_prefixes.front() + std::to_string(i), d, hd, layout);
    });
    norm_out_ = linear("norm_out.linear", d, 2 * d);
    proj_out_ = linear("proj_out", d, p * p * config.out_channels);
    loaded(w);
}

at::Tensor QwenImageTransformer::forward(const at::Tensor& latents, const at::Tensor& text,
                                         const at::Tensor& text_mask, const at::Tensor& timestep,
                                         int64_t grid_h, int64_t grid_w, const BlockRunner& runner,
                                         const QwenReference& reference) const {
    const QwenImageTransformerConfig& c = config_;
    if (grid_h < 1 || grid_w < 1 || latents.dim() != 3 || latents.size(1) != grid_h * grid_w ||
        latents.size(2) != c.in_channels)
        throw ModelError(
            "the transformer takes packed latents [batch, grid_h * grid_w, " + std::to_string(c.in_channels) +
            "] for a " + std::to_string(grid_h) + " x " + std::to_string(grid_w) + " patch grid; got " +
            (latents.defined() ? std::to_string(latents.dim()) + " dimensions " + c10::str(latents.sizes())
                               : std::string("none")));
    const int64_t batch = latents.size(0);
    if (text.dim() != 3 || text.size(0) != batch || text.size(1) < 1 || text.size(2) != c.joint_attention_dim)
        throw ModelError("the transformer takes text [" + std::to_string(batch) + ", tokens >= 1, " +
                         std::to_string(c.joint_attention_dim) + "]; got " + c10::str(text.sizes()));
    const int64_t tokens = text.size(1);
    if (text_mask.defined() &&
        (text_mask.dim() != 2 || text_mask.size(0) != batch || text_mask.size(1) != tokens))
        throw ModelError("the text mask must be [" + std::to_string(batch) + ", " + std::to_string(tokens) +
                         "], one entry per text token; got " + c10::str(text_mask.sizes()));
    if (timestep.numel() != batch && timestep.numel() != 1)
        throw ModelError("the transformer takes one timestep per prompt (" + std::to_string(batch) +
                         "); got " + std::to_string(timestep.numel()));
    const at::ScalarType dtype = img_in_.weight().scalar_type();
    const at::Device device = img_in_.weight().device();
    // With tensor parallelism this rank holds its share of the attention heads.
    const int64_t heads = parallel_->tensor().share(c.num_attention_heads);

    // Both streams split over the sequence groups (Note [Qwen-Image text stream]); per-token layers
    // run on this rank's block only.
    // An edit's references follow the latents in the image stream (img_shapes' later entries).
    std::vector<std::array<int64_t, 2>> grids{{grid_h, grid_w}};
    at::Tensor stream = latents.to(device, dtype);
    if (reference.tokens.defined()) {
        int64_t count = 0;
        for (const auto& g : reference.grids) count += g[0] * g[1], grids.push_back(g);
        if (reference.tokens.dim() != 3 || reference.tokens.size(0) != batch ||
            reference.tokens.size(1) != count || reference.tokens.size(2) != c.in_channels)
            throw ModelError("the reference images' tokens must be [" + std::to_string(batch) + ", " +
                             std::to_string(count) + ", " + std::to_string(c.in_channels) + "]; got " +
                             c10::str(reference.tokens.sizes()));
        stream = at::cat({stream, reference.tokens.to(device, dtype)}, 1);
    }
    const SequenceShard image(stream.size(1), parallel_->sequence());
    const SequenceShard words(tokens, text_split_ ? parallel_->sequence() : SequenceGroups{});
    at::Tensor x = img_in_(image.shard(stream));
    at::Tensor ctx = txt_in_(txt_norm_(words.shard(text.to(device, dtype))));
    at::Tensor text_bias;  // over all T tokens: -inf for padding keys
    if (text_mask.defined())
        text_bias = at::zeros({batch, tokens}, x.options()).masked_fill(text_mask.to(device) == 0, -INFINITY);

    const at::Tensor t = timestep.reshape({-1}).to(device, dtype).expand({batch});
    const at::Tensor temb = time_2_(at::silu(time_1_(timestep_projection(t).to(dtype))));
    at::Tensor temb_act = at::silu(temb);
    // zero_cond_t: the references' tokens (after the latents') take the timestep 0's conditioning.
    at::Tensor other_conditioning, other_tokens;
    if (c.zero_cond_t && grids.size() > 1) {
        other_conditioning =
            at::silu(time_2_(at::silu(time_1_(timestep_projection(at::zeros_like(t)).to(dtype)))));
        const at::Tensor index = at::arange(stream.size(1), at::TensorOptions().dtype(at::kLong));
        other_tokens =
            image.shard(index.ge(grid_h * grid_w).to(at::kLong).view({1, -1, 1}), 1).ne(0).to(device);
    }

    const QwenRope rope = qwen_image_rope(c.axes_dims_rope, grids, tokens);
    // Each position's rotation as one complex number per frequency, this rank's block of them.
    const bool fused_rope = device.is_cpu() && dtype == at::kFloat;
    StreamRotation image_rot(
        at::complex(image.shard(rope.image_cos, 0), image.shard(rope.image_sin, 0)).to(device), fused_rope);
    StreamRotation text_rot(
        at::complex(words.shard(rope.text_cos, 0), words.shard(rope.text_sin, 0)).to(device), fused_rope);

    DualStreamStep step;
    step.heads = heads;
    step.image = &image;
    step.text = text_split_ ? &words : nullptr;
    step.rotate_image = [&](const at::Tensor& q) { return image_rot(q); };
    step.rotate_text = [&](const at::Tensor& q) { return text_rot(q); };
    BlockPass pass;
    pass.blocks = blocks_.size();
    pass.image = &x;
    pass.image_shard = &image;
    pass.conditioning = &temb_act;
    pass.activations = {
        &ctx,           &text_bias,    &image_rot.complex, &text_rot.complex,   &image_rot.cos,
        &image_rot.sin, &text_rot.cos, &text_rot.sin,      &other_conditioning, &other_tokens};
    runner.run(pass, devices_, [&](const BlockContext& block) {
        step.text_bias = text_bias;  // moved with the block, under device_map
        step.other_conditioning = other_conditioning;
        step.other_tokens = other_tokens;
        step.last = block.last();  // its text output feeds nothing
        step.block = &block;
        blocks_[block.index()].forward(x, ctx, temb_act, step);
    });
    const std::vector<at::Tensor> sc = norm_out_(temb_act).chunk(2, 1);  // scale, shift
    const at::Tensor out = image.gather(proj_out_(adaln::norm_modulate(x, sc[1], sc[0], kEps)));
    return grids.size() > 1 ? out.narrow(1, 0, grid_h * grid_w) : out;
}

}  // namespace dp::runtime
