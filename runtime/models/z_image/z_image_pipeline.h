#pragma once
// Z-Image's text-to-image pipeline, as diffusers' ZImagePipeline runs it: each prompt in Qwen3's
// chat template (one user message, the generation prompt, thinking enabled: no empty think block)
// through the Qwen3 text encoder, its hidden_states[-2] kept over the prompt's own tokens ->
// flow-matching denoising of 16-channel latents (unpacked: the transformer cuts its own patches)
// over explicit sigmas (1 down to 1 / steps, then the scheduler's shift), the transformer given
// 1 - sigma and its output negated -> the VAE decode (scale and shift) -> uint8 RGB.
//
// Note [Z-Image guidance]: guidance_scale g runs a negative branch when above 0 (the negative
// prompt "" unless given) and combines as positive + g (positive - negative), in fp32. With
// cfg_normalization X > 0 a guided prediction whose norm (over the whole image's latents) exceeds
// X times the positive one's is scaled down to it. With cfg_truncation X < 1 the steps whose
// (1000 - timestep) / 1000 exceeds X take the positive prediction alone. Z-Image-Turbo ships
// guidance 0: one branch, no negative prompt encoded.

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/parallel/parallel_context.h"
#include "runtime/pipeline/family_pipeline.h"

namespace dp::runtime {

class ZImagePipeline : public FamilyPipeline {
  public:
    // Loads every component of `options.model_dir`, the transformer and the text encoder as this
    // rank's share of the mesh (`parallel` must outlive the pipeline). Throws ModelError naming what
    // is missing, corrupt, inconsistent or unsupported.
    static std::unique_ptr<ZImagePipeline> load(const PipelineOptions& options,
                                                const ParallelContext& parallel = ParallelContext::single());
    ~ZImagePipeline() override;

    // The text conditioning of `prompts` (one branch): each prompt's hidden states and mask, its
    // templated text cut at `max_sequence_length` tokens (1 to 512) as the tokenizer cuts it.
    Conditioning encode_prompts(const std::vector<std::string>& prompts, int max_sequence_length = 512) const;
    // Whether the components are kept on their devices (not with PipelineOptions::offload).
    bool components_kept() const;

  private:
    struct Components;
    ZImagePipeline(std::unique_ptr<Components> c, strategies::ModelInfo model);

    Conditioning encode(const std::vector<std::string>& prompts,
                        const protocol::CallValues& arguments) const override;
    LatentShape latents(int width, int height) const override;
    SigmaSchedule sigma_schedule() const override { return SigmaSchedule::kEvenlySpaced; }
    std::shared_ptr<const void> hold_transformer() const override;
    at::Tensor predict(const at::Tensor& latents, const LatentShape& shape, const Conditioning& text,
                       double timestep, const protocol::CallValues& arguments,
                       const BlockRunner& blocks) const override;
    at::Tensor combine(const at::Tensor& negative, const at::Tensor& positive,
                       const protocol::CallValues& arguments) const override;
    bool guided_at(double timestep, const protocol::CallValues& arguments) const override;
    at::Tensor decode(const at::Tensor& latents) const override;

    std::unique_ptr<Components> c_;
};

}  // namespace dp::runtime
