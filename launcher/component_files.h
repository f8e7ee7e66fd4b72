#pragma once
// Note [component files]: --transformer FILE, --text-encoder FILE, --text-encoder-2 FILE,
// --text-encoder-3 FILE and --vae FILE take that component's weights from one file, the rest of
// the pipeline (and every config) from --model's folder, as diffusers'
// `from_pretrained(folder, transformer=...from_single_file(FILE))` does. Each file is checked here
// before any rank starts: it must exist (66), be a valid safetensors file (65, truncation
// included), be laid out as the family's component in a layout we read, and hold every tensor of
// the component with the shape the folder's config implies, and nothing else (65,
// strategies::single_file_problem). The job file then names each by its absolute path, and every
// image's record names it with its SHA-256 and format, so that --resume sees another file as
// other pixels. No LibTorch.

#include <map>
#include <string>
#include <vector>

#include "strategies/model_config.h"

namespace dp::launcher {

struct ComponentFile {
    std::string flag;       // "--transformer"
    std::string component;  // "transformer"
    std::string path;       // absolute
    std::string sha256;
    std::string layout;               // "diffusers", "Black Forest Labs' original (FLUX.1)"
    std::string format;               // "bf16", "fp8 (e4m3)", "scaled fp8 (e4m3)", ...
    std::size_t quantized_bytes = 0;  // GGUF: the bytes of its tensors in a quantized type
};

// The flags, in order, and the components they name.
const std::vector<std::pair<const char*, const char*>>& component_file_flags();

// The files of `files` (component -> path as given) checked for the model `model` (its `variant`'s
// folder gives each component's tensors: its weights, or a config-only folder's tensors.json).
// Throws UsageError for a component the model does not have (naming the ones it has),
// protocol::Error 66 for a missing file, and protocol::ModelError (65) naming the flag and file
// for everything else.
// `hash`: with each file's SHA-256 (a read of the whole file: about a second per GB; `plan` skips it).
// `model_file`: --model FILE's path; the components from it are named as --model's.
std::vector<ComponentFile> check_component_files(const std::map<std::string, std::string>& files,
                                                 const strategies::ModelInfo& model,
                                                 const std::string& variant, bool hash = true,
                                                 const std::string& model_file = {});

}  // namespace dp::launcher
