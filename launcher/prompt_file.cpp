#include "launcher/prompt_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>

#include "launcher/errors.h"
#include "launcher/spelling.h"
#include "launcher/start_signals.h"
#include "launcher/unique_fd.h"
#include "launcher/values.h"
#include "protocol/call_arguments.h"
#include "strategies/family.h"

namespace dp::launcher {
namespace {

// The keys a JSONL line may hold, for the unknown-key message: every family's, then each family's
// own (strategies' specs name the families; the call-argument table says what each takes).
const std::string& accepted_keys() {
    static const std::string text = [] {
        std::string common =
            "prompt, negative_prompt, seed, steps (or num_inference_steps), width, height, name, "
            "num_images_per_prompt, preset";
        std::vector<std::pair<std::string, std::vector<std::string>>> own;
        for (const strategies::ParallelSpec* spec : strategies::parallel_specs())
            own.emplace_back(spec->display_name, strategies::family_arguments(spec->family).names());
        for (const protocol::CallArgument& row : protocol::call_arguments()) {
            if (row.universal) continue;
            const auto takes = [&](const auto& family) {
                return std::find(family.second.begin(), family.second.end(), row.name) != family.second.end();
            };
            if (!std::all_of(own.begin(), own.end(), takes)) continue;
            common += std::string(", ") + row.name;
            for (auto& family : own)
                family.second.erase(std::find(family.second.begin(), family.second.end(), row.name));
        }
        for (const auto& [family, keys] : own) {
            if (keys.empty()) continue;
            common += "; " + family + ":";
            for (std::size_t i = 0; i < keys.size(); ++i) common += (i ? ", " : " ") + keys[i];
        }
        return common;
    }();
    return text;
}

// Every key a JSONL line may hold, for a mistyped key's suggestion.
const std::vector<std::string>& known_keys() {
    static const std::vector<std::string> keys = [] {
        std::vector<std::string> out = {
            "prompt", "negative_prompt",       "seed",  "steps", "num_inference_steps", "width", "height",
            "name",   "num_images_per_prompt", "preset"};
        for (const protocol::CallArgument& row : protocol::call_arguments())
            if (std::find(out.begin(), out.end(), row.name) == out.end()) out.push_back(row.name);
        return out;
    }();
    return keys;
}

std::string where(const std::string& name, int64_t line) { return name + ":" + std::to_string(line); }

// A key of a whole number of the line's own (seed, num_images_per_prompt, steps or
// num_inference_steps, width, height) into `out`: an error text, empty when valid, nullopt for
// another key.
std::optional<std::string> read_whole_key(const std::string& key, const nlohmann::json& value,
                                          const nlohmann::json& line, PromptRecord& out) {
    auto type_error = [&](const std::string& expected) { return "key '" + key + "': expected " + expected; };
    if (key == "seed") {
        if (!value.is_number_unsigned()) return type_error("a whole number from 0 to 18446744073709551615");
        out.seed = value.get<uint64_t>();
        return "";
    }
    const bool is_steps = key == "steps" || key == "num_inference_steps";
    const bool images = key == "num_images_per_prompt";
    if (!is_steps && !images && key != "width" && key != "height") return std::nullopt;
    if (is_steps && line.contains("steps") && line.contains("num_inference_steps"))
        return "keys 'steps' and 'num_inference_steps' are the same setting: give one";
    // The universal rows' ranges, and the images' own.
    const protocol::CallArgument* row = images ? nullptr : protocol::find_call_argument(key);
    const int64_t lo = row ? static_cast<int64_t>(row->min) : 1;
    const int64_t hi = row ? static_cast<int64_t>(row->max) : kMaxImagesPerPrompt;
    if (!value.is_number_integer() || value.get<int64_t>() < lo || value.get<int64_t>() > hi)
        return type_error("a whole number from " + std::to_string(lo) + " to " + std::to_string(hi));
    const int v = static_cast<int>(value.get<int64_t>());
    if (images)
        out.images = v;
    else if (is_steps)
        out.steps = v;
    else
        (key == "width" ? out.width : out.height) = v;
    return "";
}

// Fills `out` from a JSON object; returns an error text, or empty when valid.
std::string parse_jsonl_object(std::string_view text, PromptRecord& out) {
    nlohmann::json j;
    if (std::string why = parse_strict_json(text, j); !why.empty()) return why.substr(0, 200);
    if (!j.is_object()) return "expected a JSON object like {\"prompt\": \"a red circle\"}";
    for (const auto& [key, value] : j.items()) {
        auto type_error = [&](const char* expected) { return "key '" + key + "': expected " + expected; };
        if (key == "negative_prompt" && value.is_null()) {  // diffusers' None, over the job's flag
            out.no_negative_prompt = true;
            continue;
        }
        if ((key == "seed" || key == "name" || key == "num_images_per_prompt") && value.is_null())
            continue;  // the default: --seed's, the prompt's, --num-images-per-prompt's
        if (key == "prompt" || key == "negative_prompt" || key == "name") {
            if (!value.is_string()) return type_error("a string");
            const std::string s = value.get<std::string>();
            if (s.find('\0') != std::string::npos) return "key '" + key + "': contains a NUL character";
            if (key == "prompt")
                out.prompt = s;
            else if (key == "negative_prompt")
                out.negative_prompt = s;
            else if (s.empty() || s.size() > 200)
                return "key 'name': expected 1 to 200 bytes";
            else
                out.name = s;
        } else if (key == "preset") {  // Note [presets]
            if (!value.is_string())
                return "key 'preset': expected a preset's name (" +
                       protocol::preset_names(strategies::shipped_presets()) + ")";
            protocol::Preset preset;
            if (std::string why =
                    protocol::find_preset(value.get<std::string>(), strategies::shipped_presets(), preset);
                !why.empty())
                return "key 'preset': " + why;
            out.preset = std::move(preset);
        } else if (std::optional<std::string> why = read_whole_key(key, value, j, out)) {
            if (!why->empty()) return *why;
        } else if (const protocol::CallArgument* row = protocol::find_call_argument(key);
                   row && !row->universal && key == row->name) {
            // A family's call argument, in its row's range; the model's own limits are the caller's check.
            if (value.is_null() && row->none_default) continue;  // diffusers' None: the job's, or none
            protocol::CallValue v;
            if (std::string why = protocol::read_call_value(*row, value, v); !why.empty())
                return "key '" + key + "': " + why;
            out.arguments.set(*row, std::move(v));
        } else {
            return "unknown key '" + key.substr(0, 40) + "'" + did_you_mean(key, known_keys()) +
                   " (accepted: " + accepted_keys() + ")";
        }
    }
    if (!j.contains("prompt")) return "missing key 'prompt'";
    if (out.prompt.find_first_not_of(" \t\r\n") == std::string::npos) return "key 'prompt': empty";
    return {};
}

}  // namespace

namespace {

// The length of the well-formed UTF-8 sequence at s[i] (no overlongs, surrogates or code points
// past U+10FFFF), or 0 when none starts there.
std::size_t utf8_sequence_length(std::string_view s, std::size_t i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) return 1;
    std::size_t n = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
        n = 1;
        cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        n = 2;
        cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        n = 3;
        cp = c & 0x07;
    } else {
        return 0;
    }
    for (std::size_t k = 1; k <= n; ++k) {
        if (i + k >= s.size()) return 0;
        const auto cc = static_cast<unsigned char>(s[i + k]);
        if ((cc & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (cc & 0x3F);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000)) return 0;  // overlong
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return n + 1;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
    for (std::size_t i = 0; i < s.size();) {
        const std::size_t n = utf8_sequence_length(s, i);
        if (n == 0) return false;
        i += n;
    }
    return true;
}

std::string utf8_for_display(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (std::size_t i = 0; i < s.size();) {
        const std::size_t n = utf8_sequence_length(s, i);
        if (n == 0) {
            out += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
            ++i;
        } else {
            out.append(s.substr(i, n));
            i += n;
        }
    }
    return out;
}

std::string terminal_safe(std::string_view text) {
    const std::string valid = utf8_for_display(text);
    std::string out;
    out.reserve(valid.size());
    static const char* hex = "0123456789abcdef";
    for (std::size_t i = 0; i < valid.size(); ++i) {
        const auto c = static_cast<unsigned char>(valid[i]);
        if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 15];
        } else if (c == 0xc2 && i + 1 < valid.size() && static_cast<unsigned char>(valid[i + 1]) < 0xa0) {
            const auto d = static_cast<unsigned char>(valid[++i]);  // U+0080 to U+009F
            out += "\\u00";
            out += hex[d >> 4];
            out += hex[d & 15];
        } else {
            out += valid[i];
        }
    }
    return out;
}

