#include "cli/compare_images.h"

#include <fcntl.h>
#include <png.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "launcher/errors.h"
#include "launcher/prompt_file.h"

namespace dp::cli {

using launcher::InputDataError;
namespace fs = std::filesystem;

namespace {

// Whether `name` is relative and has no "..": a name that cannot climb out of a folder by itself.
bool is_plain_name(const fs::path& name) {
    if (name.empty() || name.is_absolute()) return false;
    return std::none_of(name.begin(), name.end(), [](const fs::path& part) { return part == ".."; });
}

// Whether `path` is inside `folder` (both canonical).
bool is_inside(const fs::path& path, const fs::path& folder) {
    const auto [f, p] = std::mismatch(folder.begin(), folder.end(), path.begin(), path.end());
    return f == folder.end() && p != path.end();
}

// `path` open for reading as a FILE: a regular file, never a symbolic link, and a FIFO is not
// waited on (O_NONBLOCK) but refused. Throws InputDataError naming `shown`.
FILE* open_regular(const std::string& path, const std::string& shown) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) throw InputDataError(launcher::errno_message(shown + ": cannot open"));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        throw InputDataError(shown + ": not a regular file");
    }
    ::fcntl(fd, F_SETFL, 0);  // blocking reads again (a regular file's never wait anyway)
    FILE* file = ::fdopen(fd, "rb");
    if (file == nullptr) {
        ::close(fd);
        throw InputDataError(launcher::errno_message(shown + ": cannot open"));
    }
    return file;
}

}  // namespace

std::string image_in_run(const std::string& run, const fs::path& real_run, int64_t index,
                         const std::string& file) {
    const auto refuse = [&](const std::string& why) {
        throw InputDataError(launcher::utf8_for_display(run + "/manifest.jsonl") + ": prompt " +
                             std::to_string(index) + "'s file \"" + launcher::utf8_for_display(file) + "\" " +
                             why + ": an image must be a regular file inside its run's folder");
    };
    if (file.find('\0') != std::string::npos || !is_plain_name(file))
        refuse("is not a name inside " + launcher::utf8_for_display(run));
    std::error_code ec;
    const fs::path real = fs::canonical(real_run / file, ec);
    if (ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory) return {};
    if (ec) refuse("cannot be resolved (" + ec.message() + ")");
    if (!is_inside(real, real_run)) refuse("leads outside " + launcher::utf8_for_display(run));
    struct stat st {};
    if (::stat(real.c_str(), &st) != 0) return {};
    if (!S_ISREG(st.st_mode)) refuse("is not a regular file (a folder, FIFO, socket or device)");
    return real.string();
}

struct PngFile::State {
    png_image image{};
    FILE* file = nullptr;
    bool decoded = false;
    ~State() {
        png_image_free(&image);
        if (file != nullptr) std::fclose(file);
    }
};

PngFile::PngFile(const std::string& path, const std::string& shown_as)
    : shown_(launcher::utf8_for_display(shown_as.empty() ? path : shown_as)),
      state_(std::make_unique<State>()) {
    png_image& image = state_->image;
    image.version = PNG_IMAGE_VERSION;
    const std::string& shown = shown_;
    state_->file = open_regular(path, shown);
    if (!png_image_begin_read_from_stdio(&image, state_->file))
        throw InputDataError(shown + ": not a PNG file dp-launch can read (" +
                             launcher::utf8_for_display(image.message) + ")");
    // libpng refuses 0 and over 2^31-1 a side (PNG's bounds; by default over 1000000): an int holds it.
    if (image.width == 0 || image.height == 0 || image.width > INT32_MAX || image.height > INT32_MAX)
        throw InputDataError(shown + ": " + std::to_string(image.width) + "x" + std::to_string(image.height) +
                             " pixels (a PNG has 1 to 2147483647 a side)");
    width_ = static_cast<int>(image.width);
    height_ = static_cast<int>(image.height);
}

PngFile::~PngFile() = default;

RgbImage PngFile::decode() {
    if (state_->decoded) throw std::logic_error("PngFile::decode called twice");
    state_->decoded = true;
    png_image& image = state_->image;
    if (static_cast<uint64_t>(width_) * static_cast<uint64_t>(height_) > kMaxComparePixels)
        throw InputDataError(shown_ + ": " + size() + " pixels: compare decodes images of at most " +
                             std::to_string(kMaxComparePixels) + " pixels (4096x4096)");
    image.format = PNG_FORMAT_RGB;
    RgbImage out;
    out.width = width_;
    out.height = height_;
    out.rgb.resize(PNG_IMAGE_SIZE(image));
    if (!png_image_finish_read(&image, nullptr, out.rgb.data(), 0, nullptr))
        throw InputDataError(shown_ + ": a damaged PNG file (" + launcher::utf8_for_display(image.message) +
                             ")");
    return out;
}

RgbImage read_rgb_png(const std::string& path) { return PngFile(path).decode(); }

}  // namespace dp::cli
