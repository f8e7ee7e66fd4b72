#pragma once
// diffusers' QwenImageTransformer2DModel (Qwen-Image's MMDiT) for text-to-image: packed 2 x 2
// latents and RMS-normed text projected to the model width, a timestep-only conditioning, dual-stream
// blocks (per stream: SiLU + Linear modulation, LayerNorm without affine, RMS qk-norm, one joint
// attention over text and image with the text's padding masked, gated residuals, GELU(tanh) MLPs),
// a 3-axis rotary position embedding with the image centred and the text after it, and an
// AdaLayerNormContinuous output head.
//
// Note [Qwen-Image text stream]: under context parallelism the text is split over the sequence
// groups like the image (its own SequenceShard, padded, its padding masked), not replicated as
// SD3's short CLIP text is. Qwen-Image's text is long (up to 1024 tokens, of any length) and each
// block runs the text through projections and an MLP as wide as the image's: replicated, every rank
// would recompute all of them, so at 1024 x 1024 (4096 image tokens) with a 512-token text on 8
// ranks, each rank would run 512 text tokens beside its 512 image tokens: half its per-token work
// repeated on every rank. Split, each keeps 64 text tokens, and the cost is the text's share of
// the all-to-alls or ring passes, which the image's already pay for. The RoPE tables are split as
// their tokens are; the text mask is an additive key bias over all T tokens (attend() picks each
// segment's part). Only the image stream is gathered at the end.

#include <ATen/core/Tensor.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/models/common/mmdit.h"
#include "runtime/models/common/transformer_base.h"  // its layers, place and config reader

namespace dp::runtime {

struct DeviceMapping;

// diffusers' config.json of QwenImageTransformer2DModel. The shape the strategies also read (heads,
// head size, layers, patch, channels) defaults to Qwen-Image's parallel spec
// (strategies::family_spec("qwen-image").transformer_defaults). Refused with a ModelError naming
// the key: guidance_embeds, use_additional_t_cond, use_layer3d_rope set to true (diffusers has no
// guidance embedder for the first; the others are the Layered variant's).
struct QwenImageTransformerConfig : ConfigFile<QwenImageTransformerConfig> {
    int64_t patch_size = 0;
    int64_t in_channels = 0;   // of the packed latents: latent channels x patch x patch
    int64_t out_channels = 0;  // of the unpacked latents (diffusers' default 16; null: in_channels)
    int64_t num_layers = 0;
    int64_t attention_head_dim = 0;
    int64_t num_attention_heads = 0;
    int64_t joint_attention_dim = 3584;
    std::array<int64_t, 3> axes_dims_rope{16, 56, 56};  // frame, height, width; even, summing to head_dim
    bool guidance_embeds = false;
    // Qwen-Image-Edit-2511's: an edit's reference tokens are modulated by the timestep 0's
    // conditioning, the latents' and the text by the step's.
    bool zero_cond_t = false;

    int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }

    static QwenImageTransformerConfig from_json_text(const std::string& text, const std::string& path);
};

// An edit's reference images as the transformer takes them: packed tokens [B, sum of grids, in_channels]
// and each image's patch grid (rows, columns), in order; undefined tokens: none.
struct QwenReference {
    at::Tensor tokens;
    std::vector<std::array<int64_t, 2>> grids;
};

class QwenImageTransformer : public TransformerBase<QwenImageTransformerConfig> {
  public:
    // Loads this rank's part of the model for its place in `parallel` (which must outlive it):
    // with tensor parallelism its shard of what the spec splits (q, k, v and MLP-in
    // column-parallel, the attention outputs and MLP-out row-parallel, by whole heads; both
    // modulations column-parallel and gathered). With a device mapping each block loads on its
    // device (the embeddings and output head with block 0), and forward moves the activations
    // between them; inputs and output are on block 0's.
    QwenImageTransformer(const QwenImageTransformerConfig& config, WeightStore& weights,
                         const ParallelContext& parallel = ParallelContext::single(),
                         std::shared_ptr<const DeviceMapping> mapping = nullptr);

    // latents: packed [B, grid_h * grid_w, in_channels]; text [B, T, joint_attention_dim];
    // text_mask [B, T] (bool or integer, true / non-zero = a real token; undefined: all real);
    // timestep [B] as diffusers' forward takes it (the scheduler's timestep / 1000); grid_h,
    // grid_w: the latent's height and width over the patch size (img_shapes (1, grid_h, grid_w)).
    // Returns [B, grid_h * grid_w, patch * patch * out_channels] in the model's dtype. Under
    // context parallelism both streams are split over the sequence groups (Note [Qwen-Image text
    // stream]); every rank of the groups calls forward with the same inputs and gets the same
    // output. Throws ModelError for shapes that do not fit the config.
    // `reference`: an edit's reference images (QwenImageEditPipeline, Edit-Plus), their packed
    // tokens appended to the image stream after the latents' (img_shapes' later entries), the
    // output still the latents' tokens alone.
    at::Tensor forward(const at::Tensor& latents, const at::Tensor& text, const at::Tensor& text_mask,
                       const at::Tensor& timestep, int64_t grid_h, int64_t grid_w,
                       const BlockRunner& blocks = BlockRunner(), const QwenReference& reference = {}) const;

  private:
    ParallelLinear img_in_, txt_in_, time_1_, time_2_;
    RMSNorm txt_norm_;
    std::vector<DualStreamBlock> blocks_;
    ParallelLinear norm_out_, proj_out_;
};

// Qwen-Image's rotary angles (QwenEmbedRope with scale_rope): the cos and sin tables, each
// [tokens, head_dim / 2] in fp32, of the image tokens of a grid_h x grid_w grid (row-major; frame
// position 0, rows and columns centred: -(n - n / 2) ... n / 2 - 1) and of `text_tokens` text
// tokens at positions max(grid_h / 2, grid_w / 2) + j on all three axes.
struct QwenRope {
    at::Tensor image_cos, image_sin, text_cos, text_sin;
};
QwenRope qwen_image_rope(const std::array<int64_t, 3>& axes_dims, int64_t grid_h, int64_t grid_w,
                         int64_t text_tokens);
// The same for several images in one stream (img_shapes' entries, rows x columns each): the k-th
// at frame position k, its rows and columns centred anew; the text after the largest half side.
QwenRope qwen_image_rope(const std::array<int64_t, 3>& axes_dims,
                         const std::vector<std::array<int64_t, 2>>& grids, int64_t text_tokens);
// x [B, H, S, head_dim] rotated pairwise (x[2k], x[2k + 1]) by the angles of cos / sin [S, head_dim
// / 2], in fp32, as diffusers' complex product; returned in x's dtype.
at::Tensor apply_qwen_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
// The same with the rotation as complex numbers, cos + i sin, [tokens, head_dim / 2].
at::Tensor apply_qwen_rope(const at::Tensor& x, const at::Tensor& rotation);

}  // namespace dp::runtime
