#include "runtime/image_sink.h"

#include <png.h>
#include <unistd.h>

#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <vector>

#include "protocol/atomic_file.h"
#include "runtime/io/errors.h"
#include "strategies/sha256.h"

namespace dp::runtime {
namespace {

void append_bytes(png_structp png, png_bytep data, png_size_t size) {
    auto* out = static_cast<std::vector<uint8_t>*>(png_get_io_ptr(png));
    out->insert(out->end(), data, data + size);
}

// libpng reports errors by longjmp to png_jmpbuf; nothing with a destructor lives in this frame
// past the setjmp, and the output vector belongs to the caller.
bool encode_png(const uint8_t* rgb, int width, int height, std::vector<uint8_t>& out) {
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
    if (!png) return false;
    png_infop info = png_create_info_struct(png);
    if (!info || setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        return false;
    }
    png_set_write_fn(png, &out, append_bytes, nullptr);
    png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8,
                 PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    png_set_compression_level(png, 6);
    png_write_info(png, info);
    for (int y = 0; y < height; ++y)
        png_write_row(png, const_cast<png_bytep>(rgb + static_cast<std::size_t>(y) * width * 3));
    png_write_end(png, nullptr);
    png_destroy_write_struct(&png, &info);
    return true;
}

}  // namespace

std::string sha256_hex(const void* data, std::size_t size) { return strategies::sha256_hex(data, size); }

WrittenImage write_png_atomically(const std::string& path, const uint8_t* rgb, int width, int height) {
    if (width <= 0 || height <= 0) throw Error(path + ": cannot write an empty image", kExitIo);
    std::vector<uint8_t> png;
    if (!encode_png(rgb, width, height, png)) throw Error(path + ": PNG encoding failed", kExitIo);
    // Note [atomic file]: a reader sees the whole image or none.
    protocol::write_file_atomically(path,
                                    std::string_view(reinterpret_cast<const char*>(png.data()), png.size()));
    return {path, sha256_hex(png.data(), png.size()), png.size()};
}

}  // namespace dp::runtime
