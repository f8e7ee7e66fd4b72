#pragma once
// Note [adapter files are checked first]: every LoRA adapter a job names (--lora, a prompt line's
// "lora") is read here before any rank starts, once per file: it must exist (66), be a valid
// safetensors file (65, truncation included) and change only weights of this model, each with its
// own shape (strategies::read_lora_layout), hold no NaN or infinity (strategies::check_lora_values:
// every value read once, as the SHA-256 reads every byte), and its scale must be finite. The requests then
// carry each file's absolute path and SHA-256, so that every rank reads the same file, the manifest records
// which one made an image, and --resume sees a changed file as other pixels. No LibTorch.

#include <map>
#include <memory>
#include <string>

#include "protocol/call_arguments.h"
#include "strategies/lora.h"
#include "strategies/model_config.h"

namespace dp::launcher {

class AdapterFiles {
  public:
    // For the model `model` (its `variant`'s weights).
    AdapterFiles(const strategies::ModelInfo& model, std::string variant);

    // Why `adapters` cannot run on the model (the first problem, naming the file), or empty.
    std::string problem(const protocol::Adapters& adapters);
    // Throws protocol::Error (66 for a missing file, else 65) for the first problem, after `source`
    // ("--lora").
    void check(const protocol::Adapters& adapters, const std::string& source);
    // The adapters of `values` (its "lora" row, if any) with each file's absolute path and SHA-256.
    // They must have been checked.
    void resolve(protocol::CallValues& values);
    // The layout of a checked adapter file (what plan reports).
    const strategies::LoraLayout& layout(const std::string& path);
    // The model's tensors an adapter may change (read with the first file).
    const strategies::ModelTensors& tensors() const { return *tensors_; }

  private:
    struct File {
        std::string absolute, sha256, problem;
        int exit_code = 0;
        strategies::LoraLayout layout;
    };
    const File& file(const std::string& path);

    const strategies::ModelInfo* model_;
    std::string variant_;
    std::shared_ptr<const strategies::ModelTensors> tensors_;
    std::map<std::string, File> files_;
};

}  // namespace dp::launcher
