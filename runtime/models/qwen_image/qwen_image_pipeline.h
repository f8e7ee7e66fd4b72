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

#include "runtime/parallel/parallel_context.h"
#include "runtime/pipeline/family_pipeline.h"
#include "runtime/pipeline/pipeline_common.h"  // pack_latents, unpack_latents: its latents packed 2x2

namespace dp::runtime {

class QwenImagePipeline : public FamilyPipeline {
  public:
    // Loads every component of `options.model_dir`, the transformer and the text encoder as this
    // rank's share of the mesh (`parallel` must outlive the pipeline). Throws ModelError naming what
    // is missing, corrupt, inconsistent or unsupported.
    // `parallel`: this rank's place, which must outlive the pipeline (default: one process).
    static std::unique_ptr<QwenImagePipeline> load(
        const PipelineOptions& options, const ParallelContext& parallel = ParallelContext::single());
    ~QwenImagePipeline() override;

    // The embeddings of `prompts`, cut to `max_sequence_length` (1 to 1024) tokens: each prompt's
    // kept tokens zero-padded to the longest, the mask 1 on its own tokens, and a warning where the
    // text was cut.
    Conditioning encode_prompts(const std::vector<std::string>& prompts, int max_sequence_length = 512) const;
    // Whether the components are kept on their devices (not with PipelineOptions::offload).
    bool components_kept() const;

  private:
    struct Components;
    QwenImagePipeline(std::unique_ptr<Components> c, strategies::ModelInfo model);

    Conditioning encode(const std::vector<std::string>& prompts,
                        const protocol::CallValues& arguments) const override;
    LatentShape latents(int width, int height) const override;
    SigmaSchedule sigma_schedule() const override { return SigmaSchedule::kEvenlySpaced; }
    std::shared_ptr<const void> hold_transformer() const override;
    at::Tensor predict(const at::Tensor& latents, const LatentShape& shape, const Conditioning& text,
                       double timestep, const protocol::CallValues& arguments,
                       const BlockRunner& blocks) const override;
    // true_cfg_guidance at the family's guidance scale.
    at::Tensor combine(const at::Tensor& negative, const at::Tensor& positive,
                       const protocol::CallValues& arguments) const override;
    at::Tensor decode(const at::Tensor& latents) const override;
    // QwenImageImg2ImgPipeline's: the VAE encoder, (x - latents_mean) / latents_std.
    ImageLatents encode_image(const at::Tensor& pixels) const override;
    at::Tensor image_latents(const at::Tensor& sample) const override;

    std::unique_ptr<Components> c_;
};

// QwenImagePipeline's true CFG: negative + scale (positive - negative), rescaled per token to the
// positive prediction's norm over the channels (the last dimension).
at::Tensor true_cfg_guidance(const at::Tensor& negative, const at::Tensor& positive, double scale);

}  // namespace dp::runtime