bool is_jsonl_name(const std::string& name) {
    if (name.size() < 6) return false;
    std::string tail = name.substr(name.size() - 6);
    for (char& c : tail) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return tail == ".jsonl";
}

namespace {

// The bytes of a line the reader holds: the line limit, and a BOM before it on the first line.
constexpr std::size_t kHeldLineBytes = kMaxPromptLineBytes + 3;
constexpr std::string_view kBom = "\xEF\xBB\xBF";

bool is_trailing_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

}  // namespace

PromptFileReader::PromptFileReader(const std::string& name, PromptFormat format, PromptCheck check,
                                   PromptSink sink, int images_per_prompt)
    : name_(utf8_for_display(name)),
      format_(format),
      check_(std::move(check)),
      sink_(std::move(sink)),
      images_per_prompt_(images_per_prompt) {}

void PromptFileReader::limit_passed(const std::string& what) const {
    throw InputDataError(name_ + ": " + what + "; one job takes at most " +
                         std::to_string(kMaxJobPromptBytes >> 20) + " MiB and " +
                         std::to_string(kMaxJobPrompts) + " prompt lines (split the file into several jobs)");
}

void PromptFileReader::feed(std::string_view bytes) {
    while (!bytes.empty()) {
        const std::size_t newline = bytes.find('\n');
        const std::string_view part = bytes.substr(0, newline);
        bytes_ += part.size() + (newline == std::string_view::npos ? 0 : 1);
        if (bytes_ > kMaxJobPromptBytes)
            limit_passed("more than " + std::to_string(kMaxJobPromptBytes >> 20) +
                         " MiB (stopped reading there)");
        if (line_.size() < kHeldLineBytes) line_.append(part.substr(0, kHeldLineBytes - line_.size()));
        line_bytes_ += part.size();
        std::size_t blank = 0;
        while (blank < part.size() && is_trailing_blank(part[part.size() - 1 - blank])) ++blank;
        trailing_blank_ = blank == part.size() ? trailing_blank_ + blank : blank;
        if (newline == std::string_view::npos) return;
        end_line();
        bytes.remove_prefix(newline + 1);
    }
}

