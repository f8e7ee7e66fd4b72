#pragma once
// Prompt files: what `dp-launch [options] PROMPTS` reads, validated once in the launcher before any
// rank starts. No LibTorch.
//
// Plain text (any name not ending in .jsonl): one prompt per line, UTF-8. A leading BOM is
// dropped, CRLF is accepted, trailing white space is trimmed, blank lines are skipped. A prompt's
// index is its position among the non-blank lines (0-based), invalid lines included, so skipping
// an invalid line never renumbers the others.
//
// JSON Lines (.jsonl): one object per non-blank line with "prompt" (required, non-empty) and
// optional "negative_prompt", "seed", "steps", "guidance_scale", "width", "height", "name".
//
// Invalid lines: bytes that are not UTF-8, a NUL byte, a line longer than kMaxPromptLineBytes, and
// in JSONL a line that is not such an object (unknown key, wrong type, value out of range).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dp::launcher {

inline constexpr std::size_t kMaxPromptLineBytes = 16 * 1024;

struct PromptRecord {
    int64_t index = 0;  // position among non-blank lines
    int64_t line = 0;   // 1-based line number in the file
    std::string prompt;
    std::optional<std::string> negative_prompt;
    std::optional<uint64_t> seed;
    std::optional<int> steps;
    std::optional<double> guidance_scale;
    std::optional<int> width, height;
    std::optional<std::string> name;
};

struct InvalidPrompt {
    int64_t index = 0;
    int64_t line = 0;
    std::string reason;  // "file:line: what is wrong"
};

struct PromptFile {
    std::vector<PromptRecord> prompts;  // valid ones, in file order
    std::vector<InvalidPrompt> invalid;
    int64_t total = 0;  // non-blank lines
};

// Parses `bytes` read from `name` ("-" for stdin). JSONL when `jsonl` is set.
PromptFile parse_prompt_file(std::string_view bytes, const std::string& name, bool jsonl);

// Whether `name` means JSON Lines (ends in ".jsonl", any case).
bool is_jsonl_name(const std::string& name);

// True when `text` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool is_valid_utf8(std::string_view text);

// A path-safe file name part from a prompt or a JSONL "name": lowercase ASCII letters and digits,
// other runs become '-', at most 48 characters, never empty ("image"), never ".." or a '/'.
std::string slugify(std::string_view text);

// The image file of a prompt: "{index:05d}-{slug}.png".
std::string image_file_name(int64_t index, std::string_view slug_source);

// The seed of a prompt without its own: --seed plus its index (mod 2^64).
uint64_t prompt_seed(uint64_t base_seed, int64_t index);

}  // namespace dp::launcher
