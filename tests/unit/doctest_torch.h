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

#include <fstream>
#include <sstream>
#include <string>

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
