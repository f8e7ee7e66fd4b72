#include "serve/body_check.h"

#include <memory>
#include <nlohmann/json.hpp>

#include "launcher/errors.h"
#include "launcher/input_images.h"
#include "launcher/job_settings.h"
#include "launcher/prompt_file.h"
#include "protocol/strict_json.h"

namespace dp::serve {
namespace {

// Note [no server files in a request]: a batch job's line may name an input image, an adapter or
// a scheduler's or preset's JSON file, which its user could read anyway. A server's client could
// not, and must not make the server read (or show) its files: such a line is refused, and the
// server's own --lora, --image and --scheduler flags still apply to every job.
// The request's own uploads (`uploads`, Note [edits over HTTP]) are the only files it may name.
bool all_uploaded(const protocol::CallValue& value, const std::string& uploads) {
    const auto* image = std::get_if<protocol::InputImage>(&value);
    if (uploads.empty() || !image) return false;
    for (const protocol::InputImage& picture : image->pictures())
        if (picture.path.rfind(uploads + "/", 0) != 0 || picture.path.find("/..") != std::string::npos)
            return false;
    return true;
}

std::string names_server_file(const launcher::PromptRecord& p, const std::string& uploads) {
    for (const protocol::CallValues::Item& item : p.arguments.items()) {
        const protocol::CallType type = item.first->type;
        if (type == protocol::CallType::kImage && all_uploaded(item.second, uploads)) continue;
        if (type == protocol::CallType::kImage || type == protocol::CallType::kAdapters)
            return std::string("key '") + item.first->name +
                   "' names a file, and a request may not name files on the server (give the server's "
                   "--" +
                   (type == protocol::CallType::kImage ? "image" : "lora") + " instead)";
    }
    return {};
}

// The same for the keys the line parser reads a file for as it parses (a scheduler's or a
// preset's JSON file): found in the raw line, before it is parsed.
std::string names_json_file(const std::string& jsonl) {
    std::size_t start = 0;
    int64_t line = 0;
    while (start < jsonl.size()) {
        std::size_t end = jsonl.find('\n', start);
        if (end == std::string::npos) end = jsonl.size();
        ++line;
        nlohmann::json j;
        if (protocol::parse_strict_json(std::string_view(jsonl).substr(start, end - start), j).empty() &&
            j.is_object())
            for (const char* key : {"scheduler", "preset"}) {
                const auto v = j.find(key);
                if (v != j.end() && v->is_string() && protocol::names_a_json_file(v->get<std::string>()))
                    return "line " + std::to_string(line) + ": key '" + key +
                           "' names a JSON file, and a request may not name files on the server (give a "
                           "shipped name)";
            }
        start = end + 1;
    }
    return {};
}

}  // namespace

BodyChecker make_body_checker(const launcher::ResolvedJob& resolved, const ServeOptions& options) {
    const auto job = std::make_shared<const launcher::ResolvedJob>(resolved);
    const ServeOptions limits = options;
    return [job, limits](const std::string& jsonl, const std::string& uploads) {
        BodyCheck c;
        if (jsonl.find_first_not_of(" \t\r\n") == std::string::npos) {
            c.problem =
                "the body has no prompt lines: send JSON Lines, one {\"prompt\": \"...\"} object a line";
            return c;
        }
        if (!launcher::is_valid_utf8(jsonl)) {
            c.problem = "the body is not UTF-8 text";
            return c;
        }
        if (std::string why = names_json_file(jsonl); !why.empty()) {
            c.problem = why;
            return c;
        }
        bool too_large = false;
        launcher::PromptFile file;
        try {
            // The job's --num-images-per-prompt counts in each line's images, as its run counts them.
            launcher::PromptFileReader reader(
                "request", launcher::PromptFormat::kJsonl,
                [&](const launcher::PromptRecord& p) {
                    if (std::string why = names_server_file(p, uploads); !why.empty()) return why;
                    for (const std::optional<int>& side : {p.width, p.height})
                        if (side && *side > limits.max_image_side) {
                            too_large = true;
                            return "width and height may be at most " +
                                   std::to_string(limits.max_image_side) +
                                   " pixels on this server (--max-image-side)";
                        }
                    if (std::string why = launcher::prompt_setting_problem(p, job->options, job->model);
                        !why.empty())
                        return why;
                    // The request's own uploads: read as the job would read them (Note [input
                    // images are checked first]), so that a file that is no image is a 400 now.
                    if (uploads.empty()) return std::string();
                    launcher::InputImages images;
                    int64_t missing = 0;
                    return images.line_problem(p, job->options, job->model, uploads, missing);
                },
                {}, job->options.images_per_prompt);
            reader.feed(jsonl);
            file = reader.finish();
        } catch (const launcher::Error& e) {  // past the prompt file's own limits
            c.status = 413;
            c.problem = e.what();
            return c;
        }
        c.prompts = file.total;
        c.images = file.valid;
        if (file.total > limits.max_prompts) {
            c.status = 413;
            c.problem = std::to_string(file.total) + " prompt lines; this server takes at most " +
                        std::to_string(limits.max_prompts) + " a request (--max-prompts)";
            return c;
        }
        if (!file.invalid.empty()) {
            c.status = too_large ? 413 : 400;
            c.problem = std::to_string(file.invalid.size()) + " invalid line(s), nothing queued: ";
            for (std::size_t i = 0; i < file.invalid.size() && i < 10; ++i)
                c.problem += (i ? "; " : "") + file.invalid[i].reason;
        }
        // An upload is named as the client sent it, not by where the server keeps it.
        const std::string kept = uploads + "/";
        for (std::size_t at; !uploads.empty() && (at = c.problem.find(kept)) != std::string::npos;)
            c.problem.replace(at, kept.size(), "uploaded ");
        return c;
    };
}

}  // namespace dp::serve
