#pragma once
// diffusers' FluxTransformer2DModel (FLUX.1 dev and schnell) for text-to-image: latents packed 2 x 2
// by the pipeline (patch_size 1 here), T5's text projected to the model width, a conditioning of
// the timestep, dev's distilled guidance scale and CLIP's pooled output, double-stream blocks (the
// shared DualStreamBlock, mmdit.h: per stream adaLN-Zero, RMS qk-norm, one joint attention over
// [text, image], gated residuals, GELU(tanh) MLPs), single-stream blocks (one stream over [text, image]:
// adaLN-Zero, attention in parallel with a 4x MLP, one output projection over both), a 3-axis rotary
// embedding from position ids, and an AdaLayerNormContinuous output head.
//
// Note [FLUX text stream]: under context parallelism the text is split over the sequence groups like
// the image (its own SequenceShard, padded, the padding masked as keys by attend()), not replicated
// as SD3's short CLIP text is. Every single-stream block (38 of FLUX.1's 57) runs the text through
// the same full-width q, k, v, the 4x MLP and the output projection as the image. Replicated, every
// rank would recompute all of that: at 1024 x 1024 there are 4096 image tokens and 512 T5 tokens, so
// on 8 ranks each would run 512 text tokens beside its 512 image tokens, half its per-token work
// repeated on every rank. Split, each keeps 64 text tokens; the cost is the text's share of the
// all-to-alls or ring passes, which the image's already pay for. T5's text has no mask here (FluxPipeline
// passes none). The rotary tables are split as their tokens are; only the image is gathered at the end.

#include <ATen/core/Tensor.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "runtime/models/common/mmdit.h"
#include "runtime/models/common/transformer_base.h"  // its layers, place and config reader

namespace dp::runtime {

struct DeviceMapping;
class SequenceShard;

// diffusers' config.json of FluxTransformer2DModel. The shape the strategies also read (heads, head
// size, layers, patch, channels) defaults to FLUX.1's parallel spec
// (strategies::family_spec("flux")). Refused with a ModelError naming the key: patch_size other than
// 1 (FluxPipeline packs 2 x 2 itself), axes_dims_rope not 3 even integers summing to
// attention_head_dim, and any other key set (non-null, non-false) that FLUX.1's text-to-image
// transformer does not have.
struct FluxTransformerConfig : ConfigFile<FluxTransformerConfig> {
    int64_t patch_size = 1;
    int64_t in_channels = 64;   // of the packed latents: 16 latent channels x 2 x 2
    int64_t out_channels = 64;  // null or absent: in_channels
    int64_t num_layers = 19;    // double-stream blocks
    int64_t num_single_layers = 38;
    int64_t attention_head_dim = 128;
    int64_t num_attention_heads = 24;
    int64_t joint_attention_dim = 4096;   // T5's width
    int64_t pooled_projection_dim = 768;  // CLIP-L's pooled output
    bool guidance_embeds = false;         // true: dev's guidance embedder
    std::array<int64_t, 3> axes_dims_rope{16, 56,
                                          56};  // ids' axes (0, row, column); even, summing to head_dim

    int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }

    static FluxTransformerConfig from_json_text(const std::string& text, const std::string& path);
};

// A single-stream block: one stream over [text, image]: adaLN-Zero, attention in parallel with a 4x
// MLP, one output projection over both. Every linear layer is a ParallelLinear, split as FLUX.1's
// parallel spec says; the norms are whole.
struct FluxSingleBlock {
    ParallelLinear norm;  // SiLU + Linear(dim, 3 dim): shift, scale, gate
    ParallelLinear to_q, to_k, to_v, proj_mlp;
    ParallelLinear proj_out;  // over [attention (dim), GELU(proj_mlp) (4 dim)]
    RMSNorm norm_q, norm_k;
};

// FluxKontextPipeline's reference image: its packed latents [B, grid_h * grid_w, in_channels],
// appended to the image tokens with position ids (1, row, column) of its own grid. The output is
// the latents' tokens alone.
struct FluxReference {
    at::Tensor latents;
    int64_t grid_h = 0, grid_w = 0;
};

