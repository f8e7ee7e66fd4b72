#pragma once
// The PNG files `dp-launch compare` reads (Note [compare]): each one's header first, so that a
// size difference is told without decoding, and an image over kMaxComparePixels is refused before
// its pixels take any memory. libpng stays out of this header.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/compare_command.h"

namespace dp::cli {

// The most pixels compare decodes in one image: 4096 x 4096. SSIM holds about 90 bytes a pixel
// (the two images and eleven planes of doubles), 1.5 GB at this size; a PNG of a few megabytes
// can declare 30000 x 30000 (2.7 GB of RGB alone).
inline constexpr uint64_t kMaxComparePixels = 4096ull * 4096ull;

// Where the image that prompt `index`'s record in run `run`'s manifest names as `file` is: `file`
// resolved in `real_run` (the run folder's std::filesystem::canonical path), when it is a regular
// file there, symbolic links followed; empty when nothing is there. Throws InputDataError naming the
// manifest, the prompt and `file` when `file` is absolute or has a "..", leads outside the folder
// (through a symbolic link), or is not a regular file (a FIFO, which would block a reader, a
// device or a folder): nothing is opened then.
std::string image_in_run(const std::string& run, const std::filesystem::path& real_run, int64_t index,
                         const std::string& file);

// One PNG file, open with its header read.
class PngFile {
  public:
    // Opens `path` without following a symbolic link or blocking, and reads its header (libpng's
    // IHDR), nothing more. Throws InputDataError naming `shown` (default: `path`) when it is not a
    // regular file or no PNG libpng reads.
    explicit PngFile(const std::string& path, const std::string& shown = "");
    ~PngFile();
    PngFile(const PngFile&) = delete;
    PngFile& operator=(const PngFile&) = delete;

    int width() const { return width_; }
    int height() const { return height_; }
    std::string size() const { return std::to_string(width_) + "x" + std::to_string(height_); }
    // Its pixels as 8-bit RGB; once. Throws InputDataError naming the file, before allocating
    // anything, when it declares more than kMaxComparePixels pixels, and when it is damaged.
    RgbImage decode();

  private:
    struct State;
    std::string shown_;
    std::unique_ptr<State> state_;
    int width_ = 0, height_ = 0;
};

}  // namespace dp::cli
