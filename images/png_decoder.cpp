// PNG through libpng's low-level API: its simplified API composites alpha and gamma-converts
// 16-bit samples, PIL does neither (Note [input images]).

#include <png.h>

#include <csetjmp>
#include <cstring>
#include <vector>

#include "images/decoders.h"
#include "protocol/errors.h"

namespace dp::images::detail {

namespace {

using protocol::InputDataError;

// libpng's error_ptr: where png_fail leaves libpng's message before it jumps back.
struct PngMessage {
    char text[200] = "";
};

[[noreturn]] void png_fail(png_structp png, png_const_charp message) {
    auto* out = static_cast<PngMessage*>(png_get_error_ptr(png));
    std::strncpy(out->text, message, sizeof out->text - 1);
    std::longjmp(png_jmpbuf(png), 1);
}

// Warnings (a bad ancillary chunk, which libpng skips) are not errors: PIL reads past them too.
void png_ignore(png_structp, png_const_charp) {}

// eXIf chunks as PIL reads them: whatever they hold (libpng drops those that do not start with
// II or MM), the last one.
int png_exif_chunk(png_structp png, png_unknown_chunkp chunk) {
    if (std::memcmp(chunk->name, "eXIf", 4) != 0) return 0;  // libpng's default handling
    try {
        static_cast<OrientationTags*>(png_get_user_chunk_ptr(png))->exif =
            std::string(reinterpret_cast<const char*>(chunk->data), chunk->size);
    } catch (...) {
        return -1;  // out of memory: libpng's error
    }
    return 1;
}

// libpng reports errors by longjmp to png_jmpbuf: the functions that call into it after their
// setjmp hold nothing with a destructor, and return false on an error.
class PngDecoder final : public Decoder {
  public:
    explicit PngDecoder(const std::string& shown) : shown_(shown) {
        png_ = png_create_read_struct(PNG_LIBPNG_VER_STRING, &message_, png_fail, png_ignore);
        if (png_ != nullptr) info_ = png_create_info_struct(png_);
    }
    ~PngDecoder() override { png_destroy_read_struct(&png_, &info_, nullptr); }
    PngDecoder(const PngDecoder&) = delete;
    PngDecoder& operator=(const PngDecoder&) = delete;

    // Reads the header of `file`; throws InputDataError naming the file.
    void open(std::FILE* file);
    int width() const override { return static_cast<int>(width_); }
    int height() const override { return static_cast<int>(height_); }
    RgbImage decode() override;
    OrientationTags orientation_tags() const override;

  private:
    bool read_header(std::FILE* file);
    bool read_pixels(png_bytepp rows, std::size_t row_bytes);
    bool read_end();

    std::string shown_;
    PngMessage message_;
    png_structp png_ = nullptr;
    png_infop info_ = nullptr;
    png_uint_32 width_ = 0, height_ = 0;
    int bit_depth_ = 0, color_type_ = 0;
    OrientationTags tags_;  // the eXIf chunk's, set while libpng reads
};

void PngDecoder::open(std::FILE* file) {
    if (info_ == nullptr) throw InputDataError(shown_ + ": out of memory for a PNG reader");
    if (!read_header(file))
        throw InputDataError(shown_ + ": not a PNG file libpng reads (" + message_.text +
                             "); an input image must be a PNG, JPEG or WebP file");
}

bool PngDecoder::read_header(std::FILE* file) {
    if (setjmp(png_jmpbuf(png_))) return false;
    png_init_io(png_, file);
    // PNG's own bound on a side (2^31 - 1) rather than libpng's default of 1000000: the pixel
    // count decides (ImageFile), before any row is allocated.
    png_set_user_limits(png_, 0x7fffffff, 0x7fffffff);
    static const png_byte kExif[] = "eXIf";
    png_set_keep_unknown_chunks(png_, PNG_HANDLE_CHUNK_ALWAYS, kExif, 1);
    png_set_read_user_chunk_fn(png_, &tags_, png_exif_chunk);
    png_read_info(png_, info_);
    png_get_IHDR(png_, info_, &width_, &height_, &bit_depth_, &color_type_, nullptr, nullptr, nullptr);
    return true;
}

// 16-bit grey ("I;16" in PIL) is read as it is; everything else as 8-bit RGB by libpng's own
// transformations: the high byte of 16-bit samples, palettes looked up (tRNS dropped with the
// alpha), 1, 2 and 4-bit grey scaled, alpha stripped, grey replicated.
bool PngDecoder::read_pixels(png_bytepp rows, std::size_t row_bytes) {
    if (setjmp(png_jmpbuf(png_))) return false;
    if (bit_depth_ != 16 || color_type_ != PNG_COLOR_TYPE_GRAY) {
        png_set_strip_16(png_);
        if (color_type_ == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png_);
        if (color_type_ == PNG_COLOR_TYPE_GRAY && bit_depth_ < 8) png_set_expand_gray_1_2_4_to_8(png_);
        png_set_strip_alpha(png_);
        png_set_gray_to_rgb(png_);
    }
    png_set_interlace_handling(png_);
    png_read_update_info(png_, info_);
    if (png_get_rowbytes(png_, info_) != row_bytes) png_error(png_, "unexpected row layout");
    png_read_image(png_, rows);
    return true;
}

bool PngDecoder::read_end() {
    if (setjmp(png_jmpbuf(png_))) return false;
    png_read_end(png_, info_);
    return true;
}

RgbImage PngDecoder::decode() {
    const bool grey16 = bit_depth_ == 16 && color_type_ == PNG_COLOR_TYPE_GRAY;
    const std::size_t w = width_, h = height_;
    RgbImage out{static_cast<int>(w), static_cast<int>(h), std::vector<uint8_t>(w * h * 3)};
    std::vector<uint8_t> samples(grey16 ? w * h * 2 : 0);
    const std::size_t row_bytes = grey16 ? w * 2 : w * 3;
    std::vector<png_bytep> rows(h);
    for (std::size_t y = 0; y < h; ++y) rows[y] = (grey16 ? samples.data() : out.rgb.data()) + y * row_bytes;
    if (!read_pixels(rows.data(), row_bytes))
        throw InputDataError(shown_ + ": a damaged or truncated PNG file (" + message_.text + ")");
    // The chunks after the pixels (an eXIf chunk may be there). A file cut after its last pixel
    // data is read as PIL reads it: whole.
    read_end();
    if (grey16) {
        // PIL's I;16 to RGB: values over 255 become 255.
        for (std::size_t i = 0; i < w * h; ++i) {
            const uint8_t v = samples[2 * i] != 0 ? 255 : samples[2 * i + 1];
            std::memset(&out.rgb[3 * i], v, 3);
        }
    }
    return out;
}

OrientationTags PngDecoder::orientation_tags() const {
    OrientationTags tags = tags_;
    png_textp text = nullptr;
    const int count = png_get_text(png_, info_, &text, nullptr);
    for (int i = 0; i < count; ++i)  // the last one, as PIL keeps it
        if (std::strcmp(text[i].key, "XML:com.adobe.xmp") == 0 && text[i].text != nullptr)
            tags.xmp = text[i].text;
    return tags;
}

}  // namespace

std::unique_ptr<Decoder> open_png(std::FILE* file, const std::string& shown) {
    return opened<PngDecoder>(file, shown);
}

}  // namespace dp::images::detail
