#pragma once
// transformers' CLIPTextModelWithProjection (SD3's CLIP-L and CLIP-G) and CLIPTextModel (FLUX's
// CLIP-L), shapes from config.json: token and position embeddings, pre-norm causal self-attention
// layers, the final layer norm, and the pooled (end-of-text) token, projected by text_projection
// when the model has one (CLIPTextModelWithProjection's text_embeds), else as it is (CLIPTextModel's
// pooler_output).

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "runtime/io/config_file.h"
#include "runtime/models/common/layers.h"

namespace dp::runtime {

struct ClipTextConfig : ConfigFile<ClipTextConfig> {
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
    // config.json's architectures[0]: "CLIPTextModelWithProjection" (the default when absent)
    // projects the pooled token, "CLIPTextModel" has no text_projection.
    bool projection = true;

    // Throws ModelError naming the file and key for a missing, mistyped or unsupported value.
    static ClipTextConfig from_json_text(const std::string& text, const std::string& path);
};

struct ClipTextOutput {
    at::Tensor hidden;  // [batch, seq, hidden]: the layer output SD3 uses (penultimate by default)
    // The end-of-text token after the final layer norm: [batch, projection_dim] through
    // text_projection, or [batch, hidden_size] without one (ClipTextConfig::projection).
    at::Tensor pooled;
};

class ClipTextEncoder {
  public:
    // The text model's tensors named text_model.* (as the hub's checkpoints of both classes are) or,
    // for CLIPTextModel as transformers 5 saves it, without the prefix. Throws ModelError when the
    // weights disagree with the config, a text_projection.weight beside a CLIPTextModel config included.
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
    Linear projection_;  // empty without ClipTextConfig::projection
};

}  // namespace dp::runtime
