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
#include "strategies/family.h"
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
    for (const protocol::InputImage& picture : image.pictures()) {  // Note [several input images]
        const File& f = file(relative_to(picture.path, base));
        if (missing) *missing = f.missing;
        if (!f.problem.empty()) return f.problem;
        if (!picture.sha256.empty() && picture.sha256 != f.image.sha256)
            return utf8_for_display(picture.path) + ": its SHA-256 is " + f.image.sha256 + ", not the " +
                   picture.sha256 + " the line gives (the file changed?)";
    }
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

protocol::InputImage InputImages::resolved(const protocol::InputImage& image, const std::string& base) {
    std::vector<protocol::InputImage> pictures;
    for (const protocol::InputImage& picture : image.pictures())
        pictures.push_back(file(relative_to(picture.path, base)).image);
    return protocol::InputImage::of(pictures);
}

std::pair<int, int> line_size(const PromptRecord& p, const JobOptions& job,
                              const strategies::ModelInfo& model, const protocol::CallValues& arguments) {
    const strategies::FamilyFacts& facts = strategies::facts_of(*model.spec);
    // A list's output follows its last picture, as QwenImageEditPlusPipeline's does, or its first
    // (Flux2KleinPipeline).
    const protocol::InputImage& given =
        model.arguments.find("image") ? arguments.image("image") : protocol::InputImage{};
    const protocol::InputImage input =
        facts.size_from_first_picture && !given.empty() ? given.pictures().front() : given.last();
    const int64_t m = model.sizes.multiple();
    const auto side = [&](std::optional<int> own, int job_side, int64_t input_side) -> int64_t {
        if (own) return *own;
        if (job_side) return job_side;
        if (facts.size_from_input && input_side > 0) return input_side / m * m;
        return model.sizes.default_side;
    };
    // The pipeline's own size for the image (QwenImageEditPipeline's area at its ratio), else its own.
    const auto [input_width, input_height] = facts.input_size && !input.empty()
                                                 ? facts.input_size(input.width, input.height, m)
                                                 : std::pair<int64_t, int64_t>{input.width, input.height};
    int64_t width = side(p.width, job.width, input_width), height = side(p.height, job.height, input_height);
    if (facts.output_size && width > 0 && height > 0)
        std::tie(width, height) = facts.output_size(width, height, arguments, m);
    return {static_cast<int>(width), static_cast<int>(height)};
}

std::string pictures_problem(const protocol::CallValues& given, const strategies::ModelInfo& model) {
    const protocol::FamilyArgument* row = model.arguments.find("image");
    const std::size_t count = given.has("image") ? given.image("image").count() : 0;
    if (!row || count <= static_cast<std::size_t>(row->max)) return {};
    return "key 'image': a list of " + std::to_string(count) + " pictures; " + model.spec->display_name +
           "'s pipeline (" + model.spec->pipeline_class + ") takes " +
           (row->max > 1 ? "up to " + std::to_string(static_cast<int>(row->max)) : std::string("one")) +
           " (Qwen-Image-Edit-Plus takes up to " + std::to_string(protocol::kMaxInputPictures) + ")";
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
    // The line's arguments as its request will hold them, its own image resolved.
    protocol::CallValues given = job.arguments;
    for (const protocol::CallValues::Item& item : p.arguments.items()) given.set(*item.first, item.second);
    for (const char* row : kImageRows)
        if (p.arguments.has(row) && !p.arguments.image(row).empty())
            given.set(row, resolved(p.arguments.image(row), folder));
    if (std::string why = pictures_problem(given, model); !why.empty()) return why;
    for (const protocol::FamilyArgument& a : model.arguments.all()) {
        const protocol::CallValue* v = a.required ? given.find(a.row->name) : nullptr;
        if (!a.required || (v && !(std::holds_alternative<protocol::InputImage>(*v) &&
                                   std::get<protocol::InputImage>(*v).empty())))
            continue;
        return "key '" + std::string(a.row->name) + "': " + model.spec->display_name + "'s pipeline (" +
               model.spec->pipeline_class + ") needs it on every line (or " + a.row->long_flag() +
               " for the job)";
    }
    const protocol::InputImage& input = given.image("image");
    if (input.empty()) {  // a strength alone changes nothing, as a skip-layer setting without layers
        const bool own_mask = p.arguments.has("mask_image") && !p.arguments.image("mask_image").empty();
        if (own_mask || !job.arguments.image("mask_image").empty())
            return std::string(own_mask ? "key 'mask_image'" : "--mask-image") +
                   ": a mask of the image to edit, and the line has no \"image\" (nor does --image)";
    }
    // Note [padding_mask_crop]: the result goes back through the mask, which must be the image's size.
    const protocol::InputImage no_mask;
    const protocol::InputImage& mask =
        model.arguments.find("mask_image") ? given.image("mask_image") : no_mask;
    if (!input.empty() && given.has("padding_mask_crop") && !mask.empty()) {
        if (mask.width != input.width || mask.height != input.height)
            return "key 'padding_mask_crop': the mask is " + std::to_string(mask.width) + " x " +
                   std::to_string(mask.height) + " pixels and the image " + std::to_string(input.width) +
                   " x " + std::to_string(input.height) +
                   "; the result is pasted back into the image through the mask, which must be the image's "
                   "size (give a mask of that size, or no padding_mask_crop)";
    }
    const strategies::FamilyFacts& facts = strategies::facts_of(*model.spec);
    const int64_t m = model.sizes.multiple();
    for (const protocol::InputImage& picture : input.pictures())
        if (facts.reference_size && facts.reference_size(picture.width, picture.height, m).first < 1)
            return "key 'image': " + std::to_string(picture.width) + " x " + std::to_string(picture.height) +
                   " pixels; " + model.spec->display_name + " takes images of at least " + std::to_string(m) +
                   " pixels a side";
    const protocol::CallValues completed = model.arguments.completed(given);
    const auto [width, height] = line_size(p, job, model, completed);
    for (const auto& [key, pixels] : {std::pair{"width", width}, std::pair{"height", height}}) {
        const std::string why = model.sizes.check(pixels);
        if (why.empty()) continue;
        const bool from_input = !input.empty() && facts.size_from_input && !(p.width || job.width);
        std::string made = "the image made would be " + std::to_string(width) + " x " +
                           std::to_string(height) + " pixels (" + std::string(key) + ": " + why + ")";
        if (facts.output_size)
            made += "; " + model.spec->display_name + "'s pipeline scales the asked size to max_area (" +
                    std::to_string(completed.whole("max_area")) + " pixels)";
        return from_input ? "key 'image': its size of " + std::to_string(input.width) + " x " +
                                std::to_string(input.height) + " pixels: " + made +
                                " (give \"width\" and \"height\")"
                          : made;
    }
    return {};
}

}  // namespace dp::launcher
