#pragma once
// The text-to-image pipeline of the SD3 family, as diffusers' StableDiffusion3Pipeline runs it:
// prompt -> CLIP-L and CLIP-G embeddings (T5 absent: zeros) -> flow-matching denoising with
// classifier-free guidance -> VAE decode (or pixel space) -> uint8 RGB.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dp::runtime {

class Communicator;
struct DeviceMapping;

struct PipelineOptions {
    std::string model_dir;                   // a diffusers folder with model_index.json
    std::optional<uint64_t> random_weights;  // set: the folder's configs with seeded random weights
    at::ScalarType dtype = at::kFloat;
    at::Device device = at::kCPU;
    int tp_rank = 0;  // tensor parallelism: this rank keeps shard tp_rank of tp_size of the transformer
    int tp_size = 1;
    // device_map: each component (and transformer block) on its own device; `device` must then be
    // the device of transformer block 0, where the latents live. nullptr: everything on `device`.
    std::shared_ptr<const DeviceMapping> device_map;
    // Training: every weight requires grad and parameters() lists it (WeightStore::keep_as_parameters).
    bool trainable = false;
};

// A batch of prompts through both CLIP encoders, as the pipeline conditions the transformer.
struct PromptEmbeddings {
    // [n, CLIP length + 1, joint_attention_dim]: CLIP's tokens, then one of T5's 256 zero
    // positions, which stands for all of them (tail_repeats; Note [constant text tail]).
    at::Tensor sequence;
    int64_t tail_repeats = 1;
    at::Tensor pooled;                    // [n, pooled_projection_dim]
    std::vector<std::string> truncation;  // per prompt: diffusers' truncation warning, or empty
};

class Sd3Transformer;

struct GenerateRequest {
    std::string prompt;
    std::string negative_prompt;
    uint64_t seed = 0;
    int steps = 28;
    double guidance_scale = 7.0;
    int width = 0;  // 0: the model's default (sample_size x VAE scale)
    int height = 0;
    std::function<void(int step, int steps)> on_step;  // called after each denoising step
};

struct GenerateResult {
    at::Tensor image;                   // [height, width, 3] uint8, CPU
    at::Tensor latents;                 // the final latents, fp32 CPU, before decoding
    std::vector<std::string> warnings;  // e.g. prompt truncation, as diffusers logs it
};

class Sd3Pipeline {
  public:
    // Loads every component of `options.model_dir`. Throws ModelError naming what is missing,
    // corrupt, inconsistent or unsupported.
    static std::unique_ptr<Sd3Pipeline> load(const PipelineOptions& options);
    ~Sd3Pipeline();

    // Validates the request (ModelError for sizes the model cannot take) and generates one image.
    GenerateResult generate(const GenerateRequest& request) const;
    // Several requests that share steps, guidance scale and size, through the model together.
    // Each keeps its own seed and noise; only the batched matmuls' shapes differ from one at a
    // time, which can move a pixel by one step of 255 (README "Seeds and determinism").
    std::vector<GenerateResult> generate_batch(const std::vector<GenerateRequest>& requests) const;

    // CFG parallelism: with a group of two, rank 0 of it runs the unconditional (negative) branch
    // and rank 1 the conditional one; they exchange noise predictions every step and both hold
    // the same latents. nullptr: both branches here, as one batch.
    void set_cfg_group(Communicator* group) { cfg_group_ = group; }
    // Ulysses context parallelism for the transformer (Sd3Transformer::set_sequence_group).
    void set_ulysses_group(Communicator* group);
    // The tensor-parallel group of PipelineOptions::tp_size ranks (Sd3Transformer::set_tensor_group).
    void set_tensor_group(Communicator* group);
    // Ring context parallelism for the transformer (Sd3Transformer::set_ring_group).
    void set_ring_group(Communicator* group);

    // The embeddings of `prompts` (no inference guard: a trainer gets gradients through them).
    PromptEmbeddings encode_prompts(const std::vector<std::string>& prompts) const;
    const Sd3Transformer& transformer() const;
    // With PipelineOptions::trainable: each component's weights by name ("transformer", ...).
    const std::vector<std::pair<std::string, std::vector<std::pair<std::string, at::Tensor>>>>& parameters()
        const;

    int default_width() const;
    int default_height() const;
    // Width and height must be multiples of this.
    int size_multiple() const;

  private:
    struct Components;
    explicit Sd3Pipeline(std::unique_ptr<Components> c);
    std::unique_ptr<Components> c_;
    Communicator* cfg_group_ = nullptr;
};

}  // namespace dp::runtime
