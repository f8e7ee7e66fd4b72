#pragma once
// Writing finished images: PNG through libpng, JPEG through libjpeg-turbo, WebP through libwebp, to
// a temporary name in the target folder and then renamed, so a crash never leaves a half-written
// file under a final name. Each carries how it was made where its format allows (Note [image
// metadata]). Light header.

#include <cstdint>
#include <string>

namespace dp::runtime {

struct WrittenImage {
    std::string path;
    std::string sha256;  // of the file's bytes, lowercase hex
    std::size_t bytes = 0;
};

enum class ImageFormat { kPng, kJpeg, kWebp };

// "png", "jpeg" or "webp" (the job file's image_format); throws Error (exit code 65) otherwise.
ImageFormat image_format_named(const std::string& name);

struct ImageEncoding {
    ImageFormat format = ImageFormat::kPng;
    int quality = 90;  // JPEG and WebP, 1 to 100; WebP at 100 is lossless
    // Note [image metadata]: AUTOMATIC1111's "parameters" text (protocol/image_parameters.h) and the
    // image's record as JSON. PNG: text chunks "parameters" and "dp-launch" (iTXt, UTF-8, where the
    // text is not ASCII). JPEG and WebP: EXIF, the parameters as UserComment (as A1111 writes them)
    // and the record as ImageDescription (JSON with \u escapes, so ASCII); in a JPEG, whose EXIF
    // segment holds at most 64 KiB, the record is left out when both do not fit, and then the
    // parameters are cut.
    std::string parameters;
    std::string record;
};

// Encodes `rgb` (height x width x 3 bytes, row-major) as 8-bit RGB in `encoding`'s format. The
// encoding is deterministic: no time, fixed settings, so equal pixels and text give equal files.
// Throws dp::runtime::Error with exit code 74 (I/O) when the file cannot be written.
WrittenImage write_image_atomically(const std::string& path, const uint8_t* rgb, int width, int height,
                                    const ImageEncoding& encoding = {});

// The SHA-256 of `size` bytes, lowercase hex.
std::string sha256_hex(const void* data, std::size_t size);

// EXIF (a big-endian TIFF structure, without JPEG's "Exif\0\0" prefix): `description` (ASCII) as
// IFD0's ImageDescription unless empty, `comment` as the Exif IFD's UserComment (UTF-16BE after
// the "UNICODE\0" prefix, as AUTOMATIC1111 writes its parameters). At most `max_bytes`: the
// description is left out, then the comment cut at a character, to fit.
std::string exif_block(const std::string& description, const std::string& comment, std::size_t max_bytes);

}  // namespace dp::runtime
