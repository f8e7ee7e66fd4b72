// JPEG through libjpeg-turbo, with the defaults PIL leaves it (Note [input images]).

#include <cstdio>  // before jpeglib.h, which uses FILE
// clang-format off
#include <jpeglib.h>
#include <jerror.h>
// clang-format on

#include <csetjmp>
#include <cstring>
#include <vector>

#include "images/decoders.h"
#include "protocol/errors.h"

namespace dp::images::detail {

namespace {

using protocol::InputDataError;

// The most scans a progressive file may have: each is a pass over the whole image, and a small
// file can hold tens of thousands (libjpeg-turbo's advice for untrusted input; djpeg -maxscans).
// Real files have about ten.
constexpr int kMaxScans = 1000;  // fail_with's message names it

struct JpegErrors {
    jpeg_error_mgr mgr{};
    std::jmp_buf jump{};
    char text[JMSG_LENGTH_MAX] = "";
};

[[noreturn]] void jpeg_fail(j_common_ptr cinfo) {
    auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
    (*cinfo->err->format_message)(cinfo, errors->text);
    std::longjmp(errors->jump, 1);
}

// Warnings that the data is cut short or corrupt end the decoding (PIL refuses a truncated file;
// the pixels of a corrupt one are garbage); the others (an unknown JFIF revision, extraneous
// bytes between markers) are ignored as PIL ignores them. Trace messages are dropped.
void jpeg_message(j_common_ptr cinfo, int level) {
    if (level >= 0) return;
    switch (cinfo->err->msg_code) {
        case JWRN_JPEG_EOF:
        case JWRN_HIT_MARKER:
        case JWRN_HUFF_BAD_CODE:
        case JWRN_ARITH_BAD_CODE:
        case JWRN_MUST_RESYNC:
            jpeg_fail(cinfo);
        default:
            cinfo->err->num_warnings++;
    }
}

[[noreturn]] void fail_with(JpegErrors* errors, const char* what) {
    std::snprintf(errors->text, sizeof errors->text, "%s", what);
    std::longjmp(errors->jump, 1);
}

void jpeg_progress(j_common_ptr cinfo) {
    if (!cinfo->is_decompressor) return;
    if (reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number <= kMaxScans) return;
    fail_with(reinterpret_cast<JpegErrors*>(cinfo->err), "more than 1000 progressive scans");
}

// PIL reads a 4-component JPEG as Adobe's inverted CMYK ("CMYK;I"), then converts it to RGB in
// fixed point: (255 - K) - C (255 - K) / 255, the division rounded as its MULDIV255 rounds.
void cmyk_to_rgb(const uint8_t* cmyk, uint8_t* rgb, std::size_t pixels) {
    for (std::size_t i = 0; i < pixels; ++i, cmyk += 4, rgb += 3) {
        const int nk = cmyk[3];  // 255 - K, K being the inverted sample
        for (int c = 0; c < 3; ++c) {
            const int tmp = (255 - cmyk[c]) * nk + 128;
            rgb[c] = static_cast<uint8_t>(nk - (((tmp >> 8) + tmp) >> 8));
        }
    }
}

// libjpeg reports errors by longjmp to errors_.jump: the functions that call into it after their
// setjmp hold nothing with a destructor, and return false on an error.
class JpegDecoder final : public Decoder {
  public:
    explicit JpegDecoder(const std::string& shown) : shown_(shown) {
        cinfo_.err = jpeg_std_error(&errors_.mgr);
        errors_.mgr.error_exit = jpeg_fail;
        errors_.mgr.emit_message = jpeg_message;
        progress_.progress_monitor = jpeg_progress;
    }
    ~JpegDecoder() override {
        if (created_) jpeg_destroy_decompress(&cinfo_);
    }
    JpegDecoder(const JpegDecoder&) = delete;
    JpegDecoder& operator=(const JpegDecoder&) = delete;

    // Reads the header of `file`; throws InputDataError naming the file.
    void open(std::FILE* file);
    int width() const override { return static_cast<int>(cinfo_.image_width); }
    int height() const override { return static_cast<int>(cinfo_.image_height); }
    RgbImage decode() override;
    OrientationTags orientation_tags() const override { return tags_; }

  private:
    bool read_header(std::FILE* file);
    bool read_pixels(uint8_t* rgb, uint8_t* row);
    void collect_tags();

