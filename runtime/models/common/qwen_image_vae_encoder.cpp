// The encoder half of AutoencoderKLQwenImage (qwen_image_vae.h), one frame per image (Note [one
// frame through causal 3-D convolutions], qwen_image_vae.cpp).
#include <ATen/ATen.h>

#include <algorithm>
#include <sstream>

#include "runtime/io/errors.h"
#include "runtime/models/common/qwen_image_vae.h"

namespace dp::runtime {

template <>
QwenImageVaeEncoder::ImageEncoder(const QwenImageVaeConfig& config, WeightStore& w) : config_(config) {
    using namespace qwen_vae;
    const int64_t n = static_cast<int64_t>(config.dim_mult.size());
    if (n < 1 || static_cast<int64_t>(config.temperal_downsample.size()) != n - 1)
        throw ModelError(
            "Qwen-Image VAE: inconsistent config (dim_mult, temperal_downsample); build it with "
            "QwenImageVaeConfig::from_json_text");
    // QwenImageEncoder3d gives a down block attention when its scale (1, 1/2, 1/4...) is listed.
    for (int64_t i = 0; i < n; ++i) {
        const double scale = 1.0 / static_cast<double>(int64_t{1} << i);
        if (std::find(config.attn_scales.begin(), config.attn_scales.end(), scale) ==
            config.attn_scales.end())
            continue;
        std::ostringstream says;
        says << "Qwen-Image VAE: attn_scales lists " << scale
             << ", attention in an encoder down block; supported: none ([] as Qwen-Image's)";
        throw ModelError(says.str());
    }
    w.skip_prefix("decoder.");
    w.skip_prefix("post_quant_conv.");
    const int64_t base = config.base_dim, z2 = 2 * config.z_dim;
    conv_in_ = load_causal_conv(w, "encoder.conv_in", config.input_channels, base, 3);
    // encoder.down_blocks is one flat list: each level's residual blocks, then its resample.
    int64_t k = 0, in = base, out = base;
    for (int64_t i = 0; i < n; ++i) {
        out = base * config.dim_mult[i];
        DownLevel<Residual> level;
        for (int64_t j = 0; j < config.num_res_blocks; ++j, ++k) {
            level.resnets.push_back(Residual::load(w, "encoder.down_blocks." + std::to_string(k), in, out));
            in = out;
        }
        if (i != n - 1) {
            const std::string p = "encoder.down_blocks." + std::to_string(k++);
            level.downsample = Downsample2x::load(w, p + ".resample.1", out);
            // downsample3d: its time_conv never runs on the first chunk.
            if (config.temperal_downsample[i]) w.skip_prefix(p + ".time_conv.");
        }
        levels_.push_back(std::move(level));
    }
    mid_ = MidBlock::load(w, "encoder.mid_block", out);
    norm_out_ = RmsNorm::load(w, "encoder.norm_out.gamma", out, false);
    conv_out_ = load_causal_conv(w, "encoder.conv_out", out, z2, 3);
    quant_conv_ = load_causal_conv(w, "quant_conv", z2, z2, 1);
}

}  // namespace dp::runtime
