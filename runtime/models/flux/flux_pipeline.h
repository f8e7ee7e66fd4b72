#pragma once
// FLUX.1's pipelines, as diffusers' FluxPipeline runs text to image (dev and schnell): each prompt
// through CLIP-L (CLIPTextModel's pooled output, 77 tokens) and T5 (max_sequence_length tokens,
// padded, no mask) -> flow-matching denoising of packed 2x2 latents over explicit sigmas with the
// image's dynamic shift (dev) or none (schnell), dev's distilled guidance scale embedded, true CFG
// only with a negative prompt and a scale above 1 -> the VAE decode (scale and shift) -> uint8 RGB.
// The same weights edit as FluxImg2ImgPipeline and FluxInpaintPipeline do (Note [img2img in the one
// loop]); a FLUX.1-Fill folder runs FluxFillPipeline (the masked image's latents and the mask beside
// the latents on channels) and a FLUX.1-Kontext folder FluxKontextPipeline (a reference image's
// latents appended as tokens of position index 1): Note [edit conditioning].

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/parallel/parallel_context.h"
#include "runtime/pipeline/family_pipeline.h"

namespace dp::runtime {

// A batch of prompts through the text encoders, as the pipeline conditions the transformer.
struct FluxPromptEmbeddings {
    at::Tensor sequence;  // [n, max_sequence_length, joint_attention_dim]: T5's last hidden state
    at::Tensor pooled;    // [n, pooled_projection_dim]: CLIP's pooled output
    std::vector<std::string> truncation;  // per prompt: diffusers' truncation warnings, or empty
};

class FluxPipeline : public FamilyPipeline {
  public:
    // Loads every component of `options.model_dir`, the transformer and T5 as this rank's share of
    // the mesh (`parallel` must outlive the pipeline). Throws ModelError naming what is missing,
    // corrupt, inconsistent or unsupported.
    // `parallel`: this rank's place, which must outlive the pipeline (default: one process).
    static std::unique_ptr<FluxPipeline> load(const PipelineOptions& options,
                                              const ParallelContext& parallel = ParallelContext::single());
    ~FluxPipeline() override;

    // The embeddings of `prompts` (FluxPipeline's prompt_2 is the prompt itself), T5's cut or padded
    // to `max_sequence_length` (1 to 512) tokens.
    FluxPromptEmbeddings encode_prompts(const std::vector<std::string>& prompts,
                                        int max_sequence_length = 512) const;
    // Whether the components are kept on their devices (not with PipelineOptions::offload).
    bool components_kept() const;
    // Whether the transformer embeds the guidance scale (FLUX.1-dev; schnell ignores it).
    bool guidance_embeds() const;

  private:
    struct Components;
    FluxPipeline(std::unique_ptr<Components> c, strategies::ModelInfo model);

    Conditioning encode(const std::vector<std::string>& prompts,
                        const protocol::CallValues& arguments) const override;
    LatentShape latents(int width, int height) const override;
    SigmaSchedule sigma_schedule() const override { return SigmaSchedule::kEvenlySpacedUnlessFlowSigmas; }
    std::shared_ptr<const void> hold_transformer() const override;
    at::Tensor predict(const at::Tensor& latents, const LatentShape& shape, const Conditioning& text,
                       double timestep, const protocol::CallValues& arguments,
                       const BlockRunner& blocks) const override;
    at::Tensor decode(const at::Tensor& latents) const override;
    // FluxImg2ImgPipeline's: the VAE encoder, (x - shift_factor) x scaling_factor.
    ImageLatents encode_image(const at::Tensor& pixels) const override;
    at::Tensor image_latents(const at::Tensor& sample) const override;
    // Fill: the masked image (its latent distribution) and the mask's pixels under each latent;
    // Kontext: the image at its reference size (its mean).
    std::optional<EditCondition> edit_condition(const protocol::InputImage& image,
                                                const protocol::InputImage& mask,
                                                const LatentShape& shape) const override;
    bool edit_starts_from_image() const override { return pipeline_ != Kind::kKontext; }

    // Which of FLUX.1's pipelines the folder is (its model_index.json's class).
    enum class Kind { kText, kFill, kKontext };
    std::unique_ptr<Components> c_;
    Kind pipeline_ = Kind::kText;
};

}  // namespace dp::runtime
