#include "runtime/models/common/qwen_image_vae.h"

#include <ATen/ATen.h>

#include <cmath>

#include "runtime/io/config_json.h"
#include "runtime/io/errors.h"

namespace dp::runtime {

// Note [one frame through causal 3-D convolutions]
// QwenImageCausalConv3d pads time by 2 * p on the front only (zeros) and not at the back, and
// QwenImagePipeline decodes a single frame: AutoencoderKLQwenImage._decode starts from an empty
// feature cache and runs the decoder on frame 0 alone, so every causal conv sees no cached frames
// and pads with zeros. With kernel depth k = 2p + 1 the padded input has k frames, zeros then the
// frame, and the one output frame is sum_j W[:, :, j] * input[j] = W[:, :, k - 1] * frame: a 2-D
// convolution with the kernel's last time slice (spatial padding as before). The 1x1x1 convs
// (post_quant_conv, shortcuts) are the k = 1 case. The upsample3d Resample only marks its cache slot
// ("Rep") on the first chunk and skips time_conv, so the frame count stays 1 and upsample3d is
// upsample2d. The attention and the Resample's 2-D conv already run per frame. The golden script
// (scripts/golden/golden_qwen_image_vae.py) checks this in diffusers: randomising every earlier
// kernel slice and the time_conv weights leaves the decoded image bit-identical.
// AutoencoderKLQwenImage._encode likewise starts from an empty cache and encodes frame 0 alone as
// its first chunk: its causal convs reduce the same way, and a downsample3d Resample, finding its
// cache slot empty, only stores its input there and skips time_conv, so downsample3d is
// downsample2d (scripts/golden/golden_vae_encoder.py checks this as the decoder's script does).

namespace {

// Qwen-Image's latent statistics, diffusers' defaults for AutoencoderKLQwenImage.
const std::vector<double> kLatentsMean = {-0.7571, -0.7089, -0.9113, 0.1075,  -0.1745, 0.9653,
                                          -0.1517, 1.5508,  0.4134,  -0.0715, 0.5517,  -0.3632,
                                          -0.1922, -0.9497, 0.2503,  -0.2921};
const std::vector<double> kLatentsStd = {2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                                         3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160};

std::vector<double> read_numbers(const ConfigJson& c, const char* key, const std::vector<double>& fallback,
                                 std::size_t count, bool positive) {
    std::vector<double> v = fallback;
    if (c.has(key)) {
        const auto& list = c.raw()[key];
        if (!list.is_array()) c.fail(key, "must be a list of numbers, one per latent channel");
        v.clear();
        for (const auto& x : list) {
            if (!x.is_number()) c.fail(key, "must hold numbers only, not " + x.dump().substr(0, 40));
            v.push_back(x.get<double>());
        }
    }
    if (v.size() != count)
        c.fail(key,
               "has " + std::to_string(v.size()) + " values; accepted: z_dim = " + std::to_string(count));
    for (double x : v)
        if (!std::isfinite(x) || (positive && !(x > 0)))
            c.fail(key, positive ? "values must be positive and finite" : "values must be finite");
    return v;
}

}  // namespace

QwenImageVaeConfig QwenImageVaeConfig::from_json_text(const std::string& text, const std::string& path) {
    const ConfigJson c(text, path);
    c.require_class("VAE", "AutoencoderKLQwenImage");
    QwenImageVaeConfig v;
    v.base_dim = c.integer("base_dim", v.base_dim, 1, 4096);
    v.z_dim = c.integer("z_dim", v.z_dim, 1, 1024);
    v.num_res_blocks = c.integer("num_res_blocks", v.num_res_blocks, 0, 64);
    v.dropout = c.number("dropout", v.dropout, 0.0, 1.0);
    v.input_channels = c.integer("input_channels", v.input_channels, 1, 64);
    if (c.has("dim_mult")) {
        const auto& list = c.raw()["dim_mult"];
        if (!list.is_array() || list.empty() || list.size() > 8)
            c.fail("dim_mult", "must be a list of 1 to 8 channel multipliers");
        v.dim_mult.clear();
        for (const auto& m : list) {
            if (!m.is_number_integer() || m.get<int64_t>() < 1 || m.get<int64_t>() > 64)
                c.fail("dim_mult", "entries must be integers from 1 to 64, not " + m.dump().substr(0, 40));
            v.dim_mult.push_back(m.get<int64_t>());
        }
    }
    if (c.has("temperal_downsample")) {
        const auto& list = c.raw()["temperal_downsample"];
        if (!list.is_array()) c.fail("temperal_downsample", "must be a list of true / false");
        v.temperal_downsample.clear();
        for (const auto& b : list) {
            if (!b.is_boolean()) c.fail("temperal_downsample", "entries must be true or false");
            v.temperal_downsample.push_back(b.get<bool>());
        }
    }
    if (v.temperal_downsample.size() + 1 != v.dim_mult.size())
        c.fail("temperal_downsample", "has " + std::to_string(v.temperal_downsample.size()) +
                                          " entries; accepted: one per downsampling, len(dim_mult) - 1 = " +
                                          std::to_string(v.dim_mult.size() - 1));
    // The decoder has no attention outside its mid block, whatever attn_scales says (as diffusers');
    // the encoder refuses scales that would give one of its down blocks attention.
    if (c.has("attn_scales")) {
        const auto& list = c.raw()["attn_scales"];
        if (!list.is_array()) c.fail("attn_scales", "must be a list of scales");
        for (const auto& x : list) {
            if (!x.is_number())
                c.fail("attn_scales", "must hold numbers only, not " + x.dump().substr(0, 40));
            v.attn_scales.push_back(x.get<double>());
        }
    }
    v.latents_mean = read_numbers(c, "latents_mean", kLatentsMean, v.z_dim, false);
    v.latents_std = read_numbers(c, "latents_std", kLatentsStd, v.z_dim, true);
    // AutoencoderKLWan's keys that change the decoder (Wan 2.2's VAE): not this model.
    if (c.has("decoder_base_dim") && c.integer("decoder_base_dim", 0, 0, 1 << 20) != v.base_dim)
        c.fail("decoder_base_dim", "differs from base_dim; supported: a decoder as wide as the encoder");
    if (c.boolean("is_residual", false))
        c.fail("is_residual", "is true; supported: false (AutoencoderKLQwenImage)");
    if (c.has("patch_size")) c.fail("patch_size", "is set; supported: none (AutoencoderKLQwenImage)");
    return v;
}

namespace qwen_vae {

Conv2d load_causal_conv(WeightStore& w, const std::string& prefix, int64_t in, int64_t out, int64_t kernel) {
    Conv2d c;
    c.weight =
        w.take(prefix + ".weight", {out, in, kernel, kernel, kernel}).select(2, kernel - 1).contiguous();
    c.bias = w.take(prefix + ".bias", {out});
    c.padding = kernel / 2;
    return c;
}

at::Tensor RmsNorm::operator()(const at::Tensor& x) const {
    // F.normalize over the channels, in fp32 for half-precision inputs as diffusers does.
    const bool half = x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16;
    const at::Tensor xf = half ? x.to(at::kFloat) : x;
    const at::Tensor normalized =
        (xf / xf.norm(2, {1}, /*keepdim=*/true).clamp_min(1e-12)).to(x.scalar_type());
    return normalized * scale * gamma;
}

RmsNorm RmsNorm::load(WeightStore& w, const std::string& name, int64_t channels, bool image_shaped) {
    RmsNorm n;
    n.gamma = image_shaped ? w.take(name, {channels, 1, 1})
                           : w.take(name, {channels, 1, 1, 1}).view({channels, 1, 1});
    n.scale = std::sqrt(static_cast<double>(channels));
    return n;
}

Residual Residual::load(WeightStore& w, const std::string& p, int64_t in, int64_t out) {
    Residual r;
    r.norm1 = RmsNorm::load(w, p + ".norm1.gamma", in, false);
    r.conv1 = load_causal_conv(w, p + ".conv1", in, out, 3);
    r.norm2 = RmsNorm::load(w, p + ".norm2.gamma", out, false);
    r.conv2 = load_causal_conv(w, p + ".conv2", out, out, 3);
    if (in != out) r.shortcut = load_causal_conv(w, p + ".conv_shortcut", in, out, 1);
    return r;
}

at::Tensor Residual::operator()(const at::Tensor& x) const {
    at::Tensor h = conv1(at::silu(norm1(x)));
    h = conv2(at::silu(norm2(h)));  // dropout sits here, inactive at inference
    return h + (shortcut.weight.defined() ? shortcut(x) : x);
}

MidBlock MidBlock::load(WeightStore& w, const std::string& p, int64_t channels) {
    MidBlock m;
    m.first = Residual::load(w, p + ".resnets.0", channels, channels);
    m.attn_norm = RmsNorm::load(w, p + ".attentions.0.norm.gamma", channels, true);
    m.attn_qkv = Conv2d::load(w, p + ".attentions.0.to_qkv", channels, 3 * channels, 1);
    m.attn_proj = Conv2d::load(w, p + ".attentions.0.proj", channels, channels, 1);
    m.second = Residual::load(w, p + ".resnets.1", channels, channels);
    return m;
}

at::Tensor MidBlock::operator()(const at::Tensor& input) const {
    const at::Tensor x = first(input);
    const int64_t b = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3);
    // Contiguous before the split, as diffusers: CPU attention rounds differently on strided input.
    const at::Tensor qkv = attn_qkv(attn_norm(x)).reshape({b, 1, 3 * c, h * wd}).transpose(2, 3).contiguous();
    const std::vector<at::Tensor> parts = qkv.chunk(3, -1);
    const at::Tensor a =
        attention(parts[0], parts[1], parts[2]).squeeze(1).transpose(1, 2).reshape({b, c, h, wd});
    return second(x + attn_proj(a));
}

}  // namespace qwen_vae

