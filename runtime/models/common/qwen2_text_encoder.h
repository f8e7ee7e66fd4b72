#pragma once
// The language model of transformers' Qwen2_5_VLForConditionalGeneration on text alone, as
// diffusers' QwenImagePipeline runs its text_encoder (hidden_states[-1] of a forward with an
// attention mask): token embeddings, pre-norm decoder layers of causal grouped-query
// self-attention (q, k, v with biases, o without; RoPE) and a SwiGLU MLP, then the final RMS
// norm, whose output hidden_states[-1] is (transformers ties it to last_hidden_state). The vision
// tower and lm_head are never loaded.
//
// Note [Qwen2.5-VL text positions]: Qwen2.5-VL's M-RoPE rotates three position streams
// (temporal, height, width), each over its mrope_section of the rotary frequencies. Without
// images or videos transformers 5 gives all three streams the same positions, 0 .. L-1 for every
// row whatever the attention mask (get_rope_index is only called with an image or video grid;
// transformers 4's gave a padded row cumsum(mask) - 1 instead). With equal streams the sections
// recompose into the plain frequency list, so it is ordinary 1-D RoPE over head_dim with
// rope_theta. The two choices of positions differ only by a per-row offset on a left-padded row,
// which RoPE cannot see: logits depend on position differences only, and pads are masked out as
// keys. So a real token's output does not depend on its row's padding, left or right (the golden
// script asserts it against each row run alone).
//
// Note [Qwen3 text encoders]: Qwen3 (Z-Image's Qwen3Model, FLUX.2-klein's Qwen3ForCausalLM) is
// the same decoder with three differences, read from its config.json (model_type qwen3): q, k and
// v without biases (attention_bias), an RMS norm over each head of q and k before RoPE (q_norm,
// k_norm, Qwen2's rounding), and head_dim given apart from hidden_size / heads. Its pipelines take
// hidden states from inside the model (Z-Image hidden_states[-2], klein a list of layers): as
// transformers numbers them, hidden_states[0] is the embeddings, [i] the output of layer i - 1,
// and [num_hidden_layers] the final norm's output. Only the layers a pipeline reads are loaded.
// Mistral 3's language model (FLUX.2-dev's text encoder, model_type mistral3 with a mistral
// text_config) is Qwen3 without the qk-norm; its vision tower and projector are never loaded.
// Note [blind queries]: a query that may see no key (a left pad, before any real token) gets an
// attention output of zero, as torch's attention gives such a row; FLUX.2 sends its pads' states on.
//
// Note [Qwen2 dtypes]: as transformers runs it. RMS norms take the variance in fp32 and scale
// the input-dtype result by the weight; cos and sin are computed in fp32 and cast to the run's
// dtype before the rotation; everything else runs in the run's dtype.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/io/config_file.h"
#include "runtime/io/weights.h"
#include "runtime/models/common/layers.h"
#include "runtime/models/common/qwen2_vision.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/parallel/parallel_linear.h"
#include "strategies/parallel_spec.h"

namespace dp::runtime {

// The text part of a Qwen2.5-VL config.json: its `text_config` (transformers 5) or the top level
// (older files); or a Qwen3 config.json (Note [Qwen3 text encoders]). Absent keys take
// Qwen2_5_VLTextConfig's or Qwen3Config's defaults (num_key_value_heads: num_attention_heads).
struct Qwen2TextConfig : ConfigFile<Qwen2TextConfig> {
    int64_t vocab_size = 152064, hidden_size = 8192, intermediate_size = 29568, num_hidden_layers = 80;
    int64_t num_attention_heads = 64, num_key_value_heads = 8;
    double rms_norm_eps = 1e-5, rope_theta = 1e6;
    std::string hidden_act = "silu";
    // M-RoPE's frequencies per position stream (temporal, height, width), summing to head_dim / 2;
    // transformers' default where the config gives none.
    std::vector<int64_t> mrope_section{16, 24, 24};
    // Qwen3's (Note [Qwen3 text encoders]): q and k normed per head, no q/k/v biases, head_dim
    // given (0: hidden_size / num_attention_heads).
    bool qwen3 = false;
    bool mistral = false;  // Mistral 3's language model: given head_dim, no biases, no qk-norm
    bool qkv_bias = true;
    int64_t explicit_head_dim = 0;

    int64_t head_dim() const {
        return explicit_head_dim ? explicit_head_dim : hidden_size / num_attention_heads;
    }
    // Query heads per key-value head (one GQA group).
    int64_t group_size() const { return num_attention_heads / num_key_value_heads; }

