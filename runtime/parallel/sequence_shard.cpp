#include "runtime/parallel/sequence_shard.h"

#include <ATen/ATen.h>

#include "runtime/parallel/communicator.h"

namespace dp::runtime {

SequenceShard::SequenceShard(int64_t tokens, const SequenceGroups& groups)
    : groups_(groups), tokens_(tokens), ranks_(groups.size()) {
    padded_ = (tokens + ranks_ - 1) / ranks_ * ranks_;
    local_ = padded_ / ranks_;
}

at::Tensor SequenceShard::shard(const at::Tensor& x, int64_t dim) const {
    if (!split()) return x;
    at::Tensor padded = x;
    if (padded_ > tokens_) {
        std::vector<int64_t> pad(static_cast<std::size_t>(2 * (x.dim() - dim)), 0);  // last dim first
        pad.back() = padded_ - tokens_;
        padded = at::constant_pad_nd(x, pad, 0);
    }
    return padded.narrow(dim, groups_.block() * local_, local_).contiguous();
}

at::Tensor SequenceShard::gather(const at::Tensor& block, int64_t dim) const {
    if (!split()) return block;
    at::Tensor x = block;
    // The Ulysses group's blocks make one ring segment, the ring's segments the whole.
    if (groups_.ulysses) x = at::cat(groups_.ulysses->all_gather(x.contiguous()), dim);
    if (groups_.ring) x = at::cat(groups_.ring->all_gather(x.contiguous()), dim);
    return x.narrow(dim, 0, tokens_);
}

int64_t SequenceShard::start() const { return split() ? groups_.block() * local_ : 0; }

at::Tensor SequenceShard::sum_tokens(const at::Tensor& per_token) const {
    at::Tensor x = per_token.to(at::kFloat);
    if (split()) x = x * real_tokens(start(), local_, x.device()).to(at::kFloat).unsqueeze(0);
    at::Tensor sums = x.sum(1).contiguous();
    if (split()) {
        if (groups_.ulysses) groups_.ulysses->all_reduce(sums);
        if (groups_.ring) groups_.ring->all_reduce(sums);
    }
    return sums;
}

at::Tensor SequenceShard::real_tokens(int64_t start, int64_t count, const at::Device& device) const {
    return at::arange(start, start + count, at::TensorOptions().dtype(at::kLong).device(device)) < tokens_;
}

}  // namespace dp::runtime
