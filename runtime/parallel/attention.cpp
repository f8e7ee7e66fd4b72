#include "runtime/parallel/attention.h"

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "runtime/io/errors.h"
#include "runtime/parallel/communicator.h"
#include "runtime/parallel/cpu_attention.h"
#include "runtime/parallel/kernel_time.h"
#include "strategies/mesh.h"

namespace dp::runtime {
namespace {

// Note [Ulysses with joint attention]: with a Ulysses group of size U, each rank keeps a
// contiguous 1/U of the (padded) split tokens through every per-token layer. In attention, the
// split streams' q, k, v go through an all-to-all from [tokens/U, all heads] to [all tokens of the
// segment, this rank's heads]; a replicated stream is on every rank already, so each rank takes its
// heads of it, and it is counted once. The outputs go back through the inverse all-to-all; a
// replicated stream's output, [T, my heads] on each rank, is gathered over heads so that every
// rank keeps the whole stream. Heads that do not divide by U are shared unevenly, the first ranks
// one more (Note [uneven heads]): the all-to-alls carry each rank's own split sizes.
class Ulysses {
  public:
    Ulysses(const SequenceGroups& g, int64_t heads)
        : group_(g.ulysses_size() > 1 ? g.ulysses : nullptr), n_(g.ulysses_size()) {
        if (heads < n_)
            throw ModelError("context parallelism: " + std::to_string(heads) +
                             " attention heads over Ulysses " + std::to_string(n_) +
                             " would leave a rank with none (--ulysses may be at most " +
                             std::to_string(heads) + " here)");
        shares_ = strategies::even_shares(heads, static_cast<int>(n_));
        const int me = group_ ? group_->rank() : 0;
        mine_ = shares_[static_cast<std::size_t>(me)];
        first_ = strategies::share_start(heads, static_cast<int>(n_), me);
    }

    // [B, H, local, d] (all heads, my tokens) -> [B, my heads, U * local, d] (my segment).
    at::Tensor tokens_to_heads(const at::Tensor& t) const {
        if (!group_) return t;
        const int64_t b = t.size(0), local = t.size(2), d = t.size(3);
        // Heads first, so that rank i's heads are its split of dim 0.
        const at::Tensor heads_first = t.permute({1, 0, 2, 3});
        const at::Tensor got = group_->all_to_all(heads_first, shares_, std::vector<int64_t>(n_, mine_));
        // got: [U * my heads, B, local, d], block i my heads of rank i's tokens.
        return got.view({n_, mine_, b, local, d}).permute({2, 1, 0, 3, 4}).reshape({b, mine_, n_ * local, d});
    }
    // The inverse: [B, my heads, U * local, d] -> [B, H, local, d].
    at::Tensor heads_to_tokens(const at::Tensor& t) const {
        if (!group_) return t;
        const int64_t b = t.size(0), local = t.size(2) / n_, d = t.size(3);
        // [U * my heads, B, local, d]: block i my heads of rank i's tokens.
        const at::Tensor blocks =
            t.reshape({b, mine_, n_, local, d}).permute({2, 1, 0, 3, 4}).reshape({-1, b, local, d});
        const at::Tensor got = group_->all_to_all(blocks, std::vector<int64_t>(n_, mine_), shares_);
        return got.permute({1, 0, 2, 3}).contiguous();  // [B, H, local, d]: rank i's heads in order
    }
    // This rank's heads of a replicated stream, and its output gathered back over heads.
    at::Tensor my_heads(const at::Tensor& t) const { return group_ ? t.narrow(1, first_, mine_) : t; }
    at::Tensor all_heads(const at::Tensor& t) const {
        if (!group_) return t;
        return at::cat(group_->all_gather(t.transpose(0, 1).contiguous(), shares_), 0).transpose(0, 1);
    }

