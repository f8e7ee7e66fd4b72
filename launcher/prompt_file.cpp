#include "launcher/prompt_file.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace dp::launcher {
namespace {

const char* kAcceptedKeys = "prompt, negative_prompt, seed, steps, guidance_scale, width, height, name";

std::string where(const std::string& name, int64_t line) { return name + ":" + std::to_string(line); }

// Fills `out` from a JSON object; returns an error text, or empty when valid.
std::string parse_jsonl_object(std::string_view text, PromptRecord& out) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        std::string why = e.what();
        if (auto pos = why.find("] "); pos != std::string::npos) why = why.substr(pos + 2);
        return "not valid JSON (" + why.substr(0, 160) + ")";
    }
    if (!j.is_object()) return "expected a JSON object like {\"prompt\": \"a red circle\"}";
    for (const auto& [key, value] : j.items()) {
        auto type_error = [&](const char* expected) { return "key '" + key + "': expected " + expected; };
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
        } else if (key == "seed") {
            if (!value.is_number_unsigned())
                return type_error("a whole number from 0 to 18446744073709551615");
            out.seed = value.get<uint64_t>();
        } else if (key == "steps" || key == "width" || key == "height") {
            const bool is_steps = key == "steps";
            const int64_t lo = is_steps ? 1 : 8, hi = is_steps ? 1000 : 8192;
            if (!value.is_number_integer() || value.get<int64_t>() < lo || value.get<int64_t>() > hi)
                return "key '" + key + "': expected a whole number from " + std::to_string(lo) + " to " +
                       std::to_string(hi);
            const int v = static_cast<int>(value.get<int64_t>());
            (is_steps ? out.steps : key == "width" ? out.width : out.height) = v;
        } else if (key == "guidance_scale") {
            if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < 0 ||
                value.get<double>() > 100)
                return type_error("a number from 0 to 100");
            out.guidance_scale = value.get<double>();
        } else {
            return "unknown key '" + key.substr(0, 40) + "' (accepted: " + kAcceptedKeys + ")";
        }
    }
    if (!j.contains("prompt")) return "missing key 'prompt'";
    if (out.prompt.find_first_not_of(" \t\r\n") == std::string::npos) return "key 'prompt': empty";
    return {};
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
    std::size_t i = 0;
    while (i < s.size()) {
        const auto c = static_cast<unsigned char>(s[i]);
        std::size_t n = 0;
        uint32_t cp = 0;
        if (c < 0x80) {
            ++i;
            continue;
        }
        if ((c & 0xE0) == 0xC0) {
            n = 1;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            n = 2;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            n = 3;
            cp = c & 0x07;
        } else
            return false;
        for (std::size_t k = 1; k <= n; ++k) {
            if (i + k >= s.size()) return false;
            const auto cc = static_cast<unsigned char>(s[i + k]);
            if ((cc & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (cc & 0x3F);
        }
        if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000))
            return false;  // overlong
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += n + 1;
    }
    return true;
}

bool is_jsonl_name(const std::string& name) {
    if (name.size() < 6) return false;
    std::string tail = name.substr(name.size() - 6);
    for (char& c : tail) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return tail == ".jsonl";
}

PromptFile parse_prompt_file(std::string_view bytes, const std::string& name, bool jsonl) {
    PromptFile file;
    if (bytes.substr(0, 3) == "\xEF\xBB\xBF") bytes.remove_prefix(3);
    int64_t line_no = 0;
    std::size_t start = 0;
    while (start < bytes.size()) {
        std::size_t end = bytes.find('\n', start);
        if (end == std::string_view::npos) end = bytes.size();
        std::string_view line = bytes.substr(start, end - start);
        start = end + 1;
        ++line_no;
        while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t'))
            line.remove_suffix(1);
        if (line.find_first_not_of(" \t\f\v") == std::string_view::npos) continue;  // blank
        const int64_t index = file.total++;
        auto invalid = [&](const std::string& why) {
            file.invalid.push_back({index, line_no, where(name, line_no) + ": " + why});
        };
        if (line.size() > kMaxPromptLineBytes) {
            invalid("line is " + std::to_string(line.size()) + " bytes; the limit is " +
                    std::to_string(kMaxPromptLineBytes));
            continue;
        }
        if (line.find('\0') != std::string_view::npos) {
            invalid("contains a NUL byte");
            continue;
        }
        if (!is_valid_utf8(line)) {
            invalid("not valid UTF-8");
            continue;
        }
        PromptRecord record;
        record.index = index;
        record.line = line_no;
        if (jsonl) {
            const std::string error = parse_jsonl_object(line, record);
            if (!error.empty()) {
                invalid(error);
                continue;
            }
        } else {
            record.prompt = std::string(line);
        }
        file.prompts.push_back(std::move(record));
    }
    return file;
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

std::string image_file_name(int64_t index, std::string_view slug_source) {
    char prefix[32];
    std::snprintf(prefix, sizeof(prefix), "%05lld-", static_cast<long long>(index));
    return prefix + slugify(slug_source) + ".png";
}

uint64_t prompt_seed(uint64_t base_seed, int64_t index) { return base_seed + static_cast<uint64_t>(index); }

}  // namespace dp::launcher
