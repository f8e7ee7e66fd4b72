#pragma once
// diffusers' Flux2Transformer2DModel (FLUX.2 klein and dev; docs/flux2-reference.md, section 1):
// tokens of 4 x latent_channels (the pipeline patchifies 2 x 2), the text encoder's stacked hidden
// states projected to the model width, a timestep (and, for dev, guidance) embedding from which
// three modulations are made once per forward and shared by every block (double-stream image and
// text, single-stream), double-stream blocks (the shared DualStreamBlock, mmdit.h, with SwiGLU
// MLPs and no biases), single-stream blocks (one fused projection to q, k, v and the SwiGLU's two
// halves, one output projection over [attention, MLP]), a 4-axis rotary embedding from position ids
// for text and image alike, and an AdaLayerNormContinuous head (scale first).
//
// Reference images (Flux2KleinPipeline's `image`) are more image tokens after the noisy ones, with
// ids of their own; the caller appends them (tokens and ids) and keeps the output rows it wants.
// Under context parallelism the text is split like the image, as FLUX.1's (Note [FLUX text
// stream], flux_transformer.h): every single block runs it through the same layers.

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/models/common/mmdit.h"
#include "runtime/models/common/transformer_base.h"  // its layers, place and config reader

namespace dp::runtime {

struct DeviceMapping;
class SequenceShard;

// diffusers' config.json of Flux2Transformer2DModel; absent keys take its defaults (FLUX.2-dev's).
// Refused with a ModelError naming the key: patch_size other than 1, out_channels other than
// in_channels, mlp_ratio other than 3 (the parallel spec's segments of the fused projections),
// axes_dims_rope not 4 even integers summing to attention_head_dim.
struct Flux2TransformerConfig : ConfigFile<Flux2TransformerConfig> {
    int64_t in_channels = 128;  // 4 x the VAE's latent channels
    int64_t num_layers = 8;     // double-stream blocks
    int64_t num_single_layers = 48;
    int64_t attention_head_dim = 128;
    int64_t num_attention_heads = 48;
    int64_t joint_attention_dim = 15360;       // 3 x the text encoder's hidden size
    int64_t timestep_guidance_channels = 256;  // the sinusoid's width
    double mlp_ratio = 3.0;
    std::vector<int64_t> axes_dims_rope{32, 32, 32, 32};  // ids' axes (T, H, W, L)
    double rope_theta = 2000.0;
    double eps = 1e-6;
    bool guidance_embeds = true;  // dev's guidance embedder; klein has none

    int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
    int64_t mlp_hidden() const { return static_cast<int64_t>(static_cast<double>(inner_dim()) * mlp_ratio); }

    static Flux2TransformerConfig from_json_text(const std::string& text, const std::string& path);
};

// A single-stream block's layers (its modulation is the model's).
struct Flux2SingleBlock {
    ParallelLinear to_qkv_mlp_proj;  // [q | k | v | a | b], each rank its share of each
    ParallelLinear to_out;           // over [attention, silu(a) * b]
    RMSNorm norm_q, norm_k;
};

class Flux2Transformer : public TransformerBase<Flux2TransformerConfig> {
  public:
    // Loads this rank's part of the model for its place in `parallel` (which must outlive it): with
    // tensor parallelism its shard of what the spec splits (attention by whole heads, the MLPs'
    // halves alike, the modulations split and gathered). With a device mapping (num_layers +
    // num_single_layers blocks, double ones first) each block loads on its device, the embeddings
    // and the head with block 0; inputs and output are on block 0's device.
    Flux2Transformer(const Flux2TransformerConfig& config, WeightStore& weights,
                     const ParallelContext& parallel = ParallelContext::single(),
                     std::shared_ptr<const DeviceMapping> mapping = nullptr);

    // tokens [B, S_i, in_channels] (the noisy ones, then any reference's) at `image_ids` [S_i, 4];
    // text [B, S_t, joint_attention_dim] at `text_ids` [S_t, 4] (no mask: every token attends);
    // timestep [B] as diffusers' forward takes it (sigma, in the model's dtype); guidance [B] (the
    // scale itself; required iff guidance_embeds, else undefined). Returns [B, S_i, in_channels]
    // in the model's dtype, every token's. Every rank of the groups calls it with the same inputs
    // and gets the same output. Throws ModelError for inputs that do not fit the config.
    at::Tensor forward(const at::Tensor& tokens, const at::Tensor& image_ids, const at::Tensor& text,
                       const at::Tensor& text_ids, const at::Tensor& timestep, const at::Tensor& guidance,
                       const BlockRunner& blocks = BlockRunner()) const;
    // The time (and guidance) embedding [B, width] the modulations are made of (before SiLU).
    at::Tensor time_embedding(const at::Tensor& timestep, const at::Tensor& guidance, int64_t batch) const;

  private:
    void check_inputs(const at::Tensor& tokens, const at::Tensor& image_ids, const at::Tensor& text,
                      const at::Tensor& text_ids, const at::Tensor& timestep,
                      const at::Tensor& guidance) const;
    // The single blocks' one [text; image] stream of this rank and its rotary tables.
    struct OneStream {
        at::Tensor tokens, cos, sin, modulation;
        int64_t text = 0;  // its first tokens, the text's
    };
    // Single block `block` on `stream`; on the model's last block, `image` becomes the image
    // tokens after it.
    void single_block(const BlockContext& block, OneStream& stream, const SequenceShard& image_shard,
                      const SequenceShard& words, at::Tensor& image) const;

    ParallelLinear x_embedder_, context_embedder_;
    ParallelLinear time_1_, time_2_, guidance_1_, guidance_2_;
    ParallelLinear modulation_image_, modulation_text_, modulation_single_;
    std::vector<DualStreamBlock> double_blocks_;
    std::vector<Flux2SingleBlock> single_blocks_;
    ParallelLinear norm_out_, proj_out_;
};

}  // namespace dp::runtime
