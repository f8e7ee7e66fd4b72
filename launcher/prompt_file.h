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
// optional "negative_prompt" (null: none), "seed" (null: the job's), "steps" (or diffusers'
// "num_inference_steps"), "width", "height", "name" (null: from the prompt), and the pipelines'
// own call arguments by diffusers' names, each in its row's range (protocol/call_arguments.h:
// guidance_scale, max_sequence_length, skip_guidance_layers, ...). Which of these
// a model's family takes, and their limits there, is the caller's check (job_settings.h).
//
// Invalid lines: bytes that are not UTF-8, a NUL byte, a line longer than kMaxPromptLineBytes, and
// in JSONL a line that is not such an object (unknown key, a key twice, wrong type, value out of
// range), or one the caller's check refuses (a size the model cannot make).
//
// The file is read as a stream: at most kMaxPromptLineBytes of a line are held, whatever its length,
// and one job accepts at most kMaxJobPromptBytes and kMaxJobPrompts lines; the reader stops at the
// first limit it meets, so an endless input (/dev/zero, a FIFO) costs a bounded amount of memory.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/call_arguments.h"
#include "protocol/presets.h"

namespace dp::launcher {

inline constexpr std::size_t kMaxPromptLineBytes = 16 * 1024;
// What one job accepts: the bytes of its prompt file, and its non-blank lines.
inline constexpr std::size_t kMaxJobPromptBytes = std::size_t{64} << 20;
inline constexpr int64_t kMaxJobPrompts = 100000;
// Images of one prompt (--num-images-per-prompt, the JSONL key num_images_per_prompt); a job makes
// at most kMaxJobPrompts images in all.
inline constexpr int kMaxImagesPerPrompt = 1000;

struct PromptRecord {
    // The image's index: its position among the images of the file's non-blank lines, each line
    // counting its num_images_per_prompt (an invalid line the job's): with one image a prompt,
    // the line's position among the non-blank lines.
    int64_t index = 0;
    int64_t line = 0;  // 1-based line number in the file
    // Note [images per prompt]: a line with num_images_per_prompt N is N records, image 0 to N - 1,
    // at consecutive indexes; image k's seed is the line's seed + k (without one, the job's seed +
    // its index, which is consecutive too), whatever the number of ranks.
    int image = 0;
    int images = 1;
    std::string prompt;
    std::optional<std::string> negative_prompt;
    bool no_negative_prompt = false;  // "negative_prompt": null: none, whatever the job's flag says
    std::optional<uint64_t> seed;
    std::optional<int> steps;
    std::optional<int> width, height;
    std::optional<std::string> name;
    protocol::CallValues arguments;          // the family call arguments the line sets
    std::optional<protocol::Preset> preset;  // "preset": NAME (Note [presets]), over the job's
};

// Where a job's prompts come from: a prompt file (`path`, "-" for standard input), or the texts
// of --prompt, each a prompt of its own (a plain-text file of those lines, named "--prompt").
struct PromptSource {
    std::string path;
    std::vector<std::string> texts;
    int images_per_prompt = 1;  // a line's num_images_per_prompt unless it says its own
    // With `texts`: the images a batch edit runs each text on (--image GLOB or FOLDER), one line
    // per text and image, texts first; empty: one line per text.
    std::vector<std::string> images;
    // With `images`: a folder of their masks, each of an image's name (--mask-image FOLDER).
    std::string masks;
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
    int64_t valid = 0;  // valid records, whether in `prompts` or given to a PromptSink
};

enum class PromptFormat {
    kText,
    kJsonl,
    kDetect,  // JSON Lines when the first non-blank line starts with '{' (standard input)
};

// A further check of a valid record (the sizes its model can make): an error text, or empty.
using PromptCheck = std::function<std::string(const PromptRecord&)>;
// Where each valid record goes as it is read, instead of PromptFile::prompts, so that a job of
// kMaxJobPrompts lines never holds them all.
using PromptSink = std::function<void(PromptRecord&&)>;

// Parses a prompt file fed in pieces of any size. `name` is how messages name the file (it is
// shown with bytes that are not UTF-8 replaced, so that every message and record is UTF-8).
class PromptFileReader {
  public:
    // With `sink`, the valid records go there and PromptFile::prompts stays empty.
    PromptFileReader(const std::string& name, PromptFormat format, PromptCheck check = {},
                     PromptSink sink = {}, int images_per_prompt = 1);

