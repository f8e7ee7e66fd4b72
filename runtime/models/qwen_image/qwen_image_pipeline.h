#pragma once
// Qwen-Image's text-to-image pipeline, as diffusers' QwenImagePipeline runs it: each prompt in its
// chat template through the Qwen2.5-VL language model (the template's first tokens dropped, the
// rest of the last hidden state kept with its mask) -> flow-matching denoising of packed 2x2
// latents over explicit sigmas with the image's dynamic shift, true CFG with the rescale to the
// conditional prediction's norm (only with a negative prompt and a scale above 1) -> the one-frame
// VAE decode -> uint8 RGB.

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/models/common/pipeline_common.h"  // pack_latents, unpack_latents: its latents packed 2x2
#include "runtime/pipeline.h"

namespace dp::runtime {

// A batch of prompts through the text encoder, as the pipeline conditions the transformer.
struct QwenPromptEmbeddings {
    at::Tensor sequence;  // [n, T, hidden]: each prompt's kept tokens, zero-padded to the longest
    at::Tensor mask;      // [n, T] int64: 1 for a prompt's own tokens, 0 for padding
    std::vector<int64_t> lengths;         // each prompt's kept tokens
    std::vector<std::string> truncation;  // per prompt: a warning that text was cut, or empty
};

class QwenImagePipeline : public DiffusionPipeline {
  public:
    // Loads every component of `options.model_dir`, the transformer and the text encoder as this
    // rank's share of the mesh (`parallel` must outlive the pipeline). Throws ModelError naming what
    // is missing, corrupt, inconsistent or unsupported.
    static std::unique_ptr<QwenImagePipeline> load(const PipelineOptions& options, const ParallelContext& parallel);
    static std::unique_ptr<QwenImagePipeline> load(const PipelineOptions& options);  // one process
    ~QwenImagePipeline() override;

    std::vector<GenerateResult> generate_batch(const std::vector<GenerateRequest>& requests) const override;

    // The embeddings of `prompts`, cut to `max_sequence_length` (1 to 1024) tokens.
    QwenPromptEmbeddings encode_prompts(const std::vector<std::string>& prompts, int max_sequence_length = 512) const;
    // Whether the components are kept on their devices (not with PipelineOptions::offload).
    bool components_kept() const;

    int default_width() const override;
    int default_height() const override;
    int size_multiple() const override;

  private:
    struct Components;
    explicit QwenImagePipeline(std::unique_ptr<Components> c);
    std::unique_ptr<Components> c_;
};

// QwenImagePipeline's true CFG: negative + scale (positive - negative), rescaled per token to the
// positive prediction's norm over the channels (the last dimension).
at::Tensor true_cfg_guidance(const at::Tensor& negative, const at::Tensor& positive, double scale);

}  // namespace dp::runtime
