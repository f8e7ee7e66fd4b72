#include "runtime/libtorch_info.h"

#include <ATen/Context.h>
#include <torch/version.h>

namespace dp::runtime {

std::string libtorch_version() { return TORCH_VERSION; }

bool cuda_available() { return at::hasCUDA(); }

}  // namespace dp::runtime
