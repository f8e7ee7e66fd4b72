#pragma once
// Note [input images]: the images a user hands in (img2img's init image, an inpainting mask) are
// read as diffusers reads them in Python, diffusers.utils.load_image, that is
// PIL.ImageOps.exif_transpose(PIL.Image.open(path)).convert("RGB") (Pillow 13), and resized as
// VaeImageProcessor resizes them (Image.resize with its `resample` filter): byte for byte, so that
// a job gives the pixels the Python pipeline would. The launcher reads each file's header before
// any rank starts (read_image_info), the worker decodes it (decode_image). Formats are told by
// their contents, never by the file name: PNG (libpng), JPEG (libjpeg-turbo), WebP (libwebp).
//
// What PIL makes of each kind, which decode_image follows (tests/unit/test_input_images.cpp holds
// every row to Pillow's own pixels, scripts/golden/golden_images.py):
// - PNG: 8-bit RGB as is; RGBA and grey+alpha lose their alpha (dropped, not composited on any
//   background); palette images (any depth, tRNS or not) take their palette's colours; grey of 1,
//   2 or 4 bits is scaled to 0..255 (bit replication); 16-bit RGB, RGBA and grey+alpha keep each
//   sample's high byte; 16-bit grey (PIL's "I;16") clips at 255 (values over 255 become 255, not
//   scaled); grey R = G = B; gamma, sRGB, ICC and sBIT chunks are ignored; interlaced files too.
// - JPEG: libjpeg-turbo's defaults as PIL uses them (the accurate integer DCT, fancy upsampling,
//   block smoothing); grayscale R = G = B; CMYK and YCCK files as PIL reads them (Adobe's inverted
//   polarity, then PIL's CMYK to RGB: R = (255 - K) - C (255 - K) / 255, rounded as PIL rounds).
//   A truncated or damaged file (libjpeg's "premature end" and corrupt-data warnings) is refused,
//   as PIL refuses a truncated file; so is one of more than 1000 progressive scans (a denial of
//   service PIL does not guard against).
// - WebP: lossy and lossless, alpha dropped; an animated WebP is refused (PIL would take its first
//   frame composited on a transparent canvas): save a still image.
// - Orientation, as exif_transpose reads it: the EXIF Orientation tag (IFD0, first occurrence)
//   of a JPEG's APP1 "Exif" segments (concatenated, as PIL does), a WebP's EXIF chunk or a PNG's
//   eXIf chunk; when there is no such tag, `tiff:Orientation="N"` or `<tiff:Orientation>N` in the
//   XMP (a JPEG's APP1 XMP segment, a WebP's XMP chunk, a PNG's XML:com.adobe.xmp text chunk).
//   Values 2 to 8 flip or rotate the image (5 to 8 swap its width and height); anything else
//   leaves it. EXIF data that is no TIFF structure is refused, as PIL raises on it; but in a
//   JPEG whose JFIF segment gives no resolution PIL has read the EXIF at open and swallowed the
//   error, and the orientation is then ignored, XMP's too, as there. Not read: PNG text chunks
//   named "exif" or "Raw profile type exif" (ImageMagick's), which PIL also reads.
// Every refusal is a protocol::InputDataError naming the file and what is accepted.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dp::images {

struct RgbImage {
    int width = 0, height = 0;
    std::vector<uint8_t> rgb;  // rows top to bottom, R, G, B bytes
};

struct GreyImage {
    int width = 0, height = 0;
    std::vector<uint8_t> grey;  // rows top to bottom, one byte a pixel
};

// The most pixels an input image may declare: 8192 x 8192 (64 MP). Checked from the header,
// before any pixel memory is allocated, so that a small file declaring a huge image (an image
// bomb: a PNG of a few hundred bytes can declare 100000 x 100000) is refused at once. Below
// PIL's own bomb warning (Image.MAX_IMAGE_PIXELS, 89.5 MP; it refuses from twice that), so
// whatever is accepted here PIL opens without a warning; far above what a diffusion model takes
// (1 to 4 MP); decoded, 192 MiB of RGB bytes, 768 MiB as a float32 tensor.
inline constexpr uint64_t kMaxInputPixels = 8192ull * 8192ull;

