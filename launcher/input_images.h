#pragma once
// Note [input images are checked first]: every image a job edits (--image, a prompt line's
// "image") is read here before any rank starts, once per file: it must exist (66) and decode
// whole as a PNG, JPEG or WebP within images::kMaxInputPixels (65: a truncated or damaged file,
// an image bomb, a file that is no image). The requests then carry each file's absolute path, its
// SHA-256 and its decoded size (Note [input images], protocol/call_arguments.h), so that every
// rank reads the same bytes, the manifest records which ones made an image, and --resume sees a
// changed file as other pixels. A prompt line's relative path is relative to the prompt file's
// folder; a flag's, to the working folder. No LibTorch.

#include <map>
#include <string>
#include <utility>

#include "launcher/job_options.h"
#include "launcher/prompt_file.h"
#include "protocol/call_arguments.h"
#include "strategies/model_config.h"

namespace dp::launcher {

// The call arguments that are input images.
inline constexpr const char* kImageRows[] = {"image", "mask_image"};

class InputImages {
  public:
    // Why `image` (relative to `base`, a folder; empty: the working folder) cannot be edited,
    // naming the file, or empty. `missing` is set when the file does not exist.
    std::string problem(const protocol::InputImage& image, const std::string& base, bool* missing = nullptr);
    // Throws protocol::Error (66 for a missing file, else 65) for `image`'s problem, after `source`
    // ("--image").
    void check(const protocol::InputImage& image, const std::string& base, const std::string& source);
    // `values`' images (its "image" and "mask_image" rows, if any, relative to `base`) as absolute
    // paths with their SHA-256 and decoded size. They must have been checked.
    void resolve(protocol::CallValues& values, const std::string& base);
    // Why prompt line `p` of a prompt file in `folder` cannot run its edit, naming the key, or
    // empty: an image or mask that problem() refuses (counted in `missing_images` when the file
    // does not exist), a mask without an image to edit, or, where neither the line nor `job` sets
    // a side, the input's side rounded down to the model's size multiple, which the model must make.
    std::string line_problem(const PromptRecord& p, const JobOptions& job, const strategies::ModelInfo& model,
                             const std::string& folder, int64_t& missing_images);
    // `image` as resolve makes it (absolute path, SHA-256, size, of each picture); it must have
    // been checked.
    protocol::InputImage resolved(const protocol::InputImage& image, const std::string& base);

  private:
    struct File {
        protocol::InputImage image;  // absolute path, SHA-256, size
        std::string problem;
        bool missing = false;
    };
    const File& file(const std::string& path);
    std::map<std::string, File> files_;
};

// Why `given`'s "image" (a line's call arguments over the job's) lists more pictures than the
// model's pipeline takes (Note [several input images]), naming the key; empty when it does not.
std::string pictures_problem(const protocol::CallValues& given, const strategies::ModelInfo& model);

// The width and height line `p` makes (Note [output size], strategies/family.h): the line's, else
// the job's, else its image's rounded down to the size multiple where the family sizes an edit by
// its input, else the model's default; then as the family's pipeline makes those. `arguments`: the
// line's call arguments completed, its image resolved.
std::pair<int, int> line_size(const PromptRecord& p, const JobOptions& job,
                              const strategies::ModelInfo& model, const protocol::CallValues& arguments);

// `path` relative to `base` where it is relative and `base` is not empty.
std::string relative_to(const std::string& path, const std::string& base);

// The folder a prompt file's relative paths start from: its own folder; empty (the working
// folder) for standard input and --prompt.
std::string prompt_file_folder(const std::string& prompts, bool from_texts);

}  // namespace dp::launcher
