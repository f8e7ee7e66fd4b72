#pragma once
// The three decoders behind ImageFile (images/input_image.h), and what they share. Internal to
// images/: the C libraries' headers stay in the decoders' sources.

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "images/input_image.h"

namespace dp::images::detail {

// What exif_transpose reads besides the pixels: the EXIF bytes (a TIFF structure, with or without
// an "Exif\0\0" prefix) and the XMP packet, when the file has them.
struct OrientationTags {
    std::optional<std::string> exif;
    std::optional<std::string> xmp;
    // EXIF that is no TIFF structure is ignored, XMP too, rather than refused: PIL's JPEG plugin
    // reads the EXIF once at open (for a resolution its JFIF segment lacks) and swallows the error,
    // and exif_transpose then finds nothing.
    bool bad_exif_ignored = false;
};

// A decoder of one format over an open file, its header read by the factory below.
class Decoder {
  public:
    virtual ~Decoder() = default;
    virtual int width() const = 0;
    virtual int height() const = 0;
    // The pixels as stored (no orientation applied), 8-bit RGB as PIL converts them.
    virtual RgbImage decode() = 0;
    // The orientation metadata; complete once decode() has run (a PNG's may follow its pixels).
    virtual OrientationTags orientation_tags() const = 0;
};

// Each reads the header of `file` (positioned at its start; borrowed, it must outlive the
// decoder), and nothing of the pixels, and throws InputDataError naming `shown` when it is no
// image of its format. The size is the caller's to check before decode().
std::unique_ptr<Decoder> open_png(std::FILE* file, const std::string& shown);
std::unique_ptr<Decoder> open_jpeg(std::FILE* file, const std::string& shown);
std::unique_ptr<Decoder> open_webp(std::FILE* file, const std::string& shown);

// A decoder of type D (constructed from `shown`) that has read `file`'s header with D::open.
template <class D>
std::unique_ptr<Decoder> opened(std::FILE* file, const std::string& shown) {
    auto decoder = std::make_unique<D>(shown);
    decoder->open(file);
    return decoder;
}

// The orientation exif_transpose applies (1 to 8; 1 leaves the image) for these tags. Throws
// InputDataError naming `shown` when the EXIF bytes are no TIFF structure (unless ignored).
int orientation_of(const OrientationTags& tags, const std::string& shown);
// `image` flipped or rotated as PIL's Image.transpose does for EXIF orientation `orientation`.
RgbImage oriented(const RgbImage& image, int orientation);

}  // namespace dp::images::detail