struct ImageInfo {
    std::string format;         // "png", "jpeg", "webp"
    int width = 0, height = 0;  // as stored: before the EXIF orientation (5 to 8 swap them)
};

// The format (by its magic bytes) and size of the image at `path`, from its header alone. Throws
// InputDataError naming `path` when it is not a regular file (a folder, FIFO, socket or device:
// it is opened without blocking), is empty, is no PNG, JPEG or WebP image or a damaged header,
// declares zero pixels or more than kMaxInputPixels, or is an animated WebP. A missing file is the
// caller's to check first (it is refused too, as a file that cannot be opened).
ImageInfo read_image_info(const std::string& path);

// The image at `path` as 8-bit RGB, exactly as diffusers.utils.load_image gives it (Note [input
// images]). Throws InputDataError naming `path` for everything read_image_info refuses, and for a
// truncated or damaged file.
RgbImage decode_image(const std::string& path);

// Pillow's filters, as VaeImageProcessor's `resample` config names them.
enum class Resample { kNearest, kBilinear, kBicubic, kLanczos };
// "nearest", "linear" or "bilinear", "bicubic", "lanczos" (diffusers' PIL_INTERPOLATION); nullopt
// for any other name.
std::optional<Resample> resample_by_name(const std::string& name);

// image.resize((width, height), filter) of an RGB image, pixel for pixel as Pillow 13 computes it:
// its separable fixed-point resampler for the bilinear, bicubic (a = -0.5) and Lanczos (3 lobes)
// filters (the support widened by the ratio when downscaling, horizontal pass then vertical),
// its affine nearest-neighbour scaling for kNearest; the same size is a copy. Throws
// std::invalid_argument when `width` or `height` is below 1 or `image` is empty or inconsistent.
RgbImage resize(const RgbImage& image, int width, int height, Resample mode = Resample::kLanczos);
// The part of the image Image.resize's `box` names (floats, within the image, possibly of no
// width or height: each output pixel then weighs the pixels about that edge).
struct ResizeBox {
    float x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};
// image.resize((width, height), filter, box): as above, from `box` (kNearest: the whole image only).
RgbImage resize(const RgbImage& image, int width, int height, Resample mode, const ResizeBox& box);

// image.convert("L"): ITU-R 601-2 luma in Pillow's fixed point,
// (19595 R + 38470 G + 7471 B + 0x8000) >> 16. For inpainting masks.
GreyImage to_grey(const RgbImage& image);

// How ImageFile opens its file.
struct OpenRules {
    bool follow_links = true;  // false: a symbolic link is refused (O_NOFOLLOW)
    std::string shown;         // the name in messages; empty: the path
    // The most pixels the header may declare: more is refused before anything is decoded. A
    // caller that reports sizes (compare) raises it and checks its own limit before decode().
    uint64_t max_pixels = kMaxInputPixels;
    // false: decode() gives the pixels as stored, the EXIF orientation not applied, so that the
    // header's size is the image's (compare measures files, not how a viewer shows them).
    bool exif_transpose = true;
};

// One image file, open, its header read: read_image_info and decode_image in two steps, for a
// caller that checks the size before it decodes (dp-launch compare).
class ImageFile {
  public:
    // Opens `path` without blocking (a FIFO is refused, not waited on) and reads its header.
    // Throws InputDataError as read_image_info does.
    explicit ImageFile(const std::string& path, const OpenRules& rules = {});
    ~ImageFile();
    ImageFile(const ImageFile&) = delete;
    ImageFile& operator=(const ImageFile&) = delete;

    const ImageInfo& info() const { return info_; }
    // Its pixels, as decode_image gives them; once (std::logic_error the second time).
    RgbImage decode();

  private:
    struct State;
    std::unique_ptr<State> state_;
    ImageInfo info_;
};

}  // namespace dp::images
