#pragma once
// Mistral 3's tokenizer (FLUX.2-dev's tokenizer/, tekken as tokenizer.json): the byte-level BPE
// tokenizer (bpe_tokenizer.h) giving the same ids as transformers' tokenizer of that file: no
// normalizer, the split pattern the file's Split pre-tokenizer carries (tekken's or Llama 3's),
// ignore_merges (a piece in the vocabulary is one token), its control tokens ([INST],
// [SYSTEM_PROMPT], <s>, <pad>, ...) matched literally first. Light header: no LibTorch.

#include <string>

#include "runtime/models/common/bpe_tokenizer.h"

namespace dp::runtime {

// from_folder reads tokenizer.json (+ tokenizer_config.json); a vocab.json + merges.txt folder has
// no split pattern and is refused naming the file.
class MistralTokenizer : public FlavoredBpeTokenizer<MistralTokenizer> {
  public:
    static BpeFlavor flavor() { return BpeFlavor::mistral(); }

  private:
    friend class FlavoredBpeTokenizer<MistralTokenizer>;
    explicit MistralTokenizer(BpeTokenizer base) : FlavoredBpeTokenizer(std::move(base)) {}
};

}  // namespace dp::runtime
