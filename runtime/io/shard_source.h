#pragma once
// The one interface through which a layer takes its weights, whole or as this rank's shard: a
// component's files (WeightStore, weights.h) or seeded random values.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dp::strategies {
struct GgmlType;
}

namespace dp::runtime {

// Note [kept quantized]: a GGUF weight may stay in its file's blocks, this rank's rows of them (or
// its columns, when they are cut at block boundaries), and be dequantized each time its layer runs,
// as diffusers' GGUF layers do: the memory is the file's, not the run dtype's, for one
// dequantization per use. The blocks are read where the file's mapping has them (its pages, which
// the kernel may drop and read again), never copied. The values are those of the weight
// dequantized at load, bit for bit.
struct QuantizedWeight {
    std::shared_ptr<const void> mapping;   // keeps the file's mapping alive
    std::vector<const uint8_t*> row_data;  // each row's first block (its columns' first, when cut)
    const strategies::GgmlType* type = nullptr;
    int64_t rows = 0, columns = 0, row_bytes = 0;
    c10::ScalarType dtype = c10::ScalarType::Float;
    c10::Device device = c10::Device(c10::DeviceType::CPU);
    // [rows, columns] in `dtype` on `device`.
    at::Tensor dequantize() const;
    int64_t bytes() const { return rows * row_bytes; }
};

// Where a layer's weights come from (a component's safetensors files, or seeded random values):
// the tensor `name`, whose whole shape must be `shape`, narrowed to [start, start + length) along
// `dim` before it is converted to the run's dtype and moved to its device.
class ShardSource {
  public:
    virtual ~ShardSource() = default;
    virtual at::Tensor take_shard(const std::string& name, const std::vector<int64_t>& shape, int64_t dim,
                                  int64_t start, int64_t length) = 0;
    virtual at::Tensor take(const std::string& name, const std::vector<int64_t>& shape) = 0;
    // The matrix `name` (its slice, with dim >= 0) kept quantized (Note [kept quantized]), or
    // nullptr when this source gives it as a tensor only: take or take_shard it then.
    virtual std::shared_ptr<const QuantizedWeight> take_quantized(const std::string& name,
                                                                  const std::vector<int64_t>& shape,
                                                                  int64_t dim, int64_t start,
                                                                  int64_t length) {
        (void)name, (void)shape, (void)dim, (void)start, (void)length;
        return nullptr;
    }
    // Whether the linear layer `layer` (its name without ".weight") runs as int8 products (Note
    // [int8 compute], runtime/parallel/int8_linear.h): --quantize int8 asked for them, and its
    // family allows them for this layer.
    virtual bool int8_compute(const std::string& layer) const {
        (void)layer;
        return false;
    }
};

}  // namespace dp::runtime
