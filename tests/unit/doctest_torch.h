#pragma once
// Include this instead of <doctest/doctest.h> in tests that use LibTorch: c10's logging header
// defines glog-style CHECK macros that would silently replace doctest's assertions.

#include <ATen/ATen.h>

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LE
#undef CHECK_LT
#undef CHECK_GE
#undef CHECK_GT

#include <doctest/doctest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#include "support/test_paths.h"

inline std::string read_text_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// A file under tests/data/golden/ (written by scripts/golden/make_golden.py).
inline std::string golden_path(const std::string& name) {
    std::string path(DP_GOLDEN_DIR);
    path.append("/");
    path.append(name);
    return path;
}

// Values drawn from N(0, 1) by a generator seeded with `seed` alone: the same on every rank.
inline at::Tensor seeded(std::vector<int64_t> shape, uint64_t seed) {
    at::Generator gen = at::detail::createCPUGenerator(seed);
    return at::randn(shape, gen, at::kFloat);
}

// The largest absolute difference of two tensors of the same shape, in fp32.
inline double max_diff(const at::Tensor& a, const at::Tensor& b) {
    REQUIRE(a.sizes() == b.sizes());
    return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>();
}

// The largest difference over the real (mask 1) positions of [B, L, D] outputs; with an undefined
// mask, over every position.
inline double masked_diff(const at::Tensor& got, const at::Tensor& want, const at::Tensor& mask) {
    if (!mask.defined()) return max_diff(got, want);
    REQUIRE(got.sizes() == want.sizes());
    const at::Tensor real = mask.to(at::kBool);
    return (got.to(at::kFloat) - want.to(at::kFloat)).abs().index({real}).max().item<double>();
}
