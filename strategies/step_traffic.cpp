#include "strategies/step_traffic.h"

#include <algorithm>

#include "strategies/family.h"
#include "strategies/strategy.h"

namespace dp::strategies {
namespace {

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Features a rank sends, per prompt of the batch, of the layers split by output features and
// gathered: its share of each one's outputs, padded to the largest share.
int64_t gathered_features(const ParallelSpec& spec, const TransformerShape& shape, int tp,
                          const std::map<std::string, int64_t>& counts) {
    int64_t features = 0;
    for (const auto& [name, n] : counts) {
        const std::size_t dot = name.rfind(".weight");
        if (dot == std::string::npos || dot + 7 != name.size()) continue;
        if (tp_rule_for_layer(spec, name.substr(0, dot)).split == TpSplit::kColumnGathered)
            features += (n / shape.width() + tp - 1) / tp;
    }
    return features;
}

// The tensor-parallel all-reduces after each block's attention and MLP outputs, per stream.
int64_t tp_reduced_elements(const TransformerShape& shape, int64_t image_rank, int64_t text_rank,
                            int64_t branches) {
    const int64_t width = shape.width(), layers = shape.layers;
    if (shape.more_layers == 0)
        return branches * width * (2 * image_rank * layers + 2 * text_rank * (layers - 1));
    // FLUX: a double block reduces after each stream's attention and MLP outputs (the last one's
    // text too: the single blocks go on with it), a single block once, over both streams. The
    // last single block's text is not needed: only its image tokens are reduced.
    const int64_t both = image_rank + text_rank, doubles = layers - shape.more_layers;
    return branches * width * (both * (2 * doubles + shape.more_layers) - text_rank);
}

}  // namespace

std::map<std::string, int64_t> step_traffic(const ParallelSpec& spec, const TransformerShape& shape,
                                            const MeshDegrees& deg,
                                            const std::map<std::string, int64_t>& transformer_counts,
                                            const StepTrafficInput& step) {
    const int64_t f = step.element_bytes, b = step.branches, tokens = step.image_tokens;
    const int64_t layers = shape.layers, hd = shape.head_dim, heads = shape.heads;
    const int64_t pixels = shape.in_channels * shape.patch_size * shape.patch_size;  // a token's latents
    // Heads on the busiest rank (Note [uneven heads]).
    const bool heads_fit = heads >= static_cast<int64_t>(deg.tp) * deg.ulysses;
    const int64_t h_tp = heads_fit ? head_split(heads, deg.tp, deg.ulysses).tp_shares.front() : 0;
    const int64_t h_attend = heads_fit ? head_split(heads, deg.tp, deg.ulysses).most() : 0;
    const int64_t split_tokens = deg.ring * deg.ulysses;
    const int64_t n = round_up(tokens, split_tokens);
    // A split text stream (Qwen-Image) travels with the image's tokens, padded to the ranks; a
    // replicated one (SD3) is computed whole on every rank, its attention output gathered.
    const bool text_split = stream_split(spec, "text");
    const int64_t text = step.text_tokens;
    const int64_t m = text_split ? round_up(text, split_tokens) : 0;
    const int64_t text_rank = text_split ? m / split_tokens : text;
    std::map<std::string, int64_t> out;
    if (deg.cfg > 1) out["all_gather"] += pixels * tokens * f;
    if (deg.ulysses > 1) {
        // q, k, v leave with the tp shard's heads; the output comes back with this rank's, from
        // every Ulysses rank; the text output is gathered padded to the largest share.
        // The last block's text output is not needed, so a split text's does not come back there.
        out["all_to_all"] += (layers * b * (3 * h_tp + deg.ulysses * h_attend) * ((n + m) / split_tokens) -
                              b * deg.ulysses * h_attend * (m / split_tokens)) *
                             hd * f;
        out["all_gather"] +=
            ((text_split ? 0 : (layers - 1) * b * h_attend * text * hd) + b * (n / split_tokens) * pixels) *
            f;
    }
    if (deg.ring > 1) {
        out["send"] += 2 * layers * (deg.ring - 1) * b * h_attend * ((n + m) / deg.ring) * hd * f;
        out["all_gather"] += b * (n / deg.ring) * pixels * f;
    }
    if (deg.tp > 1) {
        out["all_reduce"] += tp_reduced_elements(shape, n / split_tokens, text_rank, b) * f;
        out["all_gather"] += b * gathered_features(spec, shape, deg.tp, transformer_counts) * f;
    }
    return out;
}

int64_t plan_text_tokens(const ModelInfo& model, int64_t max_sequence,
                         const std::vector<std::string>& left_out) {
    const FamilyFacts& family = facts_of(*model.spec);
    return family.plan_text_tokens ? family.plan_text_tokens(model, max_sequence, left_out) : max_sequence;
}

}  // namespace dp::strategies
