#pragma once
// The image files `dp-launch compare` reads (Note [compare]): each one's header first, so that a
// size difference is told without decoding, and an image over kMaxComparePixels is refused before
// its pixels take any memory. The image libraries stay out of this header.

#include <cstdint>
#include <filesystem>
#include <string>

#include "cli/compare_command.h"
#include "images/input_image.h"

namespace dp::cli {

// The most pixels compare decodes in one image: 4096 x 4096. SSIM holds about 90 bytes a pixel
// (the two images and eleven planes of doubles), 1.5 GB at this size; a PNG of a few kilobytes
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

// One image file of a run (PNG, JPEG or WebP, read through dp_images as input images are), open
// with its header read.
class RunImage {
  public:
    // Opens `path` without following a symbolic link or blocking, and reads its header, nothing
    // more. Throws InputDataError naming `shown` (default: `path`) when it is not a regular file or
    // no PNG, JPEG or WebP image.
    explicit RunImage(const std::string& path, const std::string& shown = "");

    int width() const { return file_.info().width; }
    int height() const { return file_.info().height; }
    std::string size() const { return std::to_string(width()) + "x" + std::to_string(height()); }
    // Its pixels as 8-bit RGB, as stored (an EXIF orientation is not applied); once.
    // Throws InputDataError naming the file, before allocating anything, when it declares more
    // than kMaxComparePixels pixels, and when it is damaged.
    RgbImage decode();

  private:
    std::string shown_;
    images::ImageFile file_;
};

}  // namespace dp::cli
