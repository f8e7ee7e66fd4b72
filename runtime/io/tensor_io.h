#pragma once
// Tensors in and out of safetensors files.

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/io/safetensors.h"

namespace dp::runtime {

// The tensor `name` of `file`, converted to `dtype` on `device`. When no conversion or copy is
// needed the result aliases the mapping and keeps the file mapped while it lives.
at::Tensor load_tensor(const std::shared_ptr<SafetensorsFile>& file, const std::string& name,
                       at::ScalarType dtype, at::Device device = at::kCPU);

// Its slice [start, start + length) along `dim`, narrowed while it is still the mapping, so only
// the slice is converted, copied and moved. Always a tensor of its own (contiguous).
at::Tensor load_tensor_slice(const std::shared_ptr<SafetensorsFile>& file, const std::string& name,
                             at::ScalarType dtype, at::Device device, int64_t dim, int64_t start,
                             int64_t length);

// Writes tensors (any device, contiguous or not) to `path` atomically: a temporary file in the same
// folder, then a rename.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace dp::runtime
