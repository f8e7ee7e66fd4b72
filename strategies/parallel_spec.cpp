#include "strategies/parallel_spec.h"
#include "strategies/text.h"

#include <algorithm>

namespace dp::strategies {
namespace {

// T5's encoder (text_encoder_3 of SD3, FLUX's text_encoder_2), split like any transformer: q, k, v
// and the gated feed-forward's input projections column-parallel (by heads and features), the
// attention output and the feed-forward output row-parallel. Its relative position bias and its
// norms stay whole.
void add_t5_encoder_rules(ParallelSpec& s) {
    for (const char* column : {".SelfAttention.q", ".SelfAttention.k", ".SelfAttention.v",
                               ".DenseReluDense.wi_0", ".DenseReluDense.wi_1", ".DenseReluDense.wi"})
        s.tp_rules.push_back({column, TpSplit::kColumn, {}});
    for (const char* row : {".SelfAttention.o", ".DenseReluDense.wo"})
        s.tp_rules.push_back({row, TpSplit::kRow, {}});
}

// Qwen2.5-VL's language model as Qwen-Image's text encoder (a Qwen2 decoder): q, k, v (by
// key-value head groups, so that each rank keeps whole GQA groups) and SwiGLU's gate and up
// projections column-parallel, the attention output and down projection row-parallel. Embeddings
// and norms stay whole.
void add_qwen2_decoder_rules(ParallelSpec& s) {
    for (const char* column :
         {".self_attn.q_proj", ".self_attn.k_proj", ".self_attn.v_proj", ".mlp.gate_proj", ".mlp.up_proj"})
        s.tp_rules.push_back({column, TpSplit::kColumn, {}});
    for (const char* row : {".self_attn.o_proj", ".mlp.down_proj"})
        s.tp_rules.push_back({row, TpSplit::kRow, {}});
}

}  // namespace

const ParallelSpec& qwen_image_parallel_spec() {
    static const ParallelSpec spec = [] {
        ParallelSpec s;
        s.family = "qwen-image";
        s.display_name = "Qwen-Image";
        s.pipeline_class = "QwenImagePipeline";
        s.components = {"text_encoder", "transformer", "vae"};
        s.tp_components = {"text_encoder"};
        s.offload = true;
        s.block_prefixes = {"transformer_blocks."};
        // Dual-stream blocks: q, k, v of both streams column-parallel (by heads), the outputs
        // row-parallel, both GELU MLPs column- then row-parallel.
        for (const char* column :
             {".attn.to_q", ".attn.to_k", ".attn.to_v", ".attn.add_q_proj", ".attn.add_k_proj",
              ".attn.add_v_proj", ".img_mlp.net.0.proj", ".txt_mlp.net.0.proj"})
            s.tp_rules.push_back({column, TpSplit::kColumn, {}});
        for (const char* row : {".attn.to_out.0", ".attn.to_add_out", ".img_mlp.net.2", ".txt_mlp.net.2"})
            s.tp_rules.push_back({row, TpSplit::kRow, {}});
        // Each stream's modulation (6 x width per block from the timestep alone): a third of the
        // transformer's weights for one row per prompt; split and gathered, where diffusers' TP
        // keeps them whole.
        for (const char* gathered : {".img_mod.1", ".txt_mod.1"})
            s.tp_rules.push_back({gathered, TpSplit::kColumnGathered, {}});
        add_qwen2_decoder_rules(s);
        // The text (up to 1024 tokens, of any length) is split like the image under context
        // parallelism, padded and masked: replicated, each rank would repeat its whole MLPs and
        // projections (Note [Qwen-Image text stream], qwen_image_transformer.h).
        s.streams = {{"image", true}, {"text", true}};
        s.unloaded_tensors = {{"vae", "encoder."},
                              {"vae", "quant_conv."},
                              {"text_encoder", "visual."},
                              {"text_encoder", "model.visual."},
                              {"text_encoder", "lm_head."}};
        // QwenImageTransformer2DModel's defaults; 128 latents a side is the pipeline's
        // default_sample_size (1024 pixels).
        s.transformer_defaults.heads = 24;
        s.transformer_defaults.head_dim = 128;
        s.transformer_defaults.layers = 60;
        s.transformer_defaults.patch_size = 2;
        s.transformer_defaults.in_channels = 64;
        s.transformer_defaults.sample_size = 128;
        s.vae_scale_key = "temperal_downsample";
        // Its RoPE tables hold 4096 positions: half a side's patches from the centre, then up to
        // 1024 text positions after them.
        s.max_patches_key.clear();
        s.max_patches = 2 * (4096 - 1024);
        return s;
    }();
    return spec;
}

const ParallelSpec& sd3_parallel_spec() {
    static const ParallelSpec spec = [] {
        ParallelSpec s;
        s.family = "sd3";
        s.display_name = "SD3";
        s.pipeline_class = "StableDiffusion3Pipeline";
        s.components = {"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"};
        s.t5_encoder = "text_encoder_3";
        s.tp_components = {"text_encoder_3"};
        s.offload = true;
        s.block_prefixes = {"transformer_blocks."};
        // Joint attention: q, k, v column-parallel for both streams, the outputs row-parallel;
        // SD3.5's image-only second attention (attn2) split the same way, by the same heads; the
        // MLPs column- then row-parallel. AdaLN, norms and embeddings stay whole.
        for (const char* column : {".attn.to_q", ".attn.to_k", ".attn.to_v", ".attn.add_q_proj",
                                   ".attn.add_k_proj", ".attn.add_v_proj", ".attn2.to_q", ".attn2.to_k",
                                   ".attn2.to_v", ".ff.net.0.proj", ".ff_context.net.0.proj"})
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

const ParallelSpec& flux_parallel_spec() {
    static const ParallelSpec spec = [] {
        ParallelSpec s;
        s.family = "flux";
        s.display_name = "FLUX.1";
        s.pipeline_class = "FluxPipeline";
        s.components = {"text_encoder", "text_encoder_2", "transformer", "vae"};
        s.tp_components = {"text_encoder_2"};
        s.t5_required = true;
        s.offload = true;
        // 19 double-stream blocks, then 38 single-stream ones; device_map counts them in that order.
        s.block_prefixes = {"transformer_blocks.", "single_transformer_blocks."};
        s.more_layers_keys = {{"num_single_layers", 38}};
        // Double-stream blocks as SD3's joint ones; single-stream blocks: q, k, v and the MLP's
        // input column-parallel, and the one output projection over [attention, MLP]
        // row-parallel over its two segments (width and 4 x width), each split as its producer is.
        for (const char* column :
             {".attn.to_q", ".attn.to_k", ".attn.to_v", ".attn.add_q_proj", ".attn.add_k_proj",
              ".attn.add_v_proj", ".ff.net.0.proj", ".ff_context.net.0.proj", ".proj_mlp"})
            s.tp_rules.push_back({column, TpSplit::kColumn, {}});
        for (const char* row : {".attn.to_out.0", ".attn.to_add_out", ".ff.net.2", ".ff_context.net.2"})
            s.tp_rules.push_back({row, TpSplit::kRow, {}});
        s.tp_rules.push_back({".proj_out", TpSplit::kRowSegments, {1, 4}});
        // The modulations (6 x width per double block and stream, 3 x per single block): split and
        // gathered, as SD3's and Qwen-Image's.
        for (const char* gathered : {".norm1.linear", ".norm1_context.linear", ".norm.linear"})
            s.tp_rules.push_back({gathered, TpSplit::kColumnGathered, {}});
        add_t5_encoder_rules(s);
        // The text (T5's 512 or 256 tokens, no mask) runs through every single block's MLP beside
        // the image: split like it, as Qwen-Image's (Note [FLUX text stream], flux_transformer.h).
        s.streams = {{"image", true}, {"text", true}};
        s.unloaded_tensors = {{"vae", "encoder."}, {"vae", "quant_conv."}};
        // FluxTransformer2DModel's defaults; FluxPipeline's default_sample_size is 128 latents.
        s.transformer_defaults.heads = 24;
        s.transformer_defaults.head_dim = 128;
        s.transformer_defaults.layers = 19;
        s.transformer_defaults.patch_size = 1;
        s.transformer_defaults.in_channels = 64;
        s.transformer_defaults.sample_size = 128;
        s.packed_patch = 2;
        // Rotary positions from ids: no table bounds the size; 512 patches (8192 pixels) a side.
        s.max_patches_key.clear();
        s.max_patches = 512;
        // FLUX.1-schnell: no guidance embedding, and call arguments of its own.
        s.variant_key = "guidance_embeds";
        s.variant_name = "FLUX.1-schnell";
        s.variant_family = "flux-schnell";
        return s;
    }();
    return spec;
}

const std::vector<const ParallelSpec*>& parallel_specs() {
    static const std::vector<const ParallelSpec*> all = {&sd3_parallel_spec(), &qwen_image_parallel_spec(),
                                                         &flux_parallel_spec()};
    return all;
}

const ParallelSpec* find_parallel_spec(const std::string& pipeline_class) {
    for (const ParallelSpec* s : parallel_specs())
        if (s->pipeline_class == pipeline_class) return s;
    return nullptr;
}

namespace {}  // namespace

bool stream_split(const ParallelSpec& spec, const std::string& name) {
    return std::any_of(spec.streams.begin(), spec.streams.end(),
                       [&](const StreamSpec& s) { return s.name == name && s.split; });
}

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
