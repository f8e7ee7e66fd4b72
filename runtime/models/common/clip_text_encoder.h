#pragma once
// transformers' CLIPTextModelWithProjection (CLIP-L and CLIP-G shapes alike, from config.json):
// token and position embeddings, pre-norm causal self-attention layers, the final layer norm, and
// the projection of the pooled (end-of-text) token.

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "runtime/models/common/layers.h"

namespace dp::runtime {

struct ClipTextConfig {
    int64_t vocab_size = 49408;
    int64_t hidden_size = 768;
    int64_t intermediate_size = 3072;
    int64_t num_hidden_layers = 12;
    int64_t num_attention_heads = 12;
    int64_t max_position_embeddings = 77;
    int64_t projection_dim = 768;
    int64_t eos_token_id = 49407;
    double layer_norm_eps = 1e-5;
    bool quick_gelu = true;  // hidden_act "quick_gelu"; else "gelu"

    // Throws ModelError naming the file and key for a missing, mistyped or unsupported value.
    static ClipTextConfig from_json_text(const std::string& text, const std::string& path);
    static ClipTextConfig from_json_file(const std::string& path);
};

struct ClipTextOutput {
    at::Tensor hidden;  // [batch, seq, hidden]: the layer output SD3 uses (penultimate by default)
    at::Tensor pooled;  // [batch, projection_dim]: text_projection of the end-of-text token
};

class ClipTextEncoder {
  public:
    ClipTextEncoder(const ClipTextConfig& config, WeightStore& weights);

    // input_ids [batch, seq] (int64). `clip_skip` as diffusers: hidden states[-(clip_skip + 2)].
    ClipTextOutput forward(const at::Tensor& input_ids, int clip_skip = 0) const;
    const ClipTextConfig& config() const { return config_; }

  private:
    struct Layer {
        LayerNorm norm1, norm2;
        Linear q, k, v, out, fc1, fc2;
    };
    ClipTextConfig config_;
    at::Tensor token_embedding_, position_embedding_;
    std::vector<Layer> layers_;
    LayerNorm final_norm_;
    Linear projection_;
};

}  // namespace dp::runtime