QwenImageVaeDecoder::QwenImageVaeDecoder(const QwenImageVaeConfig& config, WeightStore& w) : config_(config) {
    using namespace qwen_vae;
    const int64_t z = config.z_dim, n = static_cast<int64_t>(config.dim_mult.size());
    if (n < 1 || static_cast<int64_t>(config.temperal_downsample.size()) != n - 1 ||
        static_cast<int64_t>(config.latents_mean.size()) != z ||
        static_cast<int64_t>(config.latents_std.size()) != z)
        throw ModelError(
            "Qwen-Image VAE: inconsistent config (dim_mult, temperal_downsample, latent statistics); "
            "build it with QwenImageVaeConfig::from_json_text");
    const std::vector<float> mean(config.latents_mean.begin(), config.latents_mean.end());
    const std::vector<float> std_dev(config.latents_std.begin(), config.latents_std.end());
    mean_ = at::tensor(mean).view({1, z, 1, 1});
    std_ = at::tensor(std_dev).view({1, z, 1, 1});

    w.skip_prefix("encoder.");
    w.skip_prefix("quant_conv.");
    // Decoder widths: the deepest first, then dim_mult reversed.
    std::vector<int64_t> dims = {config.base_dim * config.dim_mult.back()};
    for (int64_t i = n - 1; i >= 0; --i) dims.push_back(config.base_dim * config.dim_mult[i]);

    post_quant_conv_ = load_causal_conv(w, "post_quant_conv", z, z, 1);
    conv_in_ = load_causal_conv(w, "decoder.conv_in", z, dims[0], 3);
    mid_ = MidBlock::load(w, "decoder.mid_block", dims[0]);
    for (int64_t i = 0; i < n; ++i) {
        const std::string p = "decoder.up_blocks." + std::to_string(i);
        // After the first block, the input is the previous upsample's output: half its width.
        int64_t in = i > 0 ? dims[i] / 2 : dims[i];
        const int64_t out = dims[i + 1];
        UpBlock blk;
        for (int64_t j = 0; j <= config.num_res_blocks; ++j) {
            blk.resnets.push_back(Residual::load(w, p + ".resnets." + std::to_string(j), in, out));
            in = out;
        }
        if (i != n - 1) {
            blk.upsample = Conv2d::load(w, p + ".upsamplers.0.resample.1", out, out / 2, 3);
            // upsample3d (temperal_downsample reversed): its time_conv never runs on one frame.
            if (config.temperal_downsample[n - 2 - i]) w.skip_prefix(p + ".upsamplers.0.time_conv.");
        }
        up_blocks_.push_back(std::move(blk));
    }
    norm_out_ = RmsNorm::load(w, "decoder.norm_out.gamma", dims.back(), false);
    conv_out_ = load_causal_conv(w, "decoder.conv_out", dims.back(), config.input_channels, 3);
}