class FluxTransformer : public TransformerBase<FluxTransformerConfig> {
  public:
    // Loads this rank's part of the model for its place in `parallel` (which must outlive it): with
    // tensor parallelism its shard of what the spec splits (attention by whole heads; a single
    // block's proj_mlp and proj_out's MLP segment in head_dim blocks too, so that both split alike;
    // the modulations split and gathered). With a device mapping (num_layers + num_single_layers
    // blocks, double ones first) each block loads on its device, the embeddings and the head with
    // block 0; inputs and output are on block 0's device.
    FluxTransformer(const FluxTransformerConfig& config, WeightStore& weights,
                    const ParallelContext& parallel = ParallelContext::single(),
                    std::shared_ptr<const DeviceMapping> mapping = nullptr);

    // latents packed [B, grid_h * grid_w, in_channels]; text [B, T, joint_attention_dim] (T5, no
    // mask); pooled [B, pooled_projection_dim]; timestep [B] as diffusers' forward takes it (the
    // scheduler's timestep / 1000, in the model's dtype); guidance [B] (the scale itself, fp32;
    // required iff guidance_embeds, else undefined); grid_h, grid_w: the latent's height and width
    // over 2; `reference`: Kontext's reference image, or none. Returns [B, grid_h * grid_w,
    // out_channels] in the model's dtype. Under context parallelism both streams are split (Note
    // [FLUX text stream]; the reference's tokens with the image's); every rank of the groups calls
    // forward with the same inputs and gets the same output. Throws ModelError for inputs that do
    // not fit the config.
    at::Tensor forward(const at::Tensor& latents, const at::Tensor& text, const at::Tensor& pooled,
                       const at::Tensor& timestep, const at::Tensor& guidance, int64_t grid_h, int64_t grid_w,
                       const BlockRunner& blocks = BlockRunner(), const FluxReference& reference = {}) const;

  private:
    // Throws ModelError for forward's inputs that do not fit the config.
    void check_inputs(const at::Tensor& latents, const at::Tensor& text, const at::Tensor& pooled,
                      const at::Tensor& timestep, const at::Tensor& guidance, int64_t grid_h, int64_t grid_w,
                      const FluxReference& reference) const;
    at::Tensor conditioning(const at::Tensor& timestep, const at::Tensor& guidance, const at::Tensor& pooled,
                            int64_t batch) const;
    // This rank's [text; image] tokens through the single blocks (Note [FLUX single blocks, one
    // stream]), and their rotary tables.
    struct OneStream {
        at::Tensor tokens, cos, sin;
        int64_t text = 0;  // its first tokens, the text's
    };
    // Single block `block` (its place among all blocks) on `stream`; on the model's last block,
    // `image` becomes the image tokens after it.
    void single_block(const BlockContext& block, OneStream& stream, const at::Tensor& temb_act,
                      const SequenceShard& image_shard, const SequenceShard& words, at::Tensor& image) const;

    ParallelLinear x_embedder_, context_embedder_;
    ParallelLinear time_1_, time_2_, guidance_1_, guidance_2_, text_1_, text_2_;
    std::vector<DualStreamBlock> double_blocks_;
    std::vector<FluxSingleBlock> single_blocks_;
    ParallelLinear norm_out_, proj_out_;
};

// FluxPosEmbed's tables for the image tokens of a grid_h x grid_w grid (ids (index, row, column),
// row-major; index 0 for the latents, 1 for Kontext's reference): cos and sin [tokens, head_dim] in
// fp32, each angle repeated for its pair, computed in float64 as diffusers does on CPU and CUDA.
// The text's ids are all zero: cos 1, sin 0.
using FluxRope = RopeTable;
FluxRope flux_image_rope(const std::array<int64_t, 3>& axes_dims, int64_t grid_h, int64_t grid_w,
                         int64_t index = 0);
// x [B, H, S, head_dim] rotated pairwise (x[2k], x[2k + 1]) by cos / sin [S, head_dim] in fp32, as
// diffusers' apply_rotary_emb (use_real, unbind -1); returned in x's dtype.
at::Tensor apply_flux_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace dp::runtime
