#include "cli/compare_images.h"

#include <png.h>

#include <cstdio>

#include "launcher/errors.h"
#include "launcher/prompt_file.h"

namespace dp::cli {

using launcher::InputDataError;

struct PngFile::State {
    png_image image{};
    bool decoded = false;
    ~State() { png_image_free(&image); }
};

PngFile::PngFile(const std::string& path) : path_(path), state_(std::make_unique<State>()) {
    png_image& image = state_->image;
    image.version = PNG_IMAGE_VERSION;
    const std::string shown = launcher::utf8_for_display(path);
    if (!png_image_begin_read_from_file(&image, path.c_str()))
        throw InputDataError(shown + ": not a PNG file dp-launch can read (" +
                             launcher::utf8_for_display(image.message) + ")");
    const uint64_t pixels = static_cast<uint64_t>(image.width) * image.height;
    if (pixels == 0 || pixels > kMaxComparePixels)
        throw InputDataError(shown + ": " + std::to_string(image.width) + "x" + std::to_string(image.height) +
                             " pixels: compare reads images of 1 to " + std::to_string(kMaxComparePixels) +
                             " pixels (4096x4096)");
    width_ = static_cast<int>(image.width);
    height_ = static_cast<int>(image.height);
}

PngFile::~PngFile() = default;

RgbImage PngFile::decode() {
    if (state_->decoded) throw std::logic_error("PngFile::decode called twice");
    state_->decoded = true;
    png_image& image = state_->image;
    image.format = PNG_FORMAT_RGB;
    RgbImage out;
    out.width = width_;
    out.height = height_;
    out.rgb.resize(PNG_IMAGE_SIZE(image));
    if (!png_image_finish_read(&image, nullptr, out.rgb.data(), 0, nullptr))
        throw InputDataError(launcher::utf8_for_display(path_) + ": a damaged PNG file (" +
                             launcher::utf8_for_display(image.message) + ")");
    return out;
}

RgbImage read_rgb_png(const std::string& path) { return PngFile(path).decode(); }

}  // namespace dp::cli
