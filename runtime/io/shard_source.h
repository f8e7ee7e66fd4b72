#pragma once
// The one interface through which a layer takes its weights, whole or as this rank's shard: a
// component's files (WeightStore, weights.h) or seeded random values.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dp::runtime {

// Where a layer's weights come from (a component's safetensors files, or seeded random values):
// the tensor `name`, whose whole shape must be `shape`, narrowed to [start, start + length) along
// `dim` before it is converted to the run's dtype and moved to its device.
class ShardSource {
  public:
    virtual ~ShardSource() = default;
    virtual at::Tensor take_shard(const std::string& name, const std::vector<int64_t>& shape, int64_t dim,
                                  int64_t start, int64_t length) = 0;
    virtual at::Tensor take(const std::string& name, const std::vector<int64_t>& shape) = 0;
};

}  // namespace dp::runtime
