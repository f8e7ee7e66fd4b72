#pragma once
// Note [FLOPs of a pass]: the floating-point operations of one transformer pass (one prompt, one
// guidance branch, one model call), counted from the transformer's config.json by the family's
// layer list (FamilyFacts::pass_flops), as PyTorch's FLOP counter counts them: a product of an
// m x k activation by a k x n weight is 2mkn, an attention of q queries over kv keys and values of
// width d (all heads) is 4 q kv d. Norms, RoPE, modulation's elementwise work, softmax and the
// VAE are not counted (they are not what a GEMM rate bounds). The unit tests hold every family's
// count against PyTorch's FLOP counter over diffusers' transformers (tests/data/golden/
// pass_flops.json). Pure: `plan` prints it, and a rank divides its step time by it (the MFU of its
// job summary, runtime/pipeline/phase_timer.h).

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "strategies/mesh.h"

namespace dp::strategies {

// A weight product of the pass: `count` products of an m x k activation by a k x n weight.
struct GemmShape {
    int64_t m = 0, k = 0, n = 0, count = 1;
    double flops() const { return 2.0 * m * k * n * count; }
};

// `count` attentions of `queries` over `keys` tokens (all heads).
struct AttentionShape {
    int64_t queries = 0, keys = 0, count = 1;
};

// The tokens of one pass: the image's patches (an edit's reference included) and the text's.
struct PassTokens {
    int64_t image = 0;
    int64_t text = 0;
};

struct PassFlops {
    std::vector<GemmShape> gemms;            // every weight product, in the pass's order
    double attention = 0;                    // the attention products (QK^T and the weighted sum)
    std::vector<AttentionShape> attentions;  // every attention of the pass

    // `count` layers of `in` -> `out` features applied to `tokens` tokens.
    void linear(int64_t tokens, int64_t in, int64_t out, int64_t count = 1);
    // `count` attentions of `queries` over `keys` tokens, `width` features over all heads.
    void attend(int64_t queries, int64_t keys, int64_t width, int64_t count = 1);
    double gemm() const;
    double total() const { return gemm() + attention; }
};

// What one rank computes of a pass under a mesh: its share of the image tokens (split over the
// context-parallel ranks, ulysses x ring), of the text's where the family splits it, every
// product's features over the tp ranks, and the attention over both. An estimate where tp keeps a
// layer whole (the modulations: a token's worth of work).
struct RankFlops {
    double gemm = 0, attention = 0;
    std::vector<GemmShape> gemms;            // its weight products (each one's output features over tp)
    std::vector<AttentionShape> attentions;  // its attentions (its share of the queries)
    double total() const { return gemm + attention; }
};
using PassFlopsCount = PassFlops (*)(const nlohmann::json& config, const PassTokens& tokens);
RankFlops rank_flops(PassFlopsCount count, const nlohmann::json& config, const PassTokens& tokens,
                     const MeshDegrees& degrees, bool text_split);

// "1.23 TFLOP", "456 GFLOP", "7.8 MFLOP": three significant figures.
std::string flops_text(double flops);

}  // namespace dp::strategies