    std::string shown_;
    jpeg_decompress_struct cinfo_{};
    JpegErrors errors_;
    jpeg_progress_mgr progress_{};
    bool created_ = false;
    OrientationTags tags_;
};

void JpegDecoder::open(std::FILE* file) {
    if (!read_header(file))
        throw InputDataError(shown_ + ": not a JPEG file libjpeg reads (" + errors_.text +
                             "); an input image must be a PNG, JPEG or WebP file");
    if (cinfo_.num_components != 1 && cinfo_.num_components != 3 && cinfo_.num_components != 4)
        throw InputDataError(shown_ + ": a JPEG of " + std::to_string(cinfo_.num_components) +
                             " components; grey (1), colour (3) and CMYK (4) JPEGs are read");
    collect_tags();
}

bool JpegDecoder::read_header(std::FILE* file) {
    if (setjmp(errors_.jump)) return false;
    jpeg_create_decompress(&cinfo_);
    created_ = true;
    cinfo_.progress = &progress_;
    jpeg_stdio_src(&cinfo_, file);
    jpeg_save_markers(&cinfo_, JPEG_APP0 + 1, 0xffff);  // EXIF and XMP
    jpeg_read_header(&cinfo_, TRUE);
    return true;
}

// PIL's output colour space follows the number of components: grey, RGB (libjpeg converting
// YCbCr), CMYK (libjpeg converting YCCK).
bool JpegDecoder::read_pixels(uint8_t* rgb, uint8_t* row) {
    if (setjmp(errors_.jump)) return false;
    const int components = cinfo_.num_components;
    cinfo_.out_color_space = components == 1 ? JCS_GRAYSCALE : components == 3 ? JCS_RGB : JCS_CMYK;
    jpeg_start_decompress(&cinfo_);
    const std::size_t w = cinfo_.output_width;
    if (cinfo_.output_width != cinfo_.image_width || cinfo_.output_height != cinfo_.image_height ||
        cinfo_.output_components != components) {
        fail_with(&errors_, "unexpected output layout");
    }
    while (cinfo_.output_scanline < cinfo_.output_height) {
        uint8_t* out = rgb + cinfo_.output_scanline * w * 3;
        JSAMPROW line = components == 3 ? out : row;
        if (jpeg_read_scanlines(&cinfo_, &line, 1) != 1) fail_with(&errors_, "no scanline read");
        if (components == 1)
            for (std::size_t x = 0; x < w; ++x) std::memset(out + 3 * x, row[x], 3);
        else if (components == 4)
            cmyk_to_rgb(row, out, w);
    }
    jpeg_finish_decompress(&cinfo_);
    return true;
}

RgbImage JpegDecoder::decode() {
    const std::size_t w = cinfo_.image_width, h = cinfo_.image_height;
    RgbImage out{static_cast<int>(w), static_cast<int>(h), std::vector<uint8_t>(w * h * 3)};
    std::vector<uint8_t> row(w * 4);
    if (!read_pixels(out.rgb.data(), row.data()))
        throw InputDataError(shown_ + ": a damaged or truncated JPEG file (" + errors_.text + ")");
    return out;
}

// PIL's APP1 handling: "Exif\0\0" segments concatenated (the later ones without their prefix),
// the last XMP segment from after its name.
void JpegDecoder::collect_tags() {
    static const char kExif[] = "Exif\0";                       // with the string's own NUL: 6 bytes
    static const char kXmp[] = "http://ns.adobe.com/xap/1.0/";  // and its NUL: 29 bytes
    for (jpeg_saved_marker_ptr m = cinfo_.marker_list; m != nullptr; m = m->next) {
        if (m->marker != JPEG_APP0 + 1) continue;
        const std::string data(reinterpret_cast<const char*>(m->data), m->data_length);
        if (data.compare(0, 6, kExif, 6) == 0) {
            if (tags_.exif)
                *tags_.exif += data.substr(6);
            else
                tags_.exif = data;
        } else if (data.compare(0, sizeof kXmp, kXmp, sizeof kXmp) == 0) {
            tags_.xmp = data.substr(sizeof kXmp);
        }
    }
    // PIL reads the EXIF at open for the resolution, unless the JFIF segment gives it (in dots an
    // inch or a centimetre), and swallows the error of EXIF it cannot read (OrientationTags).
    tags_.bad_exif_ignored =
        !(cinfo_.saw_JFIF_marker && (cinfo_.density_unit == 1 || cinfo_.density_unit == 2));
}

}  // namespace

std::unique_ptr<Decoder> open_jpeg(std::FILE* file, const std::string& shown) {
    return opened<JpegDecoder>(file, shown);
}

}  // namespace dp::images::detail