at::Tensor QwenImageVaeDecoder::decode(const at::Tensor& latents) const {
    if (latents.dim() != 4 || latents.size(1) != config_.z_dim)
        throw ModelError(
            "Qwen-Image VAE decode: expected latents [B, " + std::to_string(config_.z_dim) + ", h, w], got " +
            std::to_string(latents.dim()) + " dimensions" +
            (latents.dim() >= 2 ? " with " + std::to_string(latents.size(1)) + " channels" : ""));
    // As the pipeline writes it: latents / (1 / std) + mean, the statistics cast to the latents'
    // dtype first and the reciprocal taken in that dtype.
    const at::Tensor inv_std = at::reciprocal(std_.to(latents.options()));
    at::Tensor x = latents / inv_std + mean_.to(latents.options());
    x = conv_in_(post_quant_conv_(x));
    x = mid_(x);
    for (const UpBlock& blk : up_blocks_) {
        for (const qwen_vae::Residual& r : blk.resnets) x = r(x);
        if (blk.upsample.weight.defined())
            // Nearest copies values exactly, so diffusers' detour through fp32 changes nothing.
            x = blk.upsample(at::_upsample_nearest_exact2d(x, {x.size(2) * 2, x.size(3) * 2}, 2.0, 2.0));
    }
    x = conv_out_(at::silu(norm_out_(x)));
    return at::clamp(x, -1.0, 1.0);
}

}  // namespace dp::runtime
