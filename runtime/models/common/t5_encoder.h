#pragma once
// transformers' T5EncoderModel (T5 v1.1 / T5-XXL, SD3's and FLUX's text_encoder_3): token
// embeddings, pre-norm blocks of unscaled self-attention with a relative position bias (owned by
// block 0, computed once per forward and shared by every block) and a gated-GELU feed-forward,
// then the final RMS norm. No attention mask: every position attends to every position, pads
// included, as SD3 and FLUX run it.
//
// Note [T5 dtypes]: as transformers runs it. Norm variances are taken in fp32. In fp16 every
// feed-forward output projection (`wo`) is kept in fp32 (_keep_in_fp32_modules), so from block
// 0's feed-forward on the residual stream is fp32, and an fp16 residual is clamped to fp16's
// range (less 1000 when it overflowed); the output is fp16. bf16 runs bf16 throughout.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/io/config_file.h"
#include "runtime/io/weights.h"
#include "runtime/models/common/layers.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/parallel/parallel_linear.h"
#include "strategies/parallel_spec.h"

namespace dp::runtime {

struct T5Config : ConfigFile<T5Config> {
    int64_t vocab_size = 32128, d_model = 512, d_kv = 64, d_ff = 2048, num_layers = 6, num_heads = 8;
    int64_t relative_attention_num_buckets = 32, relative_attention_max_distance = 128;
    double layer_norm_epsilon = 1e-6;
    // transformers' feed_forward_proj: "gated-ACT" (v1.1, T5-XXL: wi_0, wi_1, wo) or "ACT" (v1.0:
    // wi, wo), ACT one of relu, gelu, gelu_new, silu; "gated-gelu" means gelu_new, as transformers has it.
    std::string feed_forward_proj = "gated-gelu";
    bool gated() const { return feed_forward_proj.rfind("gated-", 0) == 0; }
    // The activation's name in transformers' ACT2FN.
    std::string activation() const;

    // Throws ModelError naming the file and key for a missing, mistyped, invalid or unsupported
    // value (transformers' defaults fill absent keys, except feed_forward_proj, whose default
    // "relu" is T5 v1.0's and not supported).
    static T5Config from_json_text(const std::string& text, const std::string& path);
    int64_t inner_dim() const { return num_heads * d_kv; }
};

class T5Encoder {
  public:
    // With a tensor group of more than one rank, `spec`'s rules split the layers (q, k, v, wi_0 and
    // wi_1 by columns, o and wo by rows) and each rank keeps its heads of the position bias; every
    // rank of the group then calls forward with the same ids. The embedding may be stored as
    // shared.weight, encoder.embed_tokens.weight or both (tied); a full T5's decoder is skipped.
    T5Encoder(const T5Config& config, WeightStore& weights, const TensorGroup& tp = {},
              const strategies::ParallelSpec& spec = strategies::t5_encoder_spec());

    // input_ids [B, T] int64 (any device) -> last_hidden_state [B, T, d_model] on the weights'
    // device, in the run's dtype.
    at::Tensor forward(const at::Tensor& input_ids) const;
    // The relative position bias [1, heads of this rank, T, T] (the run's dtype).
    at::Tensor position_bias(int64_t tokens) const;

    const T5Config& config() const { return config_; }
    // Bytes of the tensors this rank holds.
    int64_t parameter_bytes() const;

  private:
    struct Block {
        RMSNorm attention_norm, ff_norm;            // T5LayerNorm (RmsRounding::kT5)
        ParallelLinear q, k, v, o, wi_0, wi_1, wo;  // wi_0 is v1.0's wi when not gated; wi_1 then absent
    };
    T5Config config_;
    int64_t local_heads_ = 0;
    at::Tensor embedding_, relative_bias_;  // relative_bias_: [buckets, local heads]
    RMSNorm final_norm_;
    std::vector<Block> blocks_;
};

}  // namespace dp::runtime
