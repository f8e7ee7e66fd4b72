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

}  // namespace dp::strategies
