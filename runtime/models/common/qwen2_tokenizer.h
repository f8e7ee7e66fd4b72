#pragma once
// Qwen2's tokenizer (Qwen-Image's tokenizer/): the byte-level BPE tokenizer (bpe_tokenizer.h) in
// Qwen2's configuration, giving the same ids as transformers' Qwen2Tokenizer: NFC only, Qwen2's
// split pattern, no "</w>", no bos/eos added, its added tokens (<|endoftext|>, <|im_start|>,
// <|im_end|>, the vision ones, ...) matched literally first. The steps are in
// Note [byte-level BPE tokenization]. Light header: no LibTorch.

#include <string>

#include "runtime/models/common/bpe_tokenizer.h"

namespace dp::runtime {

// from_folder reads vocab.json + merges.txt (+ tokenizer_config.json's added_tokens_decoder,
// added_tokens.json), or tokenizer.json alone (+ tokenizer_config.json); from_strings takes the
// added tokens from `config_json`'s added_tokens_decoder.
class Qwen2Tokenizer : public FlavoredBpeTokenizer<Qwen2Tokenizer> {
  public:
    static BpeFlavor flavor() { return BpeFlavor::qwen2(); }

  private:
    friend class FlavoredBpeTokenizer<Qwen2Tokenizer>;
    explicit Qwen2Tokenizer(BpeTokenizer base) : FlavoredBpeTokenizer(std::move(base)) {}
};

}  // namespace dp::runtime
