#pragma once
// attend(): joint attention over two streams of tokens, the one place where context parallelism
// (Ulysses, Ring and both together, USP) exists. Model code projects its q, k, v, calls attend(),
// and projects the outputs; it never sees an all-to-all or a ring.
//
// The first stream (image tokens) is split over the sequence groups by a SequenceShard. The
// second stream (text) is either replicated (every rank holds all of it: SD3's short CLIP text,
// counted once) or split like the first (a long text), by its own SequenceShard. Keys of padding
// positions are masked out; the second stream may carry an additive key bias (a key padding
// mask as -inf, or the constant text tail's ln n).
//
// Contract: every rank of the sequence groups calls attend() in the same order, with tensors of
// the same shapes (the collectives inside follow the Communicator contract).

#include <ATen/core/Tensor.h>

#include "runtime/parallel/sequence_shard.h"

namespace dp::runtime {

struct AttentionInputs {
    // The first stream, this rank's block: [B, H, local, head_dim] with all of this rank's heads
    // (its tensor-parallel share).
    at::Tensor q, k, v;
    const SequenceShard* shard = nullptr;  // how the first stream is split (required)
    // The second stream: [B, H, T, head_dim] when replicated, this rank's block when split.
    // Undefined: attention over the first stream alone.
    at::Tensor q2, k2, v2;
    const SequenceShard* shard2 = nullptr;  // nullptr: the second stream is replicated
    // Added to the logits of the second stream's keys, [1 or B, T] over all T of its tokens (also
    // when split): -inf masks a key out. Undefined: none.
    at::Tensor bias2;
    // False: the caller does not use the second stream's output (saves its collectives).
    bool want_out2 = true;
    // The logits' scale; 0: 1 / sqrt(head_dim). T5 attends unscaled (1).
    double scale = 0;
    // Added to every logit, [1 or B, H, queries, keys] over the whole first stream (T5's relative
    // position bias, for this rank's heads). Only where the first stream is not split (a text
    // encoder, replicated on every rank): with sequence groups it is an InternalError.
    at::Tensor logits_bias;
};

struct AttentionOutputs {
    at::Tensor out;   // [B, H, local, head_dim]: the first stream's block, all of this rank's heads
    at::Tensor out2;  // the second stream like its input: all T when replicated, the block when split
};

// softmax(q k^T / sqrt(head_dim) + bias) v over the keys of both streams, the queries of both.
AttentionOutputs attend(const AttentionInputs& in);

}  // namespace dp::runtime
