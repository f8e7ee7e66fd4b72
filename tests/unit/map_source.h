#pragma once
// Weights held in memory, handed out as ParallelLinear asks for them (tests of the parallel layer).

#include <ATen/core/Tensor.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/parallel/parallel_linear.h"
#include "unit/doctest_torch.h"

namespace dp::test {

class MapSource : public dp::runtime::ShardSource {
  public:
    std::map<std::string, at::Tensor> tensors;
    bool int8 = false;  // every layer as int8 products (Note [int8 compute])
    bool int8_compute(const std::string&) const override { return int8; }
    at::Tensor take(const std::string& name, const std::vector<int64_t>& shape) override {
        const at::Tensor& t = tensors.at(name);
        if (t.sizes().vec() != shape) throw std::runtime_error(name + ": wrong shape asked for");
        return t;
    }
    at::Tensor take_shard(const std::string& name, const std::vector<int64_t>& shape, int64_t dim,
                          int64_t start, int64_t length) override {
        return take(name, shape).narrow(dim, start, length).contiguous();
    }
};

// Layer "l" of seeded weights, 10 features in and 12 out: what the tests of load-time refusals load.
inline MapSource seeded_layer_l() {
    MapSource source;
    source.tensors["l.weight"] = seeded({12, 10}, 1);
    source.tensors["l.bias"] = seeded({12}, 2);
    return source;
}

}  // namespace dp::test