    // Throws InputDataError when the input passes kMaxJobPromptBytes or kMaxJobPrompts lines.
    void feed(std::string_view bytes);
    // The end of the input: the last line without a newline, then the result.
    PromptFile finish();

  private:
    void end_line();
    void limit_passed(const std::string& what) const;
    void add_images(PromptRecord&& record);

    std::string name_;
    PromptFormat format_;
    PromptCheck check_;
    PromptSink sink_;
    PromptFile file_;
    std::string line_;                // the line so far, its first kHeldLineBytes bytes
    std::size_t line_bytes_ = 0;      // the whole line's length so far
    std::size_t trailing_blank_ = 0;  // the length of the white space that ends it so far
    std::size_t bytes_ = 0;
    int64_t line_no_ = 0;
    int images_per_prompt_ = 1;
    int64_t next_index_ = 0;  // the next line's first image index
};

// Parses `bytes` read from `name` ("-" for stdin). JSONL when `jsonl` is set.
PromptFile parse_prompt_file(std::string_view bytes, const std::string& name, bool jsonl,
                             const PromptCheck& check = {});

// Reads the prompt file `path` ("-": standard input) as a stream: JSON Lines when its name ends in
// .jsonl, or when its first non-blank line starts with '{' (any other name, and stdin); else plain
// text, a prompt a line. Throws Error with
// protocol::kExitNoInput when it cannot be opened or read (a directory included), and
// InputDataError past the job's limits.
PromptFile read_prompt_file(const std::string& path, const PromptCheck& check = {},
                            const PromptSink& sink = {}, int images_per_prompt = 1);

// A job's prompts from `source`: read_prompt_file's for a path, else its texts as lines of a plain
// text file. Throws UsageError for a --prompt text that is empty, holds a newline or NUL, or is not UTF-8.
PromptFile read_prompts(const PromptSource& source, const PromptCheck& check = {},
                        const PromptSink& sink = {});

// When `path` looks like a program rather than a prompt file, what it is ("a .py script", "a
// script (#!)", "an executable file") and the command that would run it ("python3 train.py",
// "./job.sh"); else nullopt. A program is a file with a script suffix (.py, .sh, ...), a "#!"
// first line or the executable bit; a name ending in .txt or .jsonl is always a prompt file.
struct ProgramGuess {
    std::string what;
    std::vector<std::string> command;
};
std::optional<ProgramGuess> guess_program(const std::string& path);

// `text` with each byte that is not part of valid UTF-8 replaced by U+FFFD, to show a path in a
// message or a JSON record.
std::string utf8_for_display(std::string_view text);

// Note [terminal-safe messages]: what dp-launch prints of its own can hold text from files and
// prompt lines (a JSONL key, a path, a tensor's dtype), and an ESC or OSC sequence there would
// clear the screen or set the title. Every message is printed through this: valid UTF-8, and each
// control character but newline and tab (C0, DEL, and C1 U+0080 to U+009F) written as \xNN or
// \u00NN.
std::string terminal_safe(std::string_view text);

// Whether `name` means JSON Lines (ends in ".jsonl", any case).
bool is_jsonl_name(const std::string& name);

// True when `text` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool is_valid_utf8(std::string_view text);

// A path-safe file name part from a prompt or a JSONL "name": lowercase ASCII letters and digits,
// other runs become '-', at most 48 characters, never empty ("image"), never ".." or a '/'.
std::string slugify(std::string_view text);

// The image file of a prompt: "{index:05d}-{slug}.{png,jpg,webp}" for image_format png, jpeg or webp.
std::string image_file_name(int64_t index, std::string_view slug_source,
                            const std::string& image_format = "png");

// The seed of a prompt without its own: --seed plus its index (mod 2^64).
uint64_t prompt_seed(uint64_t base_seed, int64_t index);

}  // namespace dp::launcher
