#pragma once
// FLUX.2's pipelines, as diffusers' Flux2KleinPipeline (FLUX.2 [klein]) and Flux2Pipeline (FLUX.2
// [dev]) run them (docs/flux2-reference.md, section 3): each prompt in its text encoder's template
// (Note [FLUX.2 prompts]), padded to max_sequence_length and cut there, through the text encoder
// with its mask; three hidden states side by side per token, every token (the pads too) the
// transformer's text -> flow-matching denoising of noise drawn already patchified ([4 L, h / 2,
// w / 2], a token per position) over linspace sigmas shifted by the pipeline's empirical mu, with
// any reference pictures (`image`, one or several) appended as tokens of their own -> the VAE
// decode of the de-normalized, unpatchified latents. model_index.json's class says which.
//
// Note [FLUX.2 prompts]: klein's Qwen3 takes Qwen3's chat template of one user message with the
// generation prompt and thinking disabled (an empty think block), right-padded, hidden states 9,
// 18 and 27. dev's Mistral 3 takes Mistral-Small-3.1's template of Flux2Pipeline's system
// message and the prompt, `<s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]{prompt}[/INST]`, with every
// [IMG] removed from the prompt, padded on the side its tokenizer_config.json's padding_side
// names (right when it names none, as transformers' tokenizers backend), hidden states 10, 20
// and 30. dev's guidance scale is embedded (the transformer's guidance embedder): one branch.
//
// Note [FLUX.2 klein guidance]: the step-distilled releases (model_index.json's is_distilled)
// run one branch whatever guidance_scale says (diffusers warns and ignores it: the family's
// argument is "ignored"); the -base releases (the family's variant) run the negative branch above
// 1 with the prompt "" (a line's negative_prompt stands for the negative_prompt_embeds a caller of
// diffusers may pass) and combine as negative + g (positive - negative).
//
// Note [FLUX.2 references]: each picture (at least 64 pixels a side, sides within a ratio of 8)
// is resized to 1024 x 1024 pixels' area at its ratio when it is larger (PIL's Lanczos), then its
// centre cut to multiples of twice the VAE's scale without resizing; the VAE's posterior mode,
// patchified and normalized, packed: picture i's tokens at ids (10 + 10 i, row, column, 0), after
// the noise's at (0, row, column, 0). They are encoded once for a batch (EditCondition::ready) and
// go through the transformer at every step beside the noise; their outputs are dropped. An edit's
// default size is its first picture's after the cut.

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/parallel/parallel_context.h"
#include "runtime/pipeline/family_pipeline.h"

namespace dp::runtime {

class Flux2Pipeline : public FamilyPipeline {
  public:
    // Loads every component of `options.model_dir`, the transformer and the text encoder as this
    // rank's share of the mesh (`parallel` must outlive the pipeline). Throws ModelError naming what
    // is missing, corrupt, inconsistent or unsupported.
    static std::unique_ptr<Flux2Pipeline> load(const PipelineOptions& options,
                                               const ParallelContext& parallel = ParallelContext::single());
    ~Flux2Pipeline() override;

    // The text conditioning of `prompts` (one branch): each prompt's templated tokens padded (or
    // cut) to `max_sequence_length` (1 to 512), their stacked hidden states [n, max_sequence_length,
    // 3 x hidden_size] with no mask (every token goes on).
    Conditioning encode_prompts(const std::vector<std::string>& prompts, int max_sequence_length = 512) const;
    // Whether the components are kept on their devices (not with PipelineOptions::offload).
    bool components_kept() const;

  private:
    struct Components;
    Flux2Pipeline(std::unique_ptr<Components> c, strategies::ModelInfo model);

    Conditioning encode(const std::vector<std::string>& prompts,
                        const protocol::CallValues& arguments) const override;
    LatentShape latents(int width, int height) const override;
    SigmaSchedule sigma_schedule() const override { return SigmaSchedule::kEvenlySpacedUnlessFlowSigmas; }
    double shift_mu(int64_t tokens, int steps, const nlohmann::json& scheduler) const override;
    std::shared_ptr<const void> hold_transformer() const override;
    at::Tensor predict(const at::Tensor& latents, const LatentShape& shape, const Conditioning& text,
                       double timestep, const protocol::CallValues& arguments,
                       const BlockRunner& blocks) const override;
    at::Tensor decode(const at::Tensor& latents) const override;
    ImageLatents encode_image(const at::Tensor& pixels) const override;
    std::optional<EditCondition> edit_condition(const protocol::InputImage& image,
                                                const protocol::InputImage& mask,
                                                const LatentShape& shape) const override;
    bool edit_starts_from_image() const override { return false; }
    // Each picture's size after its resize and cut (Note [FLUX.2 references]), in order.
    std::vector<std::pair<int64_t, int64_t>> reference_sizes(const protocol::InputImage& image) const;

    std::unique_ptr<Components> c_;
};

}  // namespace dp::runtime
