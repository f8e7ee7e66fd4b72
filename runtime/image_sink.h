#pragma once
// Writing finished images: PNG through libpng, to a temporary name in the target folder and then
// renamed, so a crash never leaves a half-written file under a final name. Light header.

#include <cstdint>
#include <string>

namespace dp::runtime {

struct WrittenImage {
    std::string path;
    std::string sha256;  // of the PNG file's bytes, lowercase hex
    std::size_t bytes = 0;
};

// Encodes `rgb` (height x width x 3 bytes, row-major) as an 8-bit RGB PNG. The encoding is
// deterministic: no time chunk, fixed compression settings, so equal pixels give equal files.
// Throws dp::runtime::Error with exit code 74 (I/O) when the file cannot be written.
WrittenImage write_png_atomically(const std::string& path, const uint8_t* rgb, int width, int height);

// The SHA-256 of `size` bytes, lowercase hex.
std::string sha256_hex(const void* data, std::size_t size);

}  // namespace dp::runtime
