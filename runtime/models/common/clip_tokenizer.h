#pragma once
// CLIP's tokenizer: the byte-level BPE tokenizer (bpe_tokenizer.h) in CLIP's configuration, read
// from a tokenizer folder (vocab.json, merges.txt and, when present, tokenizer_config.json /
// special_tokens_map.json, or tokenizer.json alone), giving the same ids as transformers'
// CLIPTokenizer; plus CLIP's bos + tokens + eos encoding, truncated and padded. The steps are in
// Note [byte-level BPE tokenization]. Light header: no LibTorch.

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/models/common/bpe_tokenizer.h"

namespace dp::runtime {

struct ClipEncoding {
    std::vector<int64_t> ids;        // bos, tokens, eos, then padding: exactly max_length ids
    int dropped_tokens = 0;          // tokens cut off by truncation (diffusers warns about them)
    std::vector<int64_t> truncated;  // the ids that were cut, for the warning's text
};

// GPT-2's printable symbol (UTF-8) for byte `b`: the alphabet of CLIP's vocab.json and merges.txt.
inline std::string clip_byte_symbol(unsigned char b) { return byte_level_symbol(b); }

class ClipTokenizer : public FlavoredBpeTokenizer<ClipTokenizer> {
  public:
    static BpeFlavor flavor() { return BpeFlavor::clip(); }

    // bos + tokens + eos, truncated and padded to max_length (77 unless configured).
    ClipEncoding encode(const std::string& text) const;
    ClipEncoding encode(const std::string& text, int max_length) const;

    // tokenizer_config.json's model_max_length where it is in [2, 4096], else CLIP's 77.
    int model_max_length() const;

  private:
    friend class FlavoredBpeTokenizer<ClipTokenizer>;
    explicit ClipTokenizer(BpeTokenizer base) : FlavoredBpeTokenizer(std::move(base)) {}
};

}  // namespace dp::runtime
