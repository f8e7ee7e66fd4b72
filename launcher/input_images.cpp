#include "launcher/input_images.h"

#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <tuple>

#include "images/input_image.h"
#include "launcher/errors.h"
#include "launcher/prompt_file.h"
#include "protocol/errors.h"
#include "strategies/sha256.h"

namespace dp::launcher {

std::string relative_to(const std::string& path, const std::string& base) {
    if (base.empty() || path.empty() || path.front() == '/') return path;
    return base + (base.back() == '/' ? "" : "/") + path;
}

std::string prompt_file_folder(const std::string& prompts, bool from_texts) {
    if (from_texts || prompts == "-" || prompts.empty()) return {};
    const std::size_t slash = prompts.rfind('/');
    return slash == std::string::npos ? std::string() : prompts.substr(0, slash + 1);
}

const InputImages::File& InputImages::file(const std::string& path) {
    const auto it = files_.find(path);
    if (it != files_.end()) return it->second;
    File f;
    const std::string shown = utf8_for_display(path.substr(0, 300));
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        f.missing = errno == ENOENT || errno == ENOTDIR;
        f.problem = errno_message(shown + ": cannot read the image");
        return files_.emplace(path, std::move(f)).first->second;
    }
    try {
        char resolved[PATH_MAX];
        f.image.path = ::realpath(path.c_str(), resolved) ? std::string(resolved) : path;
        const images::RgbImage pixels = images::decode_image(f.image.path);  // whole: truncation shows
        f.image.width = pixels.width;
        f.image.height = pixels.height;
        f.image.sha256 = strategies::file_sha256(f.image.path);
    } catch (const protocol::Error& e) {
        f.problem = utf8_for_display(e.what());
    } catch (const std::exception& e) {
        f.problem = shown + ": " + utf8_for_display(e.what());
    }
    return files_.emplace(path, std::move(f)).first->second;
}

std::string InputImages::problem(const protocol::InputImage& image, const std::string& base, bool* missing) {
    if (image.empty()) return {};
    const File& f = file(relative_to(image.path, base));
    if (missing) *missing = f.missing;
    if (!f.problem.empty()) return f.problem;
    if (!image.sha256.empty() && image.sha256 != f.image.sha256)
        return utf8_for_display(image.path) + ": its SHA-256 is " + f.image.sha256 + ", not the " +
               image.sha256 + " the line gives (the file changed?)";
    return {};
}

void InputImages::check(const protocol::InputImage& image, const std::string& base,
                        const std::string& source) {
    bool missing = false;
    const std::string why = problem(image, base, &missing);
    if (!why.empty())
        throw protocol::Error(source + " " + why,
                              missing ? protocol::kExitNoInput : protocol::kExitInputData);
}

void InputImages::resolve(protocol::CallValues& values, const std::string& base) {
    for (const char* row : kImageRows) {
        const protocol::CallValue* v = values.find(row);
        if (!v || std::get<protocol::InputImage>(*v).empty()) continue;
        values.set(row, resolved(std::get<protocol::InputImage>(*v), base));
    }
}

const protocol::InputImage& InputImages::resolved(const protocol::InputImage& image,
                                                  const std::string& base) {
    return file(relative_to(image.path, base)).image;
}

std::string InputImages::line_problem(const PromptRecord& p, const JobOptions& job,
                                      const strategies::ModelInfo& model, const std::string& folder,
                                      int64_t& missing_images) {
    for (const char* row : kImageRows) {
        if (!p.arguments.has(row)) continue;
        bool missing = false;
        if (std::string why = problem(p.arguments.image(row), folder, &missing); !why.empty()) {
            missing_images += missing;
            return "key '" + std::string(row) + "': " + why;
        }
    }
    const bool own = p.arguments.has("image");
    const protocol::InputImage& given = own ? p.arguments.image("image") : job.arguments.image("image");
    if (given.empty()) {  // a strength alone changes nothing, as a skip-layer setting without layers
        const bool own_mask = p.arguments.has("mask_image") && !p.arguments.image("mask_image").empty();
        if (own_mask || !job.arguments.image("mask_image").empty())
            return std::string(own_mask ? "key 'mask_image'" : "--mask-image") +
                   ": a mask of the image to edit, and the line has no \"image\" (nor does --image)";
        return {};
    }
    const protocol::InputImage& input = own ? resolved(given, folder) : given;
    const int64_t m = model.sizes.multiple();
    for (const auto& [key, set, pixels] : {std::tuple{"width", p.width || job.width, input.width},
                                           std::tuple{"height", p.height || job.height, input.height}}) {
        if (set) continue;
        if (const std::string why = model.sizes.check(pixels / m * m); !why.empty())
            return "key 'image': its " + std::string(key) + " of " + std::to_string(pixels) +
                   " pixels makes an image " + std::to_string(pixels / m * m) + " wide or high: " + why +
                   " (give \"" + key + "\" for the output)";
    }
    return {};
}

}  // namespace dp::launcher