  private:
    Communicator* group_;
    int64_t n_, mine_ = 0, first_ = 0;
    std::vector<int64_t> shares_;  // heads per rank of the group
};

// The additive bias over `count` keys of a stream from padded position `start`: -inf on padding,
// the stream's own bias (if any) on its real tokens. [Bb, count] float, or undefined when it adds
// nothing.
at::Tensor stream_key_bias(int64_t tokens, const at::Tensor& bias, int64_t start, int64_t count,
                           const at::TensorOptions& options) {
    if (start + count <= tokens && !bias.defined()) return {};
    const int64_t real = std::max<int64_t>(0, std::min(count, tokens - start));
    at::Tensor out =
        bias.defined() ? at::full({bias.size(0), count}, -INFINITY, options) : at::zeros({1, count}, options);
    if (bias.defined() && real > 0) out.narrow(1, 0, real).copy_(bias.narrow(1, start, real));
    if (real < count) out.narrow(1, real, count - real).fill_(-INFINITY);
    return out;
}

// Joins per-stream biases over consecutive key ranges; undefined when none adds anything.
at::Tensor joint_bias(const std::vector<std::pair<at::Tensor, int64_t>>& parts,
                      const at::TensorOptions& options) {
    bool any = false;
    int64_t batch = 1;
    for (const auto& [b, n] : parts)
        if (b.defined()) {
            any = true;
            batch = std::max(batch, b.size(0));
        }
    if (!any) return {};
    std::vector<at::Tensor> pieces;
    for (const auto& [b, n] : parts)
        pieces.push_back(b.defined() ? b.expand({batch, n}) : at::zeros({batch, n}, options));
    return at::cat(pieces, 1);
}

// attention_kernel(), timed as the steps' attention (Note [kernel time in the steps]).
at::Tensor timed_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& key_bias, double scale, const at::Tensor& logits_bias = {}) {
    const KernelTimer timer(KernelKind::kAttention);
    return attention_kernel(q, k, v, key_bias, scale, logits_bias);
}

}  // namespace

