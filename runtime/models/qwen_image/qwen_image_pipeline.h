#pragma once
// Qwen-Image's text-to-image pipeline, as diffusers' QwenImagePipeline runs it: each prompt in its
// chat template through the Qwen2.5-VL language model (the template's first tokens dropped, the
// rest of the last hidden state kept with its mask) -> flow-matching denoising of packed 2x2
// latents over explicit sigmas with the image's dynamic shift, true CFG with the rescale to the
// conditional prediction's norm (only with a negative prompt and a scale above 1) -> the one-frame
// VAE decode -> uint8 RGB.
//
// Note [Qwen-Image edits]: QwenImageEditPipeline and QwenImageEditPlusPipeline folders load as the
// same pipeline with the text encoder's vision tower and the processor. A line's image (a list of
// pictures for Edit-Plus) is resized twice from the original, as diffusers does: for the vision
// encoder (Edit: 1024 x 1024 pixels' area at its ratio, Edit-Plus: 384 x 384's; then the
// processor's own resize) and for the VAE (1024 x 1024's). The prompt goes in the edit template
// with the pictures' vision tokens inside it ("Picture 1: ..." for Edit-Plus), 64 tokens dropped;
// the negative prompt gets the same pictures. Each picture's latents (the mean, normalised,
// packed) follow the noise in the image stream with frame positions 1, 2, ... (img_shapes), and
// the prediction is the noise's part. The steps start from noise; the dynamic shift counts the
// noise's tokens only.

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
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
    // The embeddings of `prompts` in the edit template with `image`'s pictures (Note [Qwen-Image
    // edits]); `sequential`: diffusers' shipped positions (Note [Qwen2.5-VL positions with
    // images]). Throws ModelError when the folder has no vision tower (a QwenImagePipeline's).
    Conditioning encode_edit_prompts(const std::vector<std::string>& prompts,
                                     const protocol::InputImage& image, bool sequential = false) const;
    // Whether the components are kept on their devices (not with PipelineOptions::offload).
    bool components_kept() const;

  private:
    struct Components;
    enum class Kind { kText, kEdit, kEditPlus };
    QwenImagePipeline(std::unique_ptr<Components> c, strategies::ModelInfo model);
    // Each picture's size for the VAE (the reference's), in pixels: {width, height}.
    std::vector<std::pair<int64_t, int64_t>> reference_sizes(const protocol::InputImage& image) const;

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
    // The edit pipelines' pictures, packed after one another (Note [Qwen-Image edits]).
    std::optional<EditCondition> edit_condition(const protocol::InputImage& image,
                                                const protocol::InputImage& mask,
                                                const LatentShape& shape) const override;
    bool edit_starts_from_image() const override { return kind_ == Kind::kText; }

    std::unique_ptr<Components> c_;
    Kind kind_ = Kind::kText;
};

// QwenImagePipeline's true CFG: negative + scale (positive - negative), rescaled per token to the
// positive prediction's norm over the channels (the last dimension).
at::Tensor true_cfg_guidance(const at::Tensor& negative, const at::Tensor& positive, double scale);

}  // namespace dp::runtime
