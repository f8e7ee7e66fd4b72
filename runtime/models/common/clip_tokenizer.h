#pragma once
// CLIP's byte-level BPE tokenizer, read from a tokenizer folder (vocab.json, merges.txt and,
// when present, tokenizer_config.json / special_tokens_map.json), giving the same ids as
// transformers' CLIPTokenizer.
//
// Note [CLIP tokenization]: the steps follow transformers' tokenizer exactly: special tokens
// written literally in the text are matched first; every other span is NFC-normalised, runs of
// Unicode white space become one space, and each code point is lowercased on its own (full
// mapping, no context); the text is split with CLIP's pattern (contractions, letter runs, single
// digits, runs of other non-space characters; ICU's regex engine supplies \p{L} and \p{N}); each
// piece is mapped byte by byte to GPT-2's printable alphabet, "</w>" is appended to its last
// symbol, and merges are applied lowest rank first, leftmost first. Light header: no LibTorch.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace dp::runtime {

struct ClipEncoding {
    std::vector<int64_t> ids;        // bos, tokens, eos, then padding: exactly max_length ids
    int dropped_tokens = 0;          // tokens cut off by truncation (diffusers warns about them)
    std::vector<int64_t> truncated;  // the ids that were cut, for the warning's text
};

// GPT-2's printable symbol (UTF-8) for byte `b`: the alphabet of CLIP's vocab.json and merges.txt.
std::string clip_byte_symbol(unsigned char b);

class ClipTokenizer {
  public:
    // Throws ModelError naming the file at fault.
    static ClipTokenizer from_folder(const std::string& dir);
    // From in-memory files, for tests. `config_json` may be empty.
    static ClipTokenizer from_strings(const std::string& vocab_json, const std::string& merges_txt,
                                      const std::string& config_json, const std::string& where);

    // The content tokens of `text`, without bos/eos.
    std::vector<int64_t> tokenize(const std::string& text) const;
    // bos + tokens + eos, truncated and padded to max_length (77 unless configured).
    ClipEncoding encode(const std::string& text) const;
    ClipEncoding encode(const std::string& text, int max_length) const;
    // The text of ids (byte-level decoding, "</w>" as a space), for messages.
    std::string decode(const std::vector<int64_t>& ids) const;

    int model_max_length() const { return model_max_length_; }
    int64_t bos_id() const { return bos_id_; }
    int64_t eos_id() const { return eos_id_; }
    int64_t pad_id() const { return pad_id_; }
    std::size_t vocab_size() const { return vocab_.size(); }

  private:
    void bpe(const std::string& piece, std::vector<int64_t>& out) const;

    std::unordered_map<std::string, int64_t> vocab_;
    std::vector<std::string> id_to_token_;
    std::unordered_map<std::string, int> merge_rank_;        // "left right" -> rank
    std::vector<std::pair<std::string, int64_t>> specials_;  // matched literally in raw text
    std::string byte_to_symbol_[256];
    int64_t bos_id_ = 0, eos_id_ = 0, pad_id_ = 0, unk_id_ = 0;
    int model_max_length_ = 77;
};

}  // namespace dp::runtime