void PromptFileReader::end_line() {
    ++line_no_;
    std::string_view line = line_;
    std::size_t length = line_bytes_ - trailing_blank_;  // without the white space that ends it
    if (line_no_ == 1 && line.substr(0, kBom.size()) == kBom) {
        line.remove_prefix(kBom.size());
        length -= kBom.size();
    }
    if (length <= line.size()) line = line.substr(0, length);
    const bool blank = length <= line.size() && line.find_first_not_of(" \t\f\v") == std::string_view::npos;
    auto next_line = [this] {
        line_.clear();
        line_bytes_ = 0;
        trailing_blank_ = 0;
    };
    if (blank) return next_line();
    const int64_t index = next_index_;
    if (++file_.total > kMaxJobPrompts)
        limit_passed("more than " + std::to_string(kMaxJobPrompts) +
                     " prompt lines (stopped reading at line " + std::to_string(line_no_) + ")");
    if (format_ == PromptFormat::kDetect) {
        const std::size_t first = line.find_first_not_of(" \t\f\v");
        format_ = first != std::string_view::npos && line[first] == '{' ? PromptFormat::kJsonl
                                                                        : PromptFormat::kText;
    }
    auto invalid = [&](const std::string& why) {
        file_.invalid.push_back({index, line_no_, where(name_, line_no_) + ": " + why});
        next_index_ += images_per_prompt_;
    };
    if (length > kMaxPromptLineBytes) {
        invalid("line is " + std::to_string(length) + " bytes; the limit is " +
                std::to_string(kMaxPromptLineBytes));
    } else if (line.find('\0') != std::string_view::npos) {
        invalid("contains a NUL byte");
    } else if (!is_valid_utf8(line)) {
        invalid("not valid UTF-8");
    } else {
        PromptRecord record;
        record.index = index;
        record.line = line_no_;
        record.images = images_per_prompt_;
        std::string error;
        if (format_ == PromptFormat::kJsonl) {
            error = parse_jsonl_object(line, record);
        } else {
            record.prompt = std::string(line);
        }
        if (error.empty() && check_) error = check_(record);
        if (error.empty())
            add_images(std::move(record));
        else
            invalid(error);
    }
    next_line();
}

