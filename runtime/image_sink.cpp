#include "runtime/image_sink.h"

// clang-format off
#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <jpeglib.h>
// clang-format on
#include <png.h>
#include <unicode/unistr.h>
#include <unistd.h>
#include <webp/encode.h>
#include <webp/mux.h>

#include <cerrno>
#include <csetjmp>
#include <cstring>
#include <vector>

#include "protocol/atomic_file.h"
#include "runtime/io/errors.h"
#include "strategies/sha256.h"

namespace dp::runtime {
namespace {

using Bytes = std::vector<uint8_t>;

bool is_ascii(const std::string& text) {
    for (unsigned char c : text)
        if (c >= 0x80) return false;
    return true;
}

void append_bytes(png_structp png, png_bytep data, png_size_t size) {
    auto* out = static_cast<Bytes*>(png_get_io_ptr(png));
    out->insert(out->end(), data, data + size);
}

// One text chunk: tEXt for ASCII, else iTXt (UTF-8). `key` and `text` outlive the write.
png_text text_chunk(const char* key, const std::string& text) {
    png_text t{};
    t.compression = is_ascii(text) ? PNG_TEXT_COMPRESSION_NONE : PNG_ITXT_COMPRESSION_NONE;
    t.key = const_cast<char*>(key);
    t.text = const_cast<char*>(text.c_str());
    t.text_length = text.size();
    if (t.compression == PNG_ITXT_COMPRESSION_NONE) t.itxt_length = text.size(), t.text_length = 0;
    return t;
}

// libpng reports errors by longjmp to png_jmpbuf; nothing with a destructor lives in this frame
// past the setjmp, and the output vector and texts belong to the caller.
bool encode_png(const uint8_t* rgb, int width, int height, const png_text* texts, int n_texts, Bytes& out) {
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
    if (n_texts > 0) png_set_text(png, info, texts, n_texts);
    png_write_info(png, info);
    for (int y = 0; y < height; ++y)
        png_write_row(png, const_cast<png_bytep>(rgb + static_cast<std::size_t>(y) * width * 3));
    png_write_end(png, nullptr);
    png_destroy_write_struct(&png, &info);
    return true;
}

bool encode_png(const uint8_t* rgb, int width, int height, const ImageEncoding& e, Bytes& out) {
    std::vector<png_text> texts;
    if (!e.parameters.empty()) texts.push_back(text_chunk("parameters", e.parameters));
    if (!e.record.empty()) texts.push_back(text_chunk("dp-launch", e.record));
    return encode_png(rgb, width, height, texts.data(), static_cast<int>(texts.size()), out);
}

// libjpeg's errors end in error_exit, which must not return: it jumps back to encode_jpeg.
struct JpegError {
    jpeg_error_mgr mgr;
    jmp_buf jump;
};
[[noreturn]] void jpeg_error_exit(j_common_ptr cinfo) {
    longjmp(reinterpret_cast<JpegError*>(cinfo->err)->jump, 1);
}

// The JPEG APP1 segment holds 65533 bytes, "Exif\0\0" included.
constexpr std::size_t kJpegExifBytes = 65533 - 6;

bool encode_jpeg(const uint8_t* rgb, int width, int height, const ImageEncoding& e, const std::string& exif,
                 Bytes& out) {
    jpeg_compress_struct cinfo{};
    JpegError err{};
    cinfo.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = jpeg_error_exit;
    unsigned char* buffer = nullptr;
    unsigned long size = 0;
    if (setjmp(err.jump)) {
        jpeg_destroy_compress(&cinfo);
        std::free(buffer);
        return false;
    }
    jpeg_create_compress(&cinfo);
    jpeg_mem_dest(&cinfo, &buffer, &size);
    cinfo.image_width = static_cast<JDIMENSION>(width);
    cinfo.image_height = static_cast<JDIMENSION>(height);
    cinfo.input_components = 3;
    cinfo.in_color_space = JCS_RGB;
    jpeg_set_defaults(&cinfo);
    cinfo.write_JFIF_header = FALSE;  // EXIF (APP1) right after SOI, as an Exif file has it
    jpeg_set_quality(&cinfo, e.quality, TRUE);
    cinfo.optimize_coding = TRUE;
    jpeg_start_compress(&cinfo, TRUE);
    if (!exif.empty()) {
        const std::string segment = std::string("Exif\0\0", 6) + exif;
        jpeg_write_marker(&cinfo, JPEG_APP0 + 1, reinterpret_cast<const JOCTET*>(segment.data()),
                          static_cast<unsigned>(segment.size()));
    }
    while (cinfo.next_scanline < cinfo.image_height) {
        JSAMPROW row = const_cast<JSAMPROW>(rgb + static_cast<std::size_t>(cinfo.next_scanline) * width * 3);
        jpeg_write_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_compress(&cinfo);
    jpeg_destroy_compress(&cinfo);
    out.assign(buffer, buffer + size);
    std::free(buffer);
    return true;
}

// The encoded image with an EXIF chunk through libwebp's mux.
bool add_webp_exif(const uint8_t* webp, std::size_t size, const std::string& exif, Bytes& out) {
    const WebPData image{webp, size};
    WebPMux* mux = WebPMuxCreate(&image, 0);
    if (!mux) return false;
    const WebPData chunk{reinterpret_cast<const uint8_t*>(exif.data()), exif.size()};
    WebPData assembled{nullptr, 0};
    const bool ok = WebPMuxSetChunk(mux, "EXIF", &chunk, 0) == WEBP_MUX_OK &&
                    WebPMuxAssemble(mux, &assembled) == WEBP_MUX_OK;
    if (ok) out.assign(assembled.bytes, assembled.bytes + assembled.size);
    WebPDataClear(&assembled);
    WebPMuxDelete(mux);
    return ok;
}

bool encode_webp(const uint8_t* rgb, int width, int height, const ImageEncoding& e, const std::string& exif,
                 Bytes& out) {
    if (width > WEBP_MAX_DIMENSION || height > WEBP_MAX_DIMENSION) return false;
    uint8_t* encoded = nullptr;
    const std::size_t size = e.quality >= 100 ? WebPEncodeLosslessRGB(rgb, width, height, width * 3, &encoded)
                                              : WebPEncodeRGB(rgb, width, height, width * 3,
                                                              static_cast<float>(e.quality), &encoded);
    if (size == 0) return false;
    bool ok = true;
    if (exif.empty())
        out.assign(encoded, encoded + size);
    else
        ok = add_webp_exif(encoded, size, exif, out);
    WebPFree(encoded);
    return ok;
}

void put16(std::string& s, uint16_t v) {
    s += static_cast<char>(v >> 8);
    s += static_cast<char>(v & 0xff);
}
void put32(std::string& s, uint32_t v) {
    put16(s, static_cast<uint16_t>(v >> 16));
    put16(s, static_cast<uint16_t>(v & 0xffff));
}
void entry(std::string& s, uint16_t tag, uint16_t type, uint32_t count, uint32_t value) {
    put16(s, tag);
    put16(s, type);
    put32(s, count);
    put32(s, value);
}

// "UNICODE\0" and `text` in UTF-16BE, at most `max_units` code units, never half a surrogate pair.
std::string user_comment(const std::string& text, std::size_t max_units) {
    const icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), text.size()));
    std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(u.length()), max_units);
    if (n > 0 && n < static_cast<std::size_t>(u.length()) &&
        U16_IS_LEAD(u.charAt(static_cast<int32_t>(n - 1))))
        --n;
    std::string out("UNICODE\0", 8);
    for (std::size_t i = 0; i < n; ++i) put16(out, u.charAt(static_cast<int32_t>(i)));
    return out;
}

}  // namespace

