#pragma once
// T5's SentencePiece tokenizer (SD3's and FLUX's tokenizer_3), read from a tokenizer folder
// (spiece.model, and tokenizer.json when present), giving the same ids as the T5TokenizerFast that
// diffusers loads from that folder. Light header: no LibTorch, no sentencepiece.
//
// Note [T5 tokenization]: transformers runs T5's unigram model through the tokenizers library,
// which does not segment the way SentencePiece's own Encode does. Its steps, followed here: added
// tokens written literally in the text (<pad>, </s>, <unk>, <extra_id_N>) are matched first,
// leftmost longest; each span between them is normalised with the model's precompiled charsmap
// one grapheme cluster at a time (a cluster under 6 bytes is replaced whole by the mapping of its
// shortest mapped prefix, a longer one code point by code point), split at Unicode white space,
// and each word gets a leading "▁" and is split again before every further "▁". libsentencepiece
// then finds the best segmentation of each such piece, its own normaliser switched off.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dp::runtime {

struct T5Encoding {
    std::vector<int64_t> ids;        // exactly max_length ids: tokens, </s>, then <pad> (0)
    int64_t dropped_tokens = 0;      // tokens cut off by truncation (diffusers warns about them)
    std::vector<int64_t> truncated;  // the ids that were cut, for the warning's text
};

class T5Tokenizer {
  public:
    // `dir` holds spiece.model, and usually tokenizer.json (its added tokens are used, and its
    // vocabulary must be spiece.model's); without tokenizer.json, T5's <pad>, </s>, <unk> and
    // tokenizer_config.json's extra_ids (100 by default) sentinels. Throws ModelError naming the
    // folder or file when spiece.model is missing, unreadable or inconsistent with tokenizer.json.
    static T5Tokenizer from_folder(const std::string& dir);

    // As diffusers calls it: padding="max_length", truncation=True, add_special_tokens=True, so
    // the first max_length - 1 tokens, then </s>, then pads. max_length must be at least 1.
    T5Encoding encode(const std::string& text, int max_length) const;
    // The tokens of `text` without </s>, untruncated.
    std::vector<int64_t> tokenize(const std::string& text) const;
    // The text of ids as tokenizer.batch_decode gives it (special tokens kept as written, "▁" as
    // a space, the first one dropped), for the truncation warning. Unknown ids are skipped.
    std::string decode(const std::vector<int64_t>& ids) const;

    // Every id the tokenizer can give: the SentencePiece pieces and the added tokens.
    int64_t vocab_size() const;
    int64_t eos_id() const;
    int64_t pad_id() const;

  private:
    struct Impl;
    explicit T5Tokenizer(std::shared_ptr<const Impl> impl);
    std::shared_ptr<const Impl> impl_;  // immutable once loaded: copies share it, encode is thread-safe
};

}  // namespace dp::runtime
