#pragma once
// Safetensors files written byte by byte for the launcher side's tests (no LibTorch): a header and
// each tensor's elements, all one value, so that what a reader makes of them is stated
// independently of the reader.

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dp::test {

// A path in this process's scratch folder `/tmp/dp_<what>_PID`.
inline std::string scratch_path(const std::string& what, const std::string& name) {
    const std::string dir = "/tmp/dp_" + what + "_" + std::to_string(getpid());
    mkdir(dir.c_str(), 0777);
    return dir + "/" + name;
}

struct StTensor {
    std::string name;
    std::vector<int64_t> shape;
    // F32, BF16 (the float's high half), F16, or any 1-byte dtype (F8_E4M3, U8: zeros)
    std::string dtype = "F32";
    float value = 0;  // every element's value
};

// `v` as IEEE half-precision bits (rounded toward zero; NaN and the infinities kept).
inline uint16_t half_bits(float v) {
    uint32_t f;
    std::memcpy(&f, &v, 4);
    const auto sign = static_cast<uint16_t>((f >> 16) & 0x8000);
    const int exponent = static_cast<int>((f >> 23) & 0xff) - 127 + 15;
    const uint32_t mantissa = f & 0x7fffff;
    if (((f >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (mantissa ? 0x200 : 0));
    if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7c00);
    if (exponent <= 0) return sign;  // too small for a normal half: zero
    return static_cast<uint16_t>(sign | (exponent << 10) | (mantissa >> 13));
}

// The 8-byte length and JSON header of a file holding `tensors` with `metadata`, and their data.
struct StBytes {
    std::string header;
    std::string data;
};
inline StBytes st_bytes(const std::vector<StTensor>& tensors,
                        const std::map<std::string, std::string>& metadata) {
    nlohmann::json header = nlohmann::json::object();
    std::string data;
    for (const StTensor& t : tensors) {
        int64_t n = 1;
        for (int64_t d : t.shape) n *= d;
        const std::size_t begin = data.size();
        for (int64_t i = 0; i < n; ++i) {
            if (t.dtype == "F32") {
                char b[4];
                std::memcpy(b, &t.value, 4);
                data.append(b, 4);
            } else if (t.dtype == "F16") {
                const uint16_t h = half_bits(t.value);
                data.append(reinterpret_cast<const char*>(&h), 2);
            } else if (t.dtype == "BF16") {
                uint32_t bits;
                std::memcpy(&bits, &t.value, 4);
                const uint16_t h = static_cast<uint16_t>(bits >> 16);
                data.append(reinterpret_cast<const char*>(&h), 2);
            } else {
                data.push_back('\0');
            }
        }
        header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
    }
    if (!metadata.empty()) header["__metadata__"] = metadata;
    const std::string h = header.dump();
    std::string bytes(8, '\0');
    const uint64_t len = h.size();
    for (int i = 0; i < 8; ++i)
        bytes[static_cast<std::size_t>(i)] = static_cast<char>((len >> (8 * i)) & 0xff);
    return {bytes + h, data};
}

// The file `path` holding `tensors`, with `metadata`, less its last `cut` bytes (a truncated file).
inline std::string write_st_file(const std::string& path, const std::vector<StTensor>& tensors,
                                 const std::map<std::string, std::string>& metadata = {},
                                 std::size_t cut = 0) {
    const StBytes parts = st_bytes(tensors, metadata);
    std::string bytes = parts.header + parts.data;
    if (cut) bytes.resize(bytes.size() - cut);
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
}

// The file `path` holding only the header of `tensors`: what a reader of sizes alone needs.
inline std::string write_st_header(const std::string& path, const std::vector<StTensor>& tensors) {
    std::ofstream(path, std::ios::binary) << st_bytes(tensors, {}).header;
    return path;
}

}  // namespace dp::test
