#pragma once
// Qwen2's tokenizer (Qwen-Image's tokenizer/): the byte-level BPE tokenizer (bpe_tokenizer.h) in
// Qwen2's configuration, giving the same ids as transformers' Qwen2Tokenizer: NFC only, Qwen2's
// split pattern, no "</w>", no bos/eos added, its added tokens (<|endoftext|>, <|im_start|>,
// <|im_end|>, the vision ones, ...) matched literally first. The steps are in
// Note [byte-level BPE tokenization]. Light header: no LibTorch.

#include <string>

#include "runtime/models/common/bpe_tokenizer.h"

namespace dp::runtime {

class Qwen2Tokenizer : public BpeTokenizer {
  public:
    // vocab.json + merges.txt (+ tokenizer_config.json's added_tokens_decoder, added_tokens.json),
    // or tokenizer.json alone (+ tokenizer_config.json). Throws ModelError naming the file at fault.
    static Qwen2Tokenizer from_folder(const std::string& dir);
    // From in-memory files, for tests: the added tokens come from `config_json`'s added_tokens_decoder.
    static Qwen2Tokenizer from_strings(const std::string& vocab_json, const std::string& merges_txt,
                                       const std::string& config_json, const std::string& where);

  private:
    explicit Qwen2Tokenizer(BpeTokenizer base) : BpeTokenizer(std::move(base)) {}
};

}  // namespace dp::runtime
