#include "cli/compare_images.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>

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

namespace {

// Any size from the header (compare reports a size difference without decoding), its own limit
// before the pixels are decoded; the pixels as stored, so that the header's size is theirs.
images::OpenRules run_image_rules(const std::string& shown) {
    images::OpenRules rules;
    rules.follow_links = false;
    rules.shown = shown;
    rules.max_pixels = UINT64_MAX;
    rules.exif_transpose = false;
    return rules;
}

}  // namespace

RunImage::RunImage(const std::string& path, const std::string& shown)
    : shown_(launcher::utf8_for_display(shown.empty() ? path : shown)),
      file_(path, run_image_rules(shown_)) {}

RgbImage RunImage::decode() {
    if (static_cast<uint64_t>(width()) * static_cast<uint64_t>(height()) > kMaxComparePixels)
        throw InputDataError(shown_ + ": " + size() + " pixels: compare decodes images of at most " +
                             std::to_string(kMaxComparePixels) + " pixels (4096x4096)");
    return file_.decode();
}

RgbImage read_rgb_image(const std::string& path) { return RunImage(path).decode(); }

}  // namespace dp::cli