void PromptFileReader::add_images(PromptRecord&& record) {
    const int images = record.images;
    next_index_ += images;
    if (next_index_ > kMaxJobPrompts)
        limit_passed("more than " + std::to_string(kMaxJobPrompts) + " images (num_images_per_prompt, line " +
                     std::to_string(line_no_) + ")");
    for (int k = 0; k < images; ++k) {
        PromptRecord one = k + 1 < images ? record : std::move(record);
        one.index += k;
        one.image = k;
        if (one.seed) *one.seed += static_cast<uint64_t>(k);  // Note [images per prompt]
        ++file_.valid;
        if (sink_)
            sink_(std::move(one));
        else
            file_.prompts.push_back(std::move(one));
    }
}

PromptFile PromptFileReader::finish() {
    if (line_bytes_ > 0) end_line();
    return std::move(file_);
}

PromptFile parse_prompt_file(std::string_view bytes, const std::string& name, bool jsonl,
                             const PromptCheck& check) {
    PromptFileReader reader(name, jsonl ? PromptFormat::kJsonl : PromptFormat::kText, check);
    reader.feed(bytes);
    return reader.finish();
}

PromptFile read_prompts(const PromptSource& source, const PromptCheck& check, const PromptSink& sink) {
    if (source.texts.empty()) return read_prompt_file(source.path, check, sink, source.images_per_prompt);
    PromptFileReader reader("--prompt", source.images.empty() ? PromptFormat::kText : PromptFormat::kJsonl,
                            check, sink, source.images_per_prompt);
    for (const std::string& text : source.texts) {
        if (text.find_first_not_of(" \t\r") == std::string::npos ||
            text.find_first_of("\n\r") != std::string::npos || text.find('\0') != std::string::npos ||
            !is_valid_utf8(text))
            throw UsageError("--prompt '" + utf8_for_display(text.substr(0, 80)) +
                             "': expected one line of UTF-8 text, not empty (give --prompt again for another "
                             "prompt, or write them to a prompt file)");
        if (source.images.empty()) reader.feed(text + "\n");
        for (const std::string& image : source.images) {  // Note [batch edits]
            nlohmann::json line = {{"prompt", text},
                                   {"image", protocol::call_value_json(protocol::InputImage{image})}};
            if (!source.masks.empty())
                line["mask_image"] = protocol::call_value_json(
                    protocol::InputImage{source.masks + "/" + image.substr(image.rfind('/') + 1)});
            reader.feed(line.dump() + "\n");
        }
    }
    return reader.finish();
}

