#pragma once
// The PNG files `dp-launch compare` reads (Note [compare]): each one's header first, so that a
// size difference is told without decoding, and an image over kMaxComparePixels is refused before
// its pixels take any memory. libpng stays out of this header.

#include <cstdint>
#include <memory>
#include <string>

#include "cli/compare_command.h"

namespace dp::cli {

// The most pixels compare decodes in one image: 4096 x 4096. SSIM holds about 90 bytes a pixel
// (the two images and eleven planes of doubles), 1.5 GB at this size; a PNG of a few megabytes
// can declare 30000 x 30000 (2.7 GB of RGB alone).
inline constexpr uint64_t kMaxComparePixels = 4096ull * 4096ull;

// One PNG file, open with its header read.
class PngFile {
  public:
    // Throws InputDataError naming `path` when it is no PNG libpng reads, or declares more than
    // kMaxComparePixels pixels.
    explicit PngFile(const std::string& path);
    ~PngFile();
    PngFile(const PngFile&) = delete;
    PngFile& operator=(const PngFile&) = delete;

    int width() const { return width_; }
    int height() const { return height_; }
    std::string size() const { return std::to_string(width_) + "x" + std::to_string(height_); }
    // Its pixels as 8-bit RGB; once. Throws InputDataError naming the file when it is damaged.
    RgbImage decode();

  private:
    struct State;
    std::string path_;
    std::unique_ptr<State> state_;
    int width_ = 0, height_ = 0;
};

}  // namespace dp::cli