std::string exif_block(const std::string& description, const std::string& comment, std::size_t max_bytes) {
    // The header, IFD0 (ImageDescription, the Exif IFD's offset) and the Exif IFD (UserComment).
    constexpr uint32_t kIfd0 = 8, kExifIfd = kIfd0 + 2 + 2 * 12 + 4, kData = kExifIfd + 2 + 12 + 4;
    std::string desc = is_ascii(description) ? description : std::string();
    if (!desc.empty()) desc += '\0';
    if (desc.size() % 2) desc += '\0';
    if (kData + desc.size() + 8 + 2 * icu::UnicodeString::fromUTF8(comment).length() > max_bytes)
        desc.clear();
    const std::size_t room = max_bytes > kData + desc.size() + 8 ? max_bytes - kData - desc.size() - 8 : 0;
    const std::string uc = user_comment(comment, room / 2);
    std::string s = "MM";
    put16(s, 42);
    put32(s, kIfd0);
    put16(s, 2);
    // An empty description still takes its entry, with count 0 pointing nowhere in particular.
    entry(s, 0x010E, 2, static_cast<uint32_t>(desc.empty() ? 0 : std::strlen(desc.c_str()) + 1), kData);
    entry(s, 0x8769, 4, 1, kExifIfd);
    put32(s, 0);
    put16(s, 1);
    entry(s, 0x9286, 7, static_cast<uint32_t>(uc.size()), kData + static_cast<uint32_t>(desc.size()));
    put32(s, 0);
    return s + desc + uc;
}

ImageFormat image_format_named(const std::string& name) {
    if (name == "png") return ImageFormat::kPng;
    if (name == "jpeg") return ImageFormat::kJpeg;
    if (name == "webp") return ImageFormat::kWebp;
    throw Error("image format '" + name + "': expected png, jpeg or webp", protocol::kExitInputData);
}

std::string sha256_hex(const void* data, std::size_t size) { return strategies::sha256_hex(data, size); }

WrittenImage write_image_atomically(const std::string& path, const uint8_t* rgb, int width, int height,
                                    const ImageEncoding& e) {
    if (width <= 0 || height <= 0) throw Error(path + ": cannot write an empty image", kExitIo);
    Bytes bytes;
    bool ok = false;
    switch (e.format) {
        case ImageFormat::kPng:
            ok = encode_png(rgb, width, height, e, bytes);
            break;
        case ImageFormat::kJpeg:
            ok =
                encode_jpeg(rgb, width, height, e, exif_block(e.record, e.parameters, kJpegExifBytes), bytes);
            break;
        case ImageFormat::kWebp:
            ok = encode_webp(rgb, width, height, e, exif_block(e.record, e.parameters, std::size_t{1} << 30),
                             bytes);
            break;
    }
    if (!ok) throw Error(path + ": image encoding failed", kExitIo);
    // Note [atomic file]: a reader sees the whole image or none.
    protocol::write_file_atomically(
        path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    return {path, sha256_hex(bytes.data(), bytes.size()), bytes.size()};
}

}  // namespace dp::runtime
