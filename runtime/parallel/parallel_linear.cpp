#include "runtime/parallel/parallel_linear.h"

#include <ATen/ATen.h>

#include <numeric>

#include "runtime/io/errors.h"
#include "runtime/parallel/communicator.h"
#include "runtime/parallel/dense_linear.h"
#include "runtime/parallel/int8_linear.h"
#include "runtime/parallel/kernel_time.h"

namespace dp::runtime {

using strategies::TpSplit;

namespace {

struct FeatureRange {
    int64_t start = 0, length = 0;
};

// The features of `features` this rank keeps: an equal part (unit 0), or its share of the blocks
// of `unit` features.
FeatureRange my_features(const std::string& name, int64_t features, const char* what, const TensorGroup& tp,
                         int64_t unit) {
    if (unit <= 0) {
        if (features % tp.size != 0)
            throw ModelError(name + ": " + std::to_string(features) + " " + what +
                             " do not divide by the tensor-parallel degree " + std::to_string(tp.size));
        const int64_t part = features / tp.size;
        return {tp.rank * part, part};
    }
    if (features % unit != 0)
        throw ModelError(name + ": " + std::to_string(features) + " " + what + " are not whole blocks of " +
                         std::to_string(unit) + " (a head's features)");
    const int64_t blocks = features / unit;
    if (blocks < tp.size)
        throw ModelError(name + ": " + std::to_string(blocks) + " blocks of " + std::to_string(unit) + " " +
                         what + " over the tensor-parallel degree " + std::to_string(tp.size) +
                         " would leave a rank with none (--tp may be at most " + std::to_string(blocks) +
                         ")");
    return {tp.share_start(blocks) * unit, tp.share(blocks) * unit};
}

}  // namespace

ParallelLinear ParallelLinear::load(ShardSource& w, const std::string& name, int64_t in, int64_t out,
                                    const strategies::TpRule& rule, const TensorGroup& tp, bool bias,
                                    int64_t unit) {
    ParallelLinear l;
    l.split_ = tp.size > 1 ? rule.split : TpSplit::kWhole;
    l.group_ = tp.group;
    const std::vector<int64_t> weight_shape = {out, in}, bias_shape = {out};
    const std::string weight = name + ".weight", bias_name = name + ".bias";
    // Note [kept quantized]: the weight as the source keeps it, when it keeps it quantized.
    const auto take = [&](int64_t dim, int64_t start, int64_t length) {
        l.quantized_ = w.take_quantized(weight, weight_shape, dim, start, length);
        if (!l.quantized_)
            l.weight_ = dim < 0 ? w.take(weight, weight_shape)
                                : w.take_shard(weight, weight_shape, dim, start, length);
    };
    switch (l.split_) {
        case TpSplit::kWhole:
            take(-1, 0, 0);
            if (bias) l.bias_ = w.take(bias_name, bias_shape);
            break;
        case TpSplit::kColumn:
        case TpSplit::kColumnGathered: {
            const FeatureRange rows = my_features(name, out, "output features", tp, unit);
            take(0, rows.start, rows.length);
            if (bias) l.bias_ = w.take_shard(bias_name, bias_shape, 0, rows.start, rows.length);
            if (l.split_ == TpSplit::kColumnGathered)  // every rank's share, as the all_gather receives them
                for (int r = 0; r < tp.size; ++r)
                    l.gathered_rows_.push_back(
                        my_features(name, out, "output features", TensorGroup{nullptr, r, tp.size}, unit)
                            .length);
            break;
        }
        case TpSplit::kRow: {
            const FeatureRange cols = my_features(name, in, "input features", tp, unit);
            take(1, cols.start, cols.length);
            if (bias) l.bias_ = w.take(bias_name, bias_shape);
            break;
        }
        case TpSplit::kRowSegments: {
            // Each segment of the input is split on its own: this rank keeps its slice of every
            // segment, in order, matching an input made of the segments' column-parallel slices.
            const int64_t units = std::accumulate(rule.segments.begin(), rule.segments.end(), int64_t{0});
            if (rule.segments.empty() || units <= 0 || in % units != 0)
                throw ModelError(name + ": the parallel spec's segments do not tile its " +
                                 std::to_string(in) + " input features");
            std::vector<at::Tensor> parts;
            int64_t begin = 0;
            for (int64_t s : rule.segments) {
                const int64_t width = in / units * s;
                const FeatureRange cols = my_features(name, width, "input features of a segment", tp, unit);
                parts.push_back(w.take_shard(weight, weight_shape, 1, begin + cols.start, cols.length));
                begin += width;
            }
            l.weight_ = at::cat(parts, 1);
            if (bias) l.bias_ = w.take(bias_name, bias_shape);
            break;
        }
        case TpSplit::kColumnSegments: {
            // Each segment of the output is split on its own (a fused q, k, v by heads): this rank
            // keeps its rows of every segment, in order.
            const int64_t units = std::accumulate(rule.segments.begin(), rule.segments.end(), int64_t{0});
            if (rule.segments.empty() || units <= 0 || out % units != 0)
                throw ModelError(name + ": the parallel spec's segments do not tile its " +
                                 std::to_string(out) + " output features");
            std::vector<at::Tensor> rows, biases;
            int64_t begin = 0;
            for (int64_t s : rule.segments) {
                const int64_t width = out / units * s;
                const FeatureRange mine = my_features(name, width, "output features of a segment", tp, unit);
                rows.push_back(w.take_shard(weight, weight_shape, 0, begin + mine.start, mine.length));
                if (bias)
                    biases.push_back(w.take_shard(bias_name, bias_shape, 0, begin + mine.start, mine.length));
                begin += width;
            }
            l.weight_ = at::cat(rows, 0);
            if (bias) l.bias_ = at::cat(biases, 0);
            break;
        }
    }
    if (w.int8_compute(name) && !l.quantized_) {
        // Note [int8 compute]: a row-parallel shard's channels scaled by their whole rows' maxima.
        const bool row = l.split_ == TpSplit::kRow || l.split_ == TpSplit::kRowSegments;
        at::Tensor row_max = l.weight_.abs().amax(1).to(at::kFloat);
        if (row) l.group_->all_reduce_max(row_max);
        l.int8_ = std::make_shared<const Int8Weight>(quantize_weight(l.weight_, row_max));
        l.dtype_ = l.weight_.scalar_type();
        l.weight_ = at::Tensor();
    }
    return l;
}

ParallelLinear ParallelLinear::whole(at::Tensor weight, at::Tensor bias) {
    ParallelLinear l;
    l.weight_ = std::move(weight);
    l.bias_ = std::move(bias);
    return l;
}

at::Tensor ParallelLinear::weight() const {
    return quantized_ ? quantized_->dequantize() : int8_ ? int8_->dequantized(dtype_) : weight_;
}

at::Tensor ParallelLinear::product(const at::Tensor& x, bool bias, Communicator* row_group) const {
    const KernelTimer timer(KernelKind::kGemm);  // Note [kernel time in the steps]
    if (!int8_) return dense_linear(x, weight_, bias ? bias_ : at::Tensor());
    const at::Tensor y = int8_linear(x, *int8_, row_group);
    return bias && bias_.defined() ? y + bias_ : y;
}

at::Tensor ParallelLinear::operator()(const at::Tensor& x) const {
    if (quantized_) {  // Note [kept quantized]: dequantized for this use only
        ParallelLinear dense = *this;
        dense.quantized_ = nullptr;
        dense.weight_ = quantized_->dequantize();
        return dense(x);
    }
    if (split_ == TpSplit::kWhole || split_ == TpSplit::kColumn || split_ == TpSplit::kColumnSegments)
        return product(x, true, nullptr);
    if (split_ == TpSplit::kColumnGathered) {
        if (!group_)
            throw InternalError("a gathered column-parallel layer was loaded without its tensor group");
        // The features are gathered along dim 0 (the Communicator's unequal blocks), so the
        // output's features go first and come back last.
        const at::Tensor mine = product(x, true, nullptr);
        const int64_t features = mine.size(-1);
        const at::Tensor rows = mine.reshape({-1, features}).t().contiguous();
        const at::Tensor all = at::cat(group_->all_gather(rows, gathered_rows_), 0).t();
        std::vector<int64_t> shape = mine.sizes().vec();
        shape.back() = all.size(1);
        return all.reshape(shape);
    }
    // Row-parallel: the partial products summed over the group, then the bias, once.
    if (!group_) throw InternalError("a row-parallel layer was loaded for a tensor group it was not given");
    at::Tensor partial = product(x, false, group_);
    group_->all_reduce(partial);
    return bias_.defined() ? partial + bias_ : partial;
}

int64_t ParallelLinear::parameter_bytes() const {
    int64_t total = 0;
    for (const at::Tensor* t : {&weight_, &bias_})
        if (t->defined()) total += t->numel() * t->element_size();
    if (int8_) total += int8_->values.numel() + int8_->scale.numel() * 4;
    return total + (quantized_ ? quantized_->bytes() : 0);
}

}  // namespace dp::runtime