AttentionOutputs attend(const AttentionInputs& in) {
    if (!in.shard) throw InternalError("attend: the first stream needs its SequenceShard");
    const SequenceShard& s1 = *in.shard;
    const SequenceGroups& g = s1.groups();
    const double scale = in.scale > 0 ? in.scale : 1.0 / std::sqrt(static_cast<double>(in.q.size(3)));
    if (in.logits_bias.defined()) {  // a replicated stream alone: one plain attention
        if (s1.split() || in.q2.defined())
            throw InternalError("attend: a logits bias needs one stream that is not split");
        AttentionOutputs out;
        out.out = timed_attention(in.q, in.k, in.v, {}, in.scale, in.logits_bias);
        return out;
    }
    const Ulysses ulysses(g, in.q.size(1));
    Communicator* ring = g.ring_size() > 1 ? g.ring : nullptr;
    const bool has2 = in.q2.defined();
    const bool split2 = has2 && in.shard2 && in.shard2->split();
    const int64_t tokens2 = !has2 ? 0 : split2 ? in.shard2->tokens() : in.q2.size(2);
    const at::TensorOptions options = in.q.options();
    // The keys and queries each rank attends with: its segment of the split streams, its heads.
    const int64_t seg1 = s1.segment(), seg2 = split2 ? in.shard2->segment() : tokens2;
    auto second = [&](const at::Tensor& t) {
        return split2 ? ulysses.tokens_to_heads(t) : ulysses.my_heads(t);
    };
    auto outputs = [&](const at::Tensor& joint) {
        AttentionOutputs out;
        // No copy here: heads_to_tokens reshapes as it needs, and without Ulysses the kernels'
        // [B, S, H, d] storage of each stream's segment is merge_heads' layout already.
        out.out = ulysses.heads_to_tokens(joint.narrow(2, 0, seg1));
        if (has2 && in.want_out2) {
            const at::Tensor o2 = joint.narrow(2, seg1, joint.size(2) - seg1);
            out.out2 = split2 ? ulysses.heads_to_tokens(o2) : ulysses.all_heads(o2);
        }
        return out;
    };
    const at::Tensor q1 = ulysses.tokens_to_heads(in.q), k1 = ulysses.tokens_to_heads(in.k),
                     v1 = ulysses.tokens_to_heads(in.v);

    if (!ring) {  // one attention over all keys; with Ulysses, this rank's heads of all tokens
        const at::Tensor q = has2 ? at::cat({q1, second(in.q2)}, 2) : q1;
        const at::Tensor k = has2 ? at::cat({k1, second(in.k2)}, 2) : k1;
        const at::Tensor v = has2 ? at::cat({v1, second(in.v2)}, 2) : v1;
        std::vector<std::pair<at::Tensor, int64_t>> parts = {
            {stream_key_bias(s1.tokens(), {}, 0, seg1, options), seg1}};
        if (has2) parts.emplace_back(stream_key_bias(tokens2, in.bias2, 0, seg2, options), seg2);
        return outputs(timed_attention(q, k, v, joint_bias(parts, options), in.scale));
    }

    // Note [ring attention merge]: the queries here are this rank's segment of the split streams
    // and all of a replicated stream, for its heads. They meet a replicated stream's keys once,
    // then each ring rank's key/value segment as it comes round the ring; the partial results are
    // merged exactly by their log-sum-exps:
    // out = (out_a e^{lse_a} + out_b e^{lse_b}) / (e^{lse_a} + e^{lse_b}).
    // A query row whose keys in a block are all masked (a segment of image padding whose text keys
    // the prompt's bias masks) has lse -inf there: it contributes nothing, its partial output is 0.
    const at::Tensor queries = has2 ? at::cat({q1, second(in.q2)}, 2) : q1;
    at::Tensor out, lse;
    // lse where finite, else 0: subtracting it never gives -inf - (-inf).
    auto finite_or_zero = [](const at::Tensor& t) {
        return at::where(at::isneginf(t), at::zeros_like(t), t);
    };
    auto absorb = [&](const at::Tensor& keys, const at::Tensor& values, const at::Tensor& bias) {
        const KernelTimer timer(KernelKind::kAttention);
        at::Tensor scores = at::matmul(queries, keys.transpose(-2, -1)) * scale;
        if (bias.defined()) scores = scores + bias.view({bias.size(0), 1, 1, -1}).to(scores.scalar_type());
        const at::Tensor block_lse = at::logsumexp(scores, -1, true);
        const at::Tensor block_out = at::matmul(at::exp(scores - finite_or_zero(block_lse)), values);
        if (!out.defined()) {
            out = block_out;
            lse = block_lse;
            return;
        }
        const at::Tensor merged = at::logaddexp(lse, block_lse), shift = finite_or_zero(merged);
        out = out * at::exp(lse - shift) + block_out * at::exp(block_lse - shift);
        lse = merged;
    };
    if (has2 && !split2) absorb(ulysses.my_heads(in.k2), ulysses.my_heads(in.v2), in.bias2);  // once
    at::Tensor block_k = split2 ? at::cat({k1, second(in.k2)}, 2) : k1;
    at::Tensor block_v = split2 ? at::cat({v1, second(in.v2)}, 2) : v1;
    const int64_t nr = ring->size();
    for (int64_t step = 0; step < nr; ++step) {
        const int64_t owner = (ring->rank() - step + nr) % nr;
        const int64_t start1 = owner * seg1, start2 = owner * seg2;
        // A segment of padding alone is skipped.
        if (start1 < s1.tokens() || (split2 && start2 < tokens2)) {
            std::vector<std::pair<at::Tensor, int64_t>> parts = {
                {stream_key_bias(s1.tokens(), {}, start1, seg1, options), seg1}};
            if (split2) parts.emplace_back(stream_key_bias(tokens2, in.bias2, start2, seg2, options), seg2);
            absorb(block_k, block_v, joint_bias(parts, options));
        }
        if (step + 1 < nr) {
            block_k = ring->ring_shift(block_k);
            block_v = ring->ring_shift(block_v);
        }
    }
    return outputs(out);
}

}  // namespace dp::runtime
