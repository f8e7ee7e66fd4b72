#pragma once
// The text-to-image pipeline of the SD3 family, as diffusers' StableDiffusion3Pipeline runs it:
// prompt -> CLIP-L, CLIP-G and T5-XXL embeddings (T5 absent or --no-t5: zeros) -> flow-matching
// denoising with classifier-free and skip-layer guidance -> VAE decode (or pixel space) -> uint8 RGB.

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/parallel/parallel_context.h"
#include "runtime/pipeline/family_pipeline.h"

namespace dp::runtime {

class Sd3Transformer;

// A batch of prompts through the text encoders, as the pipeline conditions the transformer.
struct PromptEmbeddings {
    // [n, CLIP length + max_sequence_length, joint_attention_dim]: CLIP's tokens, then T5's. Without
    // T5, [n, CLIP length + 1, ...]: one of T5's zero positions stands for all of them
    // (tail_repeats; Note [constant text tail]).
    at::Tensor sequence;
    int64_t tail_repeats = 1;
    at::Tensor pooled;                    // [n, pooled_projection_dim]
    std::vector<std::string> truncation;  // per prompt: diffusers' truncation warning, or empty
};

class Sd3Pipeline : public FamilyPipeline {
  public:
    // Loads every component of `options.model_dir`, the transformer as this rank's shard of the
    // mesh (`parallel` must outlive the pipeline). Throws ModelError naming what is missing,
    // corrupt, inconsistent or unsupported.
    // `parallel`: this rank's place, which must outlive the pipeline (default: one process).
    static std::unique_ptr<Sd3Pipeline> load(const PipelineOptions& options,
                                             const ParallelContext& parallel = ParallelContext::single());
    ~Sd3Pipeline() override;

    // The embeddings of `prompts` (no inference guard: a trainer gets gradients through them).
    PromptEmbeddings encode_prompts(const std::vector<std::string>& prompts,
                                    int max_sequence_length = 256) const;
    // Throws InternalError with PipelineOptions::offload (nothing is kept).
    const Sd3Transformer& transformer() const;
    // With PipelineOptions::trainable: each component's weights by name ("transformer", ...).
    const std::vector<std::pair<std::string, std::vector<std::pair<std::string, at::Tensor>>>>& parameters()
        const;

  private:
    struct Components;
    Sd3Pipeline(std::unique_ptr<Components> c, strategies::ModelInfo model);

    Conditioning encode(const std::vector<std::string>& prompts,
                        const protocol::CallValues& arguments) const override;
    LatentShape latents(int width, int height) const override;
    std::shared_ptr<const void> hold_transformer() const override;
    at::Tensor predict(const at::Tensor& latents, const LatentShape& shape, const Conditioning& text,
                       double timestep, const protocol::CallValues& arguments,
                       const BlockRunner& blocks) const override;
    // Skip-layer guidance, as diffusers: on the steps strictly inside (start, stop) x steps, the
    // positive branch once more with the blocks skipped, and the noise moved away from it.
    bool extra_at(int step, int steps, const protocol::CallValues& arguments) const override;
    at::Tensor predict_extra(const at::Tensor& latents, const LatentShape& shape,
                             const Conditioning& positive, double timestep,
                             const protocol::CallValues& arguments) const override;
    at::Tensor combine_extra(const at::Tensor& negative, const at::Tensor& positive, const at::Tensor& extra,
                             const protocol::CallValues& arguments) const override;
    at::Tensor decode(const at::Tensor& latents) const override;
    at::Tensor decode_inpainted(const at::Tensor& latents) const override;
    const char* decoder() const override;
    // StableDiffusion3Img2ImgPipeline's: the VAE encoder, (x - shift_factor) x scaling_factor; in
    // pixel space (no VAE) the image itself.
    ImageLatents encode_image(const at::Tensor& pixels) const override;
    at::Tensor image_latents(const at::Tensor& sample) const override;
    // StableDiffusion3InpaintPipeline blends a mask only for a transformer of 16 latent channels.
    std::string inpainting_refusal() const override;

    std::unique_ptr<Components> c_;
};

}  // namespace dp::runtime
