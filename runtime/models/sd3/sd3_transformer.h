#pragma once
// diffusers' SD3Transformer2DModel (the MMDiT of SD3 and SD3.5): patch embedding with a cropped
// sin-cos position table, timestep + pooled-text conditioning, joint transformer blocks (the
// shared DualStreamBlock, mmdit.h: AdaLayerNormZero on both streams, optional RMS qk-norm, a
// context-pre-only last block), and an AdaLayerNormContinuous output head. SD3.5's
// MMDiT-X blocks (config dual_attention_layers) add a second, image-only self-attention (attn2)
// with its own AdaLN modulation (SD35AdaLayerNormZeroX: 9 x dim). forward can skip blocks, as
// diffusers' skip_layers does for skip-layer guidance.

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/models/common/mmdit.h"
#include "runtime/models/common/transformer_base.h"  // its layers, place and config reader

namespace dp::runtime {

struct DeviceMapping;

// diffusers' config.json of SD3Transformer2DModel. The shape the strategies also read (heads,
// head size, layers, patch, channels, sample size) defaults to SD3's parallel spec
// (strategies::family_spec("sd3").transformer_defaults), written there once.
struct Sd3TransformerConfig : ConfigFile<Sd3TransformerConfig> {
    int64_t sample_size = 0;
    int64_t patch_size = 0;
    int64_t in_channels = 0;
    int64_t out_channels = 0;
    int64_t num_layers = 0;
    int64_t attention_head_dim = 0;
    int64_t num_attention_heads = 0;
    int64_t joint_attention_dim = 4096;
    int64_t caption_projection_dim = 1152;
    int64_t pooled_projection_dim = 2048;
    int64_t pos_embed_max_size = 96;             // the position table's side (SD3.5: 384 medium, 192 large)
    bool qk_rms_norm = false;                    // qk_norm "rms_norm"
    std::vector<int64_t> dual_attention_layers;  // blocks with attn2 (SD3.5), ascending, each once

    int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
    bool dual_attention(int64_t block) const;

    static Sd3TransformerConfig from_json_text(const std::string& text, const std::string& path);
};

class Sd3Transformer : public TransformerBase<Sd3TransformerConfig> {
  public:
    // Loads this rank's part of the model for its place in `parallel` (which must outlive it):
    // with tensor parallelism its shard of the layers SD3's parallel spec splits (q, k, v and
    // MLP-in column-parallel, attention-out and MLP-out row-parallel, for the image and text
    // streams and attn2; AdaLN, norms and embeddings whole). With a device mapping each block
    // loads on its device (the embeddings and output head with block 0), and forward moves the
    // activations between them; inputs and output are on block 0's.
    Sd3Transformer(const Sd3TransformerConfig& config, WeightStore& weights,
                   const ParallelContext& parallel = ParallelContext::single(),
                   std::shared_ptr<const DeviceMapping> mapping = nullptr);

    // latents [B, C, H, W], text [B, T, joint_attention_dim], pooled [B, pooled_projection_dim],
    // timestep [B] (the scheduler's timesteps, 0..1000). Returns [B, out_channels, H, W].
    // tail_repeats: the last text token stands for that many identical tokens (Note [constant
    // text tail]); 1 means the text is taken as it is.
    // skip_layers: blocks that do not run at all (diffusers' skip_layers, for skip-layer
    // guidance); each must be a block index, 0 to num_layers - 1, or forward throws ModelError.
    // Under context parallelism (the context's sequence groups: Ulysses, Ring or both) each rank
    // keeps its block of the image tokens, the text replicated; every rank of the groups calls
    // forward with the same inputs and gets the same output.
    at::Tensor forward(const at::Tensor& latents, const at::Tensor& text, const at::Tensor& pooled,
                       const at::Tensor& timestep, int64_t tail_repeats = 1,
                       const std::vector<int>& skip_layers = {},
                       const BlockRunner& blocks = BlockRunner()) const;

  private:
    at::Tensor patch_weight_, patch_bias_;  // Conv2d(in, inner, kernel = stride = patch)
    // The checkpoint's position table [1, max * max, inner]; undefined when it stores none, and
    // the crop is built from pos_embed_1d_ (Note [position table from its axis]).
    at::Tensor pos_embed_;
    at::Tensor pos_embed_1d_;  // [max, inner / 2]: one axis' sin-cos embedding
    ParallelLinear time_1_, time_2_, text_1_, text_2_, context_embedder_;
    std::vector<DualStreamBlock> blocks_;
    ParallelLinear norm_out_, proj_out_;
};

// diffusers' get_2d_sincos_pos_embed for SD3's table: [grid * grid, dim].
at::Tensor sincos_pos_embed_2d(int64_t dim, int64_t grid, int64_t base_size);
// The same table's centre crop for a height x width patch grid, as diffusers' PatchEmbed crops
// it: [height * width, dim], built without the whole table.
at::Tensor sincos_pos_embed_crop(int64_t dim, int64_t grid, int64_t base_size, int64_t height, int64_t width);

}  // namespace dp::runtime
