#pragma once
// A batch of prompts as a text encoder's ids, with the warnings diffusers logs for each prompt the
// tokenizer cuts: what every family's encode does before its encoders run. Light: no LibTorch.

#include <cstdint>
#include <string>
#include <vector>

namespace dp::runtime {

class ClipTokenizer;
class T5Tokenizer;

// CLIP's ids of `prompts`, a row of its model_max_length each, flattened. With `warnings` (one
// entry per prompt), diffusers' warning for each prompt cut goes there.
std::vector<int64_t> clip_ids(const ClipTokenizer& tokenizer, const std::vector<std::string>& prompts,
                              std::vector<std::string>* warnings);
// T5's ids of `prompts`, max_length each (cut or padded), flattened; diffusers' warning for each
// prompt cut is added to its entry of `warnings` (after "; " when it holds one already).
std::vector<int64_t> t5_ids(const T5Tokenizer& tokenizer, const std::vector<std::string>& prompts,
                            int max_length, std::vector<std::string>& warnings);

}  // namespace dp::runtime
