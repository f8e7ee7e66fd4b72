#pragma once
// One byte-level BPE tokenizer (GPT-2's byte alphabet) read from a tokenizer folder, in the
// configurations of the models we run: CLIP's (clip_tokenizer.h), Qwen2's and Qwen3's
// (qwen2_tokenizer.h) and Mistral 3's tekken (mistral_tokenizer.h).
// It gives the same ids as transformers' tokenizer of that configuration. Light header: no LibTorch.
//
// Note [byte-level BPE tokenization]: the steps follow transformers' tokenizers exactly, with the
// differences of a configuration in BpeFlavor:
//  1. added and special tokens written literally in the text are matched first, on the raw text
//     (leftmost, the longest where two start at one place); each becomes its id;
//  2. every other span is NFC-normalised; CLIP then turns runs of Unicode white space into one
//     space and lowercases each code point on its own (full mapping, no context);
//  3. the span is split with the configuration's pattern (ICU's regex engine, with \s spelled as
//     the White_Space property, which is what the reference's engine means by \s); CLIP splits each
//     piece again with GPT-2's pattern, as its byte-level step does, Qwen2 does not;
//  4. each piece is mapped byte by byte to GPT-2's printable alphabet, CLIP appends "</w>" to its
//     last symbol, and merges are applied lowest rank first, leftmost first;
//  5. a symbol missing from the vocabulary is the unk token where there is one, and dropped where
//     there is none (Qwen2), as the BPE model of tokenizers does.
// Decoding maps the symbols back to bytes (CLIP's "</w>" as a space) and invalid UTF-8 to U+FFFD.

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dp::runtime {

// What differs between the byte-level BPE tokenizers of two models (Note [byte-level BPE tokenization]).
struct BpeFlavor {
    std::string name;                     // for messages: "CLIP", "Qwen2"
    std::string split_pattern;            // ICU regex of step 3
    bool split_again_byte_level = false;  // step 3: split each piece with GPT-2's pattern (CLIP)
    bool lowercase = false;               // step 2 (CLIP)
    bool collapse_white_space = false;    // step 2 (CLIP)
    std::string end_of_word_suffix;       // step 4: "</w>" for CLIP
    bool added_tokens = false;            // read added tokens from the folder's files (Qwen2)
    bool nfc = true;                      // step 2: NFC (a tokenizer.json without a normalizer: none)
    // Step 3's pattern is tokenizer.json's Split pre-tokenizer's regex (Mistral's tekken files carry
    // either tekken's or Llama 3's), \s and \S spelled as the White_Space property.
    bool split_pattern_from_file = false;
    bool model_has_unk = false;  // step 5: the BPE model has an unk token (CLIP)
    // The special tokens where the tokenizer config names none (or null); "" means none.
    std::string bos_token, eos_token, pad_token, unk_token;

    static BpeFlavor clip();
    static BpeFlavor qwen2();
    static BpeFlavor mistral();
};

class BpeTokenizer {
  public:
    // From vocab.json + merges.txt, or tokenizer.json alone (its BPE model's vocab and merges, which
    // may be "a b" strings or ["a", "b"] pairs), with tokenizer_config.json (or
    // special_tokens_map.json) when present; for flavours with added tokens also
    // tokenizer_config.json's added_tokens_decoder, added_tokens.json and tokenizer.json's
    // added_tokens. vocab.json wins where both layouts are present. Throws ModelError naming the file.
    static BpeTokenizer from_folder(const std::string& dir, const BpeFlavor& flavor);
    // From in-memory files, for tests. `config_json` may be empty; `where` names the folder in errors.
    static BpeTokenizer from_strings(const std::string& vocab_json, const std::string& merges_txt,
                                     const std::string& config_json, const std::string& where,
                                     const BpeFlavor& flavor);

    // The ids of `text`, with no bos/eos or other wrapping.
    std::vector<int64_t> tokenize(const std::string& text) const;
    // The text of ids (byte-level decoding, added tokens as written), for messages.
    std::string decode(const std::vector<int64_t>& ids) const;

    // The id of a vocabulary or added token, or -1.
    int64_t id_of(const std::string& token) const;
    // -1 where the configuration has no such token (Qwen2 has no bos).
    int64_t bos_id() const { return bos_id_; }
    int64_t eos_id() const { return eos_id_; }
    int64_t pad_id() const { return pad_id_; }
    // The number of ids: vocabulary and added tokens.
    std::size_t vocab_size() const { return id_to_token_.size(); }
    // tokenizer_config.json's model_max_length, or 0 where it names none.
    int64_t configured_max_length() const { return configured_max_length_; }

  private:
    struct Patterns;
    using Literal = std::pair<std::string, int64_t>;  // a special or added token: content, id
    static BpeTokenizer build(const std::string& vocab_json, const std::string& merges_txt,
                              const std::string& config_json, std::vector<Literal> added,
                              const std::string& where, const BpeFlavor& flavor, bool ignore_merges);
    // build's steps: vocab.json, merges.txt, the added tokens and the config's special tokens.
    // Each throws ModelError naming the file.
    void read_vocab(const std::string& vocab_json, const std::string& where);
    void read_merges(const std::string& merges_txt, const std::string& where);
    void add_tokens(const std::vector<Literal>& added, const std::string& where);
    void read_special_tokens(const nlohmann::json& config, const std::string& where);
    // `content` matched literally in raw text as `id`, unless it is already.
    void add_literal(const std::string& content, int64_t id);
    void bpe(const std::string& piece, std::vector<int64_t>& out) const;
    void tokenize_span(const std::string& span, std::vector<int64_t>& out) const;

    BpeFlavor flavor_;
    std::shared_ptr<const Patterns> patterns_;
    std::unordered_map<std::string, int64_t> vocab_;  // vocabulary and added tokens
    std::vector<std::string> id_to_token_;
    std::unordered_map<std::string, int> merge_rank_;  // "left right" -> rank
    std::vector<Literal> literals_;                    // matched literally in raw text
    bool ignore_merges_ = false;                       // a piece in the vocabulary is one token
    int64_t bos_id_ = -1, eos_id_ = -1, pad_id_ = -1, unk_id_ = -1;
    int64_t configured_max_length_ = 0;
};

// A BpeTokenizer in one configuration: Derived (ClipTokenizer, Qwen2Tokenizer) names it with
// `static BpeFlavor flavor()` and is built from the tokenizer it reads (its constructor may be
// private, with FlavoredBpeTokenizer<Derived> its friend).
template <class Derived>
class FlavoredBpeTokenizer : public BpeTokenizer {
  public:
    // vocab.json + merges.txt (+ the flavor's config files), or tokenizer.json alone. Throws
    // ModelError naming the file at fault.
    static Derived from_folder(const std::string& dir) {
        return Derived(BpeTokenizer::from_folder(dir, Derived::flavor()));
    }
    // From in-memory files, for tests. `config_json` may be empty.
    static Derived from_strings(const std::string& vocab_json, const std::string& merges_txt,
                                const std::string& config_json, const std::string& where) {
        return Derived(
            BpeTokenizer::from_strings(vocab_json, merges_txt, config_json, where, Derived::flavor()));
    }

  protected:
    explicit FlavoredBpeTokenizer(BpeTokenizer base) : BpeTokenizer(std::move(base)) {}
};

// GPT-2's printable symbol (UTF-8) for byte `b`: the alphabet of byte-level vocab.json and merges.txt.
std::string byte_level_symbol(unsigned char b);

}  // namespace dp::runtime
