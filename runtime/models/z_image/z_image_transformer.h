#pragma once
// diffusers' ZImageTransformer2DModel (Z-Image, Z-Image-Turbo) for text to image: a single-stream
// DiT. The latents are cut into 2 x 2 patches (image tokens), the text encoder's features of each
// prompt embedded after an RMS norm (caption tokens); each kind is padded to a multiple of 32 with
// a learnt pad token and refined alone (the image by noise-refiner blocks modulated by the
// timestep, the caption by context-refiner blocks without modulation), then both run as one
// stream through the main blocks. Every block: RMS pre- and post-norms around attention (q, k
// RMS-normed per head, 3-axis rotary positions) and a SwiGLU MLP, the modulated ones scaling the
// pre-norms by 1 + scale and gating both residuals by tanh(gate). The head scales a LayerNorm by
// 1 + a projection of the timestep's embedding.
//
// Note [Z-Image sequences]: as diffusers builds them, per prompt:
//   - the caption of L tokens is padded to C = L rounded up to 32 with cap_pad_token; its token i
//     (pads included) has position (1 + i, 0, 0);
//   - the image's N = (H / 2)(W / 2) tokens are padded to a multiple of 32 with x_pad_token; token
//     (h, w) has position (C + 1, h, w), a pad (0, 0, 0). So the image's positions depend on its own
//     prompt's caption length: the rotary tables are per prompt.
// The pads are tokens like any other (attended, computed); only a batch's padding to its longest
// caption is masked, as diffusers' attention mask does. The image and caption streams go to
// attend() as its two streams, each split over the sequence groups (Note [Z-Image text stream]);
// in one process the order of keys differs from diffusers' [image, caption] only in the
// summation order of the softmax.
//
// Note [Z-Image text stream]: the main blocks run the caption through the same projections and
// MLP as the image, so under context parallelism it is split like the image (FLUX's reasoning,
// Note [FLUX text stream]). The two context-refiner blocks run each prompt's caption whole on
// every rank, one prompt at a time (no mask at all): 2 of 34 blocks over at most 544 tokens,
// against 34 over the image's share.

#include <ATen/core/Tensor.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "runtime/models/common/transformer_base.h"  // its layers, place and config reader

namespace dp::runtime {

struct DeviceMapping;

// diffusers' config.json of ZImageTransformer2DModel; absent keys take its defaults (the released
// 6B model's). Refused with a ModelError naming the key: patch sizes other than all_patch_size [2]
// and all_f_patch_size [1], siglip_feat_dim (Z-Image-Omni), heads that do not divide dim, and
// axes_dims not 3 even integers summing to the head size.
struct ZImageTransformerConfig : ConfigFile<ZImageTransformerConfig> {
    int64_t in_channels = 16;
    int64_t dim = 3840;
    int64_t n_layers = 30;  // main blocks
    int64_t n_refiner_layers = 2;
    int64_t num_attention_heads = 30;  // n_heads
    double norm_eps = 1e-5;
    bool qk_norm = true;
    int64_t cap_feat_dim = 2560;  // the text encoder's width
    double rope_theta = 256.0;
    double t_scale = 1000.0;
    std::array<int64_t, 3> axes_dims{32, 48, 48};
    std::array<int64_t, 3> axes_lens{1024, 512, 512};

    int64_t head_dim() const { return dim / num_attention_heads; }
    static ZImageTransformerConfig from_json_text(const std::string& text, const std::string& path);
};

// One block: attention then a SwiGLU MLP, each between two RMS norms; `modulation` (the refiners of
// the image and the main blocks) from the timestep's embedding, undefined in the context refiner.
struct ZImageBlock {
    ParallelLinear to_q, to_k, to_v, to_out;
    ParallelLinear w1, w2, w3;  // w2(silu(w1 x) * w3 x)
    ParallelLinear modulation;  // Linear(256, 4 dim): scale_msa, gate_msa, scale_mlp, gate_mlp
    RMSNorm norm_q, norm_k;     // per head; undefined weights without qk_norm
    RMSNorm attention_norm1, attention_norm2, ffn_norm1, ffn_norm2;
};

class ZImageTransformer : public TransformerBase<ZImageTransformerConfig> {
  public:
    // Loads this rank's part of the model for its place in `parallel` (which must outlive it): under
    // tensor parallelism every block (refiners too) split by heads and MLP features, the modulations
    // split and gathered. With a device mapping the n_layers main blocks go to their devices; the
    // embeddings, refiners and head with block 0.
    ZImageTransformer(const ZImageTransformerConfig& config, WeightStore& weights,
                      const ParallelContext& parallel = ParallelContext::single(),
                      std::shared_ptr<const DeviceMapping> mapping = nullptr);

    // latents [B, in_channels, H, W] (H, W even), the model's input; text [B, T, cap_feat_dim], each
    // prompt's tokens first and `mask` [B, T] (1 on them; undefined: all T are every prompt's);
    // timestep [B]: diffusers' t, (1000 - the scheduler's timestep) / 1000, in fp32. Returns the
    // model's output [B, in_channels, H, W] in its dtype (the pipeline negates it). Under context
    // parallelism every rank of the groups calls it with the same inputs and gets the same output.
    // Throws ModelError for inputs that do not fit the config or its rotary tables.
    at::Tensor forward(const at::Tensor& latents, const at::Tensor& text, const at::Tensor& mask,
                       const at::Tensor& timestep, const BlockRunner& blocks = BlockRunner()) const;

  private:
    // Each prompt's caption tokens: [B, max C, dim] after the embedder, pads and the context
    // refiner, and each prompt's C (Note [Z-Image sequences]).
    at::Tensor captions(const at::Tensor& text, const std::vector<int64_t>& lengths,
                        std::vector<int64_t>& padded) const;
    // `block` over `tokens` [B, S, dim] with rotary tables cos / sin [B or 1, 1, S, head_dim];
    // `modulation` [B, 4 dim] gathered, or undefined. The second stream (`split` at `text_from`,
    // its shard `words`, key bias `bias2`) only in the main blocks.
    struct Streams {
        const SequenceShard* image = nullptr;
        const SequenceShard* words = nullptr;  // nullptr: `tokens` is one stream
        int64_t split = 0;                     // the first stream's tokens
        at::Tensor bias2;
    };
    at::Tensor block(const ZImageBlock& b, const at::Tensor& tokens, const at::Tensor& cos,
                     const at::Tensor& sin, const at::Tensor& modulation, const Streams& streams,
                     const BlockContext* context = nullptr) const;
    void check_inputs(const at::Tensor& latents, const at::Tensor& text, const at::Tensor& mask,
                      const at::Tensor& timestep) const;
    ZImageBlock load_block(const LinearLoader& linear, const std::string& prefix, bool modulated) const;

    ParallelLinear x_embedder_, cap_embedder_, t_1_, t_2_, final_modulation_, final_linear_;
    RMSNorm cap_norm_;
    at::Tensor x_pad_, cap_pad_;  // [dim]
    std::vector<ZImageBlock> noise_refiner_, context_refiner_, layers_;
};

// Z-Image's rotary tables for positions [S, 3] (int64): cos and sin [S, head_dim] in fp32, each
// angle repeated for its pair, as diffusers' RopeEmbedder makes them (angles in float64 rounded to
// fp32, then their cosine and sine in fp32). Throws ModelError for a position past its axis' length.
struct ZImageRope {
    at::Tensor cos, sin;
};
ZImageRope z_image_rope(const ZImageTransformerConfig& config, const at::Tensor& positions);

}  // namespace dp::runtime
