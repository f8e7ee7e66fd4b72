#pragma once
// What a diffusers model folder's config files say, read through its family's parallel spec (no
// LibTorch): which family it is, and the transformer's shape. The launcher, `dp-launch plan` and
// the worker read these facts here, so that a default is written once, in the spec.

#include <set>
#include <string>
#include <vector>

#include "protocol/call_arguments.h"
#include "protocol/job_file.h"
#include "strategies/parallel_spec.h"

namespace dp::strategies {

// The spec of the family named by `model_dir`/model_index.json's _class_name. Throws
// protocol::ModelError naming the file when it cannot be read or has no _class_name, and the
// file, the class and the supported classes when no family has that pipeline class.
const ParallelSpec& parallel_spec_for_model(const std::string& model_dir);

// The transformer's shape from `model_dir`/<spec.transformer>/config.json through the spec's
// keys; a key the file leaves out takes the spec's transformer_defaults. Throws
// protocol::ModelError naming the file (and the key) when it cannot be read, is not a JSON
// object, or a value is not a positive integer, or a required key is missing.
TransformerShape read_transformer_shape(const std::string& model_dir, const ParallelSpec& spec);

// The file in a model folder that holds its own call-argument defaults (Note [a model's own
// defaults], model_config.cpp).
inline constexpr const char* kGenerationDefaultsFile = "generation_defaults.json";

// The call arguments `model_dir`'s pipeline takes, with their defaults: its family's, or its
// variant's (ParallelSpec::variant_key: FLUX.1-schnell's transformer has no guidance_embeds),
// with those the folder's generation_defaults.json sets in their place. Throws
// protocol::ModelError naming the file.
protocol::FamilyArguments call_arguments_for_model(const std::string& model_dir, const ParallelSpec& spec);
// The id of `model_dir`'s family in the call-argument table: its variant's ("flux-schnell") or
// the family's ("flux").
std::string family_for_model(const std::string& model_dir, const ParallelSpec& spec);
// How messages name `model_dir`'s family: its variant's name ("FLUX.1-schnell") or the family's.
std::string family_name_for_model(const std::string& model_dir, const ParallelSpec& spec);

// The image sizes a model can make, from its configs (diffusers' SD3 rule): width and height are
// multiples of vae_scale x patch_size pixels, and at most max_patches patches along each side.
struct ImageSizeRule {
    int64_t vae_scale = 1;     // pixels per latent: 2^(len(vae block_out_channels) - 1); 1 without a VAE
    int64_t patch_size = 1;    // latents per patch
    int64_t max_patches = 0;   // the position table's side (pos_embed_max_size)
    int64_t default_side = 0;  // the width and height made when none is asked for: sample_size x vae_scale

    int64_t multiple() const { return vae_scale * patch_size; }
    int64_t max_side() const { return max_patches * multiple(); }
    // Empty when a side of `pixels` works; else why not and the nearest sizes that do, e.g.
    // "not a multiple of 8 up to 1024 pixels for this model (nearest: 32 or 40)".
    std::string check(int64_t pixels) const;
};

// The rule of `model_dir`: model_index.json says whether there is a VAE, vae/config.json its
// block_out_channels, the transformer's config.json the patch, sample and position-table sizes
// (a key it leaves out takes diffusers' default). Throws protocol::ModelError naming the file.
ImageSizeRule read_image_size_rule(const std::string& model_dir, const ParallelSpec& spec);

// What a job asks of a model folder beyond its shape.
struct ModelNeeds {
    std::string variant;          // the weight files of this variant (Note [weight variants], model_files.h)
    bool no_t5 = false;           // the T5 encoder is not loaded, so its folders need nothing
    bool random_weights = false;  // weights are not read: only configs and tokenizers matter
    // Components whose weights come from one file (--transformer FILE): their folders need configs only.
    std::set<std::string> from_files;
};

// Every reason the ranks would refuse `model_dir` for a job with `needs`, found from its files
// without loading anything: model_index.json's components missing or of a class the family does
// not run (SD3: CLIP and T5 text encoders, T5TokenizerFast or T5Tokenizer with spiece.model, the
// SD3 transformer, AutoencoderKL, the flow-match scheduler), a component folder, config,
// tokenizer file or weight file that is missing or not a regular file, and configs that do not fit
// together (dual_attention_layers outside the blocks, T5's d_model against the transformer's
// joint_attention_dim). Each entry names the file or key and what would work. Empty: it loads as
// far as its files tell. A config-only folder's missing weights (tensors.json, no *.safetensors)
// are not listed: components_without_weights (model_sizes.h) says that.
std::vector<std::string> model_folder_problems(const std::string& model_dir, const ParallelSpec& spec,
                                               const ModelNeeds& needs);

// The components of `spec` that `model_dir`'s model_index.json names a class for, in the spec's
// order: what its pipeline has (an SD3 folder without T5 says "text_encoder_3": [null, null], a
// pixel-space model "vae": [null, null]). Throws protocol::ModelError naming the file.
std::vector<std::string> folder_components(const std::string& model_dir, const ParallelSpec& spec);

// Note [a model is read once]: what the launcher and the worker need to know of a model folder,
// read once by each (the launcher's job, `plan` and `arguments`; the worker at its start) and
// passed down, rather than read again wherever a fact is needed.
struct ModelInfo {
    std::string dir;
    const ParallelSpec* spec = nullptr;
    std::string family;       // the call-argument table's id: "sd3", "flux", "flux-schnell", "qwen-image"
    std::string family_name;  // how messages name it: "SD3", "FLUX.1-schnell"
    TransformerShape shape;
    ImageSizeRule sizes;
    protocol::FamilyArguments arguments;  // with the folder's generation_defaults.json
};

// Throws protocol::ModelError naming the file that cannot be read or is not supported.
ModelInfo read_model_info(const std::string& model_dir);

// What a job file's reader checks of its family (protocol::read_job_file's `check`): the family is
// one this build runs, and each request holds only call arguments it reads (one it leaves out is
// the model's default). Throws protocol::InputDataError naming the key.
void check_job_family(const protocol::JobFile& job);

}  // namespace dp::strategies
