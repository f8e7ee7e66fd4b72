#include "runtime/libtorch_info.h"

#include <torch/version.h>

namespace dp::runtime {

std::string libtorch_version() { return TORCH_VERSION; }

}  // namespace dp::runtime
