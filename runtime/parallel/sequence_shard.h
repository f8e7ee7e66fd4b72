#pragma once
// SequenceShard: one token dimension split over the context-parallel ranks (SequenceGroups: Ring
// outermost, Ulysses inside). The tokens are padded to a multiple of the ranks, so any length
// splits (odd resolutions, any text length); each rank keeps one contiguous block, and the
// padding is masked out of attention as keys and dropped when the blocks are gathered back. The
// same split applies to anything indexed by token, such as rotary position ids.

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "runtime/parallel/parallel_context.h"

namespace dp::runtime {

class SequenceShard {
  public:
    // `tokens` real tokens over `groups`; with one rank nothing is split or padded.
    SequenceShard(int64_t tokens, const SequenceGroups& groups);

    bool split() const { return ranks_ > 1; }
    int64_t tokens() const { return tokens_; }
    int64_t padded() const { return padded_; }
    int64_t local() const { return local_; }  // tokens per rank
    // Tokens per ring segment: the blocks of one ring rank's Ulysses group, which Ulysses' all-to-all
    // brings together.
    int64_t segment() const { return local_ * groups_.ulysses_size(); }
    const SequenceGroups& groups() const { return groups_; }

    // This rank's block of `x` along `dim` (zero-padded first). No communication.
    at::Tensor shard(const at::Tensor& x, int64_t dim = 1) const;
    // The whole dimension back from every rank's block, unpadded: an all_gather over the Ulysses
    // group, then over the ring. Every rank of the groups calls it.
    at::Tensor gather(const at::Tensor& block, int64_t dim = 1) const;
    // Whether each of the `count` positions from `start` (in the padded order) is a real token, as
    // a bool tensor on `device`.
    at::Tensor real_tokens(int64_t start, int64_t count, const at::Device& device) const;
    // The first of this rank's positions, in the padded order.
    int64_t start() const;
    // The sums over the whole sequence of `per_token` [n, local()] (this rank's positions), the
    // padding left out: [n] in fp32, all-reduced over the Ulysses and ring groups, so every rank of
    // them gets the same values. Every rank of the groups calls it.
    at::Tensor sum_tokens(const at::Tensor& per_token) const;

  private:
    SequenceGroups groups_;
    int64_t tokens_, ranks_, padded_, local_;
};

}  // namespace dp::runtime
