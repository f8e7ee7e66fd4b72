#pragma once
// What a diffusers model folder's config files say, read through its family's parallel spec (no
// LibTorch): which family it is, and the transformer's shape. The launcher, `dp-launch plan` and
// the worker read these facts here, so that a default is written once, in the spec.

#include <string>

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

}  // namespace dp::strategies
