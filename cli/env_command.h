#pragma once
// `dp-launch env`: what a bug report needs, read without loading LibTorch or CUDA.

#include <string>

namespace dp::cli {

// Text for people, or a JSON object with the same facts.
std::string describe_environment(bool json);

}  // namespace dp::cli
