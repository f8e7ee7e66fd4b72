#include "strategies/parallel_spec.h"

namespace dp::strategies {
namespace {

// T5's encoder (text_encoder_3 of SD3, FLUX's text_encoder_2), split like any transformer: q, k, v
// and the gated feed-forward's input projections column-parallel (by heads and features), the
// attention output and the feed-forward output row-parallel. Its relative position bias and its
// norms stay whole.
void add_t5_encoder_rules(ParallelSpec& s) {
    for (const char* column : {".SelfAttention.q", ".SelfAttention.k", ".SelfAttention.v", ".DenseReluDense.wi_0",
                               ".DenseReluDense.wi_1", ".DenseReluDense.wi"})
        s.tp_rules.push_back({column, TpSplit::kColumn, {}});
    for (const char* row : {".SelfAttention.o", ".DenseReluDense.wo"}) s.tp_rules.push_back({row, TpSplit::kRow, {}});
}

}  // namespace

const ParallelSpec& sd3_parallel_spec() {
    static const ParallelSpec spec = [] {
        ParallelSpec s;
        s.family = "sd3";
        s.pipeline_class = "StableDiffusion3Pipeline";
        s.components = {"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"};
        s.t5_encoder = "text_encoder_3";
        s.block_prefixes = {"transformer_blocks."};
        // Joint attention: q, k, v column-parallel for both streams, the outputs row-parallel;
        // SD3.5's image-only second attention (attn2) split the same way, by the same heads; the
        // MLPs column- then row-parallel. AdaLN, norms and embeddings stay whole.
        for (const char* column :
             {".attn.to_q", ".attn.to_k", ".attn.to_v", ".attn.add_q_proj", ".attn.add_k_proj",
              ".attn.add_v_proj", ".attn2.to_q", ".attn2.to_k", ".attn2.to_v", ".ff.net.0.proj",
              ".ff_context.net.0.proj"})
            s.tp_rules.push_back({column, TpSplit::kColumn, {}});
        for (const char* row :
             {".attn.to_out.0", ".attn.to_add_out", ".attn2.to_out.0", ".ff.net.2", ".ff_context.net.2"})
            s.tp_rules.push_back({row, TpSplit::kRow, {}});
        // AdaLN's modulations (6 x width per block and stream, 9 x with attn2): a third of the
        // transformer's weights, for outputs of one row per prompt; split and gathered.
        for (const char* gathered : {".norm1.linear", ".norm1_context.linear"})
            s.tp_rules.push_back({gathered, TpSplit::kColumnGathered, {}});
        add_t5_encoder_rules(s);
        s.streams = {{"image", true}, {"text", false}};
        s.optional_components = {"text_encoder_3", "vae"};
        s.unloaded_tensors = {{"vae", "encoder."}, {"vae", "quant_conv."}};
        // SD3Transformer2DModel's defaults.
        s.transformer_defaults.heads = 18;
        s.transformer_defaults.head_dim = 64;
        s.transformer_defaults.layers = 18;
        s.transformer_defaults.patch_size = 2;
        s.transformer_defaults.in_channels = 16;
        s.transformer_defaults.sample_size = 128;
        return s;
    }();
    return spec;
}

const std::vector<const ParallelSpec*>& parallel_specs() {
    static const std::vector<const ParallelSpec*> all = {&sd3_parallel_spec()};
    return all;
}

const ParallelSpec* find_parallel_spec(const std::string& pipeline_class) {
    for (const ParallelSpec* s : parallel_specs())
        if (s->pipeline_class == pipeline_class) return s;
    return nullptr;
}

namespace {

bool ends_with(const std::string& s, const std::string& end) {
    return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

}  // namespace

const TpRule& tp_rule_for_layer(const ParallelSpec& spec, const std::string& layer) {
    static const TpRule whole{};
    for (const TpRule& r : spec.tp_rules)
        if (ends_with(layer, r.layer_suffix)) return r;
    return whole;
}

bool tp_splits_tensor(const ParallelSpec& spec, const std::string& tensor_name) {
    std::string layer;
    bool is_bias = false;
    if (ends_with(tensor_name, ".weight")) {
        layer = tensor_name.substr(0, tensor_name.size() - 7);
    } else if (ends_with(tensor_name, ".bias")) {
        layer = tensor_name.substr(0, tensor_name.size() - 5);
        is_bias = true;
    } else {
        return false;
    }
    switch (tp_rule_for_layer(spec, layer).split) {
        case TpSplit::kWhole:
            return false;
        case TpSplit::kColumn:
        case TpSplit::kColumnGathered:
            return true;
        case TpSplit::kRow:
        case TpSplit::kRowSegments:
            return !is_bias;
    }
    return false;
}

}  // namespace dp::strategies