    // Throws ModelError naming the file and key for a missing, mistyped, invalid or unsupported
    // value: a model_type other than qwen2_5_vl or qwen3, hidden_act other than silu, a rope_type
    // other than default / mrope, a sliding window, heads that do not divide hidden_size (without
    // head_dim) or kv heads that do not divide heads, an mrope_section not summing to head_dim / 2.
    // rope_theta is read from rope_parameters (transformers 5), rope_scaling or the top level, in that order.
    static Qwen2TextConfig from_json_text(const std::string& text, const std::string& path);
};

class Qwen2TextEncoder {
  public:
    // With a tensor group of more than one rank, `spec`'s rules split q, k, v, gate and up by
    // columns and o and down by rows; each rank keeps whole GQA groups (its even share of the
    // key-value heads and their query heads: 4 groups over 3 ranks are 2, 1, 1) and its even
    // share of the MLP's features. Every rank of the group then calls forward with the same
    // inputs. Tensors are read under model.* (transformers 4's and 5's save_pretrained) or
    // model.language_model.* (transformers 5's module names), whichever the store holds.
    // With `vision`, the store's vision tower is loaded too (split over `tp` by its own rules,
    // Qwen2VisionTower), else skipped. A Qwen3Model's tensors have no prefix. `layers`: only the
    // first that many decoder layers are loaded (the others and the final norm skipped), for a
    // pipeline that reads hidden_states[layers] at most; -1: all of them.
    Qwen2TextEncoder(const Qwen2TextConfig& config, WeightStore& weights, const TensorGroup& tp = {},
                     const strategies::ParallelSpec& spec = strategies::qwen2_decoder_spec(),
                     const Qwen2VisionConfig* vision = nullptr, int64_t layers = -1);
    ~Qwen2TextEncoder();
    // The vision tower, or nullptr when it was not loaded.
    const Qwen2VisionTower* vision() const { return vision_.get(); }

    // ids [B, L] int64 and mask [B, L] (1 real, 0 pad; undefined: all real), on any device ->
    // hidden_states[-1] [B, L, hidden_size] on the weights' device, in the run's dtype. Outputs at
    // pads are finite and meaningless.
    at::Tensor forward(const at::Tensor& ids, const at::Tensor& mask = {}) const;
    // The same for a prompt with images (Note [Qwen2.5-VL positions with images], qwen2_vision.h):
    // `images` [image tokens, hidden_size] (the vision tower's, every row's in order) replace the
    // embeddings of the ids equal to `image_token`, and `positions` [3, B, L] int64 are the three
    // position streams (undefined: 0 .. L-1 on all three).
    at::Tensor forward(const at::Tensor& ids, const at::Tensor& mask, const at::Tensor& positions,
                       const at::Tensor& images, int64_t image_token) const;
    // transformers' hidden_states[i] for each i of `indices` (Note [Qwen3 text encoders]; a negative
    // i counts from the end, -1 being num_hidden_layers), each [B, L, hidden_size]. Throws
    // ModelError for an index out of range or past the layers loaded.
    std::vector<at::Tensor> hidden_states(const at::Tensor& ids, const at::Tensor& mask,
                                          const std::vector<int64_t>& indices) const;

    const Qwen2TextConfig& config() const { return config_; }
    // Bytes of the tensors this rank holds: every tensor it took from its store.
    int64_t parameter_bytes() const { return parameter_bytes_; }

  private:
    struct Layer {
        RMSNorm input_norm, post_attention_norm;
        RMSNorm q_norm, k_norm;  // Qwen3's; undefined weights otherwise
        ParallelLinear q, k, v, o, gate, up, down;
    };
    // The decoder over `ids`: the hidden states `wanted` names (sorted, in 0 .. layers), or the
    // final norm's output alone when `wanted` is empty.
    std::vector<at::Tensor> run(const at::Tensor& ids, const at::Tensor& mask, const at::Tensor& positions,
                                const at::Tensor& images, int64_t image_token,
                                const std::vector<int64_t>& wanted) const;
    Qwen2TextConfig config_;
    int64_t local_kv_heads_ = 0;
    at::Tensor embedding_, inv_freq_;  // inv_freq_: [head_dim / 2] fp32
    RMSNorm final_norm_;
    std::vector<Layer> layers_;
    std::unique_ptr<Qwen2VisionTower> vision_;
    int64_t parameter_bytes_ = 0;
};

// `rows` padded on the right with `pad` to the longest (the tokenizers' padding side): ids and
// mask [n, longest] int64 on `device`.
std::pair<at::Tensor, at::Tensor> padded_rows(const std::vector<std::vector<int64_t>>& rows, int64_t pad,
                                              const at::Device& device);

}  // namespace dp::runtime
