#pragma once
// Facts about the LibTorch this worker runs with. Light header: no LibTorch include.

#include <string>

namespace dp::runtime {

// TORCH_VERSION of the headers we were built with, e.g. "2.15.0".
std::string libtorch_version();

}  // namespace dp::runtime
