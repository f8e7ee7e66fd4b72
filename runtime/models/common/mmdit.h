#pragma once
// The MMDiT's dual-stream block, shared by SD3 / SD3.5, FLUX.1's and FLUX.2's double-stream blocks
// and Qwen-Image: per stream an adaptive LayerNorm (shift, scale, gate from the conditioning), q, k
// and v with optional RMS qk-norms and rotary positions, one joint attention over the image and
// text tokens (attend(): every context-parallel scheme), gated residuals, and a GELU(tanh) MLP per
// stream. The families differ only in what a layout and a step say: the layers' names, the qk-norm
// rounding, the fp16 clamp, SD3's context_pre_only last block and SD3.5's second image attention
// (attn2), FLUX.2's modulations shared by every block, its SwiGLU MLPs and layers without biases,
// and each model's rotary tables and text bias. Also the single-stream blocks' attention over one
// [text, image] stream (FLUX.1's and FLUX.2's).

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <string>

#include "runtime/models/common/layers.h"
#include "runtime/parallel/parallel_linear.h"

namespace dp::runtime {

class SequenceShard;
struct SequenceGroups;
class BlockContext;

// What a family's checkpoints call a block's parts, and how the block rounds.
struct DualStreamLayout {
    // Empty (FLUX.2): the model's modulations, shared by every block, come with the step.
    std::string image_modulation = ".norm1.linear";         // Qwen-Image: ".img_mod.1"
    std::string text_modulation = ".norm1_context.linear";  // ".txt_mod.1"
    std::string image_mlp = ".ff";                          // ".img_mlp"
    std::string text_mlp = ".ff_context";                   // ".txt_mlp"
    bool swiglu = false;     // FLUX.2's MLPs: SwiGLU of 2 x mlp_hidden (".linear_in", ".linear_out")
    int64_t mlp_hidden = 0;  // the MLPs' hidden features; 0: 4 x width
    bool bias = true;        // FLUX.2's layers have none
    bool qk_norm = true;     // RMS norms on q and k of both streams
    RmsRounding qk_rounding = RmsRounding::kDiffusers;  // FLUX's are torch.nn.RMSNorm
    // After the block, in fp16 (as diffusers): none (SD3), the text stream when it changed (FLUX),
    // or both streams (Qwen-Image).
    enum class Clamp { kNone, kText, kBoth } clamp = Clamp::kNone;
};

// One forward's place in the model: this rank's heads, the streams' shards, the text's key bias
// and the rotary positions of each stream.
struct DualStreamStep {
    int64_t heads = 0;                     // this rank's share of the attention heads
    const SequenceShard* image = nullptr;  // the image tokens' split (required)
    const SequenceShard* text = nullptr;   // the text's split; nullptr: replicated on every rank
    at::Tensor text_bias;                  // attend()'s bias2 over all text keys, or undefined
    // Applied to each stream's q and k after their norms, [B, H, S, head_dim] -> the same; empty:
    // no rotary positions.
    std::function<at::Tensor(const at::Tensor&)> rotate_image, rotate_text;
    bool last = false;  // the model's last block: the text's output feeds nothing
    // The modulations of a layout without its own (FLUX.2's, shared by every block): [B, 6 width]
    // each, (shift, scale, gate) for attention then the MLP.
    at::Tensor image_modulation, text_modulation;
    // Image tokens modulated by another conditioning (Qwen-Image-Edit-2511's zero_cond_t: an
    // edit's reference tokens by the timestep 0's): that conditioning [B, width] (after SiLU), and
    // which of this rank's image tokens take it, [1, n, 1] bool. Undefined: every token the block's.
    at::Tensor other_conditioning, other_tokens;
    // The block's place in the pass (Note [block runner]): its attention runs through it; nullptr:
    // run directly.
    const BlockContext* block = nullptr;
};

class DualStreamBlock {
  public:
    DualStreamBlock() = default;
    // Loads block `prefix` of a `width`-wide model with `head_dim`-wide heads: the attention split
    // by whole heads, the MLPs and modulations by features. `context_pre_only`: the text only gives
    // keys and values (SD3's last block: a 2 x width modulation, no text output layers);
    // `image_attention`: SD3.5's attn2 (a 9 x width image modulation).
    DualStreamBlock(const LinearLoader& linear, const std::string& prefix, int64_t width, int64_t head_dim,
                    const DualStreamLayout& layout, bool context_pre_only = false,
                    bool image_attention = false);

    // One block on this rank's image tokens `x` [B, n, width] and text `ctx` [B, t, width] (its
    // block when split), with the conditioning `temb_act` [B, width] (after SiLU). Updates both;
    // the text is left as it was where its output feeds nothing. Every rank of the sequence and
    // tensor groups calls it with the same shapes.
    void forward(at::Tensor& x, at::Tensor& ctx, const at::Tensor& temb_act,
                 const DualStreamStep& step) const;

  private:
    struct Attention {
        ParallelLinear to_q, to_k, to_v, to_out;
        std::optional<RMSNorm> norm_q, norm_k;
    };
    DualStreamLayout::Clamp clamp_ = DualStreamLayout::Clamp::kNone;
    bool context_pre_only_ = false, image_attention_ = false;
    ParallelLinear modulation_, text_modulation_;
    Attention image_, text_;
    ParallelLinear to_add_out_;  // the text's output projection (absent when context_pre_only)
    Attention attn2_;            // SD3.5's image-only second attention
    FeedForward mlp_, text_mlp_;
};

// Note [FLUX single blocks, one stream]: text and image go through the single blocks as
// diffusers' one [text, image] stream, so no block concatenates or splits them: this rank's text
// block then its image block, one tensor for the per-token layers. Unsplit, attend() takes it as
// one stream; split, as the two streams it holds, each by its own shard. (FLUX.1's text rotation is
// the identity, cos 1 and sin 0: x * 1 + rotated * 0 is x exactly.)
//
// The attention of such a block: q, k, v [B, heads, text + image, head_dim] (normed and rotated)
// of this rank's stream, its first `text` tokens the text's -> the merged heads [B, tokens, heads
// x head_dim], or the image's alone with `image_only` (the model's last block). Every rank of the
// sequence groups calls it with the same shapes.
at::Tensor one_stream_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t text,
                                bool image_only, const SequenceShard& image, const SequenceShard& words,
                                const SequenceGroups& sequence);

}  // namespace dp::runtime