PromptFile read_prompt_file(const std::string& path, const PromptCheck& check, const PromptSink& sink,
                            int images_per_prompt) {
    const bool from_stdin = path == "-";
    const std::string shown = from_stdin ? "<stdin>" : utf8_for_display(path);
    UniqueFd owned;
    if (!from_stdin) {
        owned.reset(open(path.c_str(), O_RDONLY | O_CLOEXEC));
        if (!owned) throw Error(errno_message("PROMPTS " + shown + ": cannot read"), protocol::kExitNoInput);
    }
    const int fd = from_stdin ? STDIN_FILENO : owned.get();
    struct stat st {};
    if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode))
        throw Error("PROMPTS " + shown + ": is a directory, not a prompt file", protocol::kExitNoInput);
    // A .jsonl name says JSON Lines; any other name (prompts.json, .ndjson, .txt, none) and stdin
    // are JSON Lines when the first non-blank line starts with '{', as a JSONL file does whatever
    // it is called.
    PromptFileReader reader(from_stdin ? "<stdin>" : path,
                            !from_stdin && is_jsonl_name(path) ? PromptFormat::kJsonl : PromptFormat::kDetect,
                            check, sink, images_per_prompt);
    std::string buffer(std::size_t{1} << 16, '\0');
    while (true) {
        // A pipe or terminal may keep dp-launch waiting here: a stop signal ends that wait (Note
        // [signals before the ranks start]).
        wait_readable_or_stopped(fd);
        stop_if_signalled();
        const ssize_t n = read(fd, buffer.data(), buffer.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw Error(errno_message("PROMPTS " + shown + ": cannot read"), protocol::kExitNoInput);
        if (n == 0) break;
        reader.feed(std::string_view(buffer.data(), static_cast<std::size_t>(n)));
    }
    return reader.finish();
}

std::optional<ProgramGuess> guess_program(const std::string& path) {
    // A name that says prompts is prompts, whatever its mode (files on a FAT mount are executable).
    if (is_jsonl_name(path) || (path.size() > 4 && path.compare(path.size() - 4, 4, ".txt") == 0))
        return std::nullopt;
    UniqueFd fd(open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));  // a FIFO never blocks here
    struct stat st {};
    if (!fd || fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
    const std::string as_command = path.find('/') == std::string::npos ? "./" + path : path;
    char head[256] = {};
    const ssize_t n = read(fd.get(), head, sizeof(head) - 1);
    const std::string first_line(head, n > 0 ? std::strcspn(head, "\n") : 0);
    const bool executable = (st.st_mode & (S_IXUSR | S_IXGRP | S_IXOTH)) != 0;
    if (first_line.rfind("#!", 0) == 0) {
        if (executable) return ProgramGuess{"a script (#!)", {as_command}};
        std::istringstream words(first_line.substr(2));
        std::string interpreter, argument;
        words >> interpreter >> argument;
        if (interpreter.size() >= 4 && interpreter.substr(interpreter.size() - 4) == "/env" &&
            !argument.empty())
            interpreter = argument;
        if (!interpreter.empty()) return ProgramGuess{"a script (#!)", {interpreter, path}};
    }
    static const std::vector<std::pair<std::string, std::string>> kSuffixes = {
        {".py", "python3"}, {".sh", "bash"}, {".bash", "bash"}, {".zsh", "zsh"},
        {".pl", "perl"},    {".rb", "ruby"}, {".js", "node"},   {".lua", "lua"}};
    for (const auto& [suffix, interpreter] : kSuffixes)
        if (path.size() > suffix.size() &&
            path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0)
            return ProgramGuess{"a " + suffix + " script", {interpreter, path}};
    if (executable) return ProgramGuess{"an executable file", {as_command}};
    return std::nullopt;
}

std::string slugify(std::string_view text) {
    std::string slug;
    bool dash = false;
    for (unsigned char c : text) {
        if (std::isalnum(c) && c < 0x80) {
            if (dash && !slug.empty()) slug += '-';
            dash = false;
            slug += static_cast<char>(std::tolower(c));
            if (slug.size() >= 48) break;
        } else {
            dash = true;
        }
    }
    return slug.empty() ? "image" : slug;
}

std::string image_file_name(int64_t index, std::string_view slug_source, const std::string& image_format) {
    char prefix[32];
    std::snprintf(prefix, sizeof(prefix), "%05lld-", static_cast<long long>(index));
    return prefix + slugify(slug_source) + (image_format == "jpeg" ? ".jpg" : "." + image_format);
}

uint64_t prompt_seed(uint64_t base_seed, int64_t index) { return base_seed + static_cast<uint64_t>(index); }

}  // namespace dp::launcher
