#include "strategies/parallel_spec.h"
#include "strategies/text.h"

#include <algorithm>

namespace dp::strategies {

void add_tp_rules(ParallelSpec& s, TpSplit split, std::initializer_list<const char*> layer_suffixes) {
    for (const char* suffix : layer_suffixes) s.tp_rules.push_back({suffix, split, {}});
}

void add_t5_encoder_rules(ParallelSpec& s) {
    add_tp_rules(s, TpSplit::kColumn,
                 {".SelfAttention.q", ".SelfAttention.k", ".SelfAttention.v", ".DenseReluDense.wi_0",
                  ".DenseReluDense.wi_1", ".DenseReluDense.wi"});
    add_tp_rules(s, TpSplit::kRow, {".SelfAttention.o", ".DenseReluDense.wo"});
}

void add_qwen2_decoder_rules(ParallelSpec& s) {
    add_tp_rules(
        s, TpSplit::kColumn,
        {".self_attn.q_proj", ".self_attn.k_proj", ".self_attn.v_proj", ".mlp.gate_proj", ".mlp.up_proj"});
    add_tp_rules(s, TpSplit::kRow, {".self_attn.o_proj", ".mlp.down_proj"});
}

void add_qwen2_vision_rules(ParallelSpec& s) {
    s.tp_rules.push_back({".attn.qkv", TpSplit::kColumnSegments, {1, 1, 1}});
    add_tp_rules(s, TpSplit::kColumn, {".mlp.gate_proj", ".mlp.up_proj"});
    add_tp_rules(s, TpSplit::kRow, {".attn.proj", ".mlp.down_proj"});
}

namespace {

// A spec holding one shared encoder's rules alone.
ParallelSpec rules_only(void (*add)(ParallelSpec&)) {
    ParallelSpec s;
    add(s);
    return s;
}

}  // namespace

const ParallelSpec& t5_encoder_spec() {
    static const ParallelSpec spec = rules_only(&add_t5_encoder_rules);
    return spec;
}

const ParallelSpec& qwen2_decoder_spec() {
    static const ParallelSpec spec = rules_only(&add_qwen2_decoder_rules);
    return spec;
}

const ParallelSpec& qwen2_vision_spec() {
    static const ParallelSpec spec = rules_only(&add_qwen2_vision_rules);
    return spec;
}

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
        case TpSplit::kColumnSegments:
            return true;
        case TpSplit::kRow:
        case TpSplit::kRowSegments:
            return !is_bias;
    }
    return false;
}

std::vector<std::string> mmdit_int8_layers() {
    return {".to_q",       ".to_k",       ".to_v",       ".to_out.0",   ".add_q_proj",
            ".add_k_proj", ".add_v_proj", ".to_add_out", ".net.0.proj", ".net.2"};
}

}  // namespace dp::strategies
