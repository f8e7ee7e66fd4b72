// The byte-level BPE tokenizer and its two configurations, CLIP's and Qwen2's
// (Note [byte-level BPE tokenization]).
#include "runtime/models/common/bpe_tokenizer.h"

#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <climits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/io/errors.h"
#include "runtime/models/common/clip_tokenizer.h"
#include "runtime/models/common/qwen2_tokenizer.h"
#include "strategies/model_files.h"

namespace dp::runtime {
namespace {

// GPT-2's pattern, with \s spelled as the White_Space property: CLIP's byte-level step splits each
// piece again with it, which is what turns a lowercase "<|startoftext|>" piece into "<|",
// "startoftext", "|>".
constexpr const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\p{White_Space}\p{L}\p{N}]+|\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+)";

std::string read_text(const std::string& path, bool required) {
    if (!strategies::model_file_exists(path)) {
        if (required) throw ModelError(path + ": cannot read (missing tokenizer file?)");
        return {};
    }
    return strategies::read_model_file(path);
}

nlohmann::json parse_json(const std::string& text, const std::string& file) {
    try {
        return nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        throw ModelError(file + ": not valid JSON (" + std::string(e.what()).substr(0, 160) + ")");
    }
}

// GPT-2's reversible byte -> printable code point map.
const std::string* byte_map() {
    static const auto* map = [] {
        auto* m = new std::string[256];
        std::vector<bool> direct(256, false);
        for (int b = '!'; b <= '~'; ++b) direct[b] = true;
        for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
        for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
        int next = 256;
        for (int b = 0; b < 256; ++b)
            icu::UnicodeString(static_cast<UChar32>(direct[b] ? b : next++)).toUTF8String(m[b]);
        return m;
    }();
    return map;
}

std::string token_content(const nlohmann::json& j) {
    if (j.is_string()) return j.get<std::string>();
    if (j.is_object() && j.contains("content") && j["content"].is_string())
        return j["content"].get<std::string>();
    return {};
}

using Literal = std::pair<std::string, int64_t>;

// One added token of `file`, refusing the options we do not implement.
Literal added_token(const nlohmann::json& entry, const nlohmann::json& id, const std::string& file) {
    const std::string content = token_content(entry);
    if (content.empty() || !id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 24))
        throw ModelError(file + ": an added token needs a non-empty \"content\" and an id in [0, 2^24)");
    if (entry.is_object())
        for (const char* flag : {"lstrip", "rstrip", "single_word"})
            if (entry.value(flag, false))
                throw ModelError(file + ": added token '" + content.substr(0, 40) + "' sets \"" + flag +
                                 "\", which is not supported (only false)");
    return {content, id.get<int64_t>()};
}

}  // namespace

struct BpeTokenizer::Patterns {
    std::unique_ptr<icu::RegexPattern> split, byte_level, white_space;
};

BpeFlavor BpeFlavor::clip() {
    BpeFlavor f;
    f.name = "CLIP";
    f.split_pattern =
        R"(<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\p{White_Space}\p{L}\p{N}]+)";
    f.split_again_byte_level = true;
    f.lowercase = true;
    f.collapse_white_space = true;
    f.end_of_word_suffix = "</w>";
    f.model_has_unk = true;
    f.bos_token = "<|startoftext|>";
    f.eos_token = f.pad_token = f.unk_token = "<|endoftext|>";
    return f;
}

BpeFlavor BpeFlavor::qwen2() {
    BpeFlavor f;
    f.name = "Qwen2";
    // transformers' Qwen2 pattern, \s and \S spelled as the White_Space property.
    f.split_pattern =
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\p{White_Space}\p{L}\p{N}]+[\r\n]*|)"
        R"(\p{White_Space}*[\r\n]+|\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+)";
    f.added_tokens = true;
    f.eos_token = f.pad_token = "<|endoftext|>";
    return f;
}

BpeFlavor BpeFlavor::mistral() {
    BpeFlavor f;
    f.name = "Mistral (tekken)";
    f.split_pattern_from_file = true;
    f.nfc = false;
    f.added_tokens = true;
    f.bos_token = "<s>";
    f.eos_token = "</s>";
    f.pad_token = "<pad>";
    f.unk_token = "<unk>";
    return f;
}

namespace {

// tokenizer.json's Split pre-tokenizer's regex (alone, or in a Sequence), \s and \S spelled as the
// White_Space property (what the reference's engine means by them). Throws ModelError naming `path`.
std::string file_split_pattern(const nlohmann::json& j, const std::string& path) {
    const nlohmann::json* pre = j.contains("pre_tokenizer") ? &j.at("pre_tokenizer") : nullptr;
    std::vector<const nlohmann::json*> steps;
    if (pre && pre->is_object() && pre->value("type", "") == "Sequence" && pre->contains("pretokenizers"))
        for (const nlohmann::json& step : pre->at("pretokenizers")) steps.push_back(&step);
    else if (pre)
        steps.push_back(pre);
    for (const nlohmann::json* step : steps)
        if (step->is_object() && step->value("type", "") == "Split" && step->contains("pattern") &&
            step->at("pattern").is_object() && step->at("pattern").contains("Regex") &&
            step->at("pattern").at("Regex").is_string()) {
            const std::string regex = step->at("pattern").at("Regex").get<std::string>();
            std::string out;
            for (std::size_t i = 0; i < regex.size(); ++i) {
                if (regex[i] == '\\' && i + 1 < regex.size()) {
                    const char next = regex[i + 1];
                    out += next == 's'   ? "\\p{White_Space}"
                           : next == 'S' ? "\\P{White_Space}"
                                         : regex.substr(i, 2);
                    ++i;
                    continue;
                }
                out += regex[i];
            }
            return out;
        }
    throw ModelError(path + ": no Split pre-tokenizer with a regex (a tekken tokenizer.json has one)");
}

}  // namespace

std::string byte_level_symbol(unsigned char b) { return byte_map()[b]; }

BpeTokenizer BpeTokenizer::from_folder(const std::string& dir, const BpeFlavor& flavor) {
    std::string config = read_text(dir + "/tokenizer_config.json", false);
    const std::string special_map = read_text(dir + "/special_tokens_map.json", false);
    if (config.empty() && !special_map.empty()) config = special_map;
    std::vector<Literal> added;
    std::string vocab = read_text(dir + "/vocab.json", false);
    std::string merges;
    bool ignore_merges = false;
    BpeFlavor used = flavor;  // with the file's split pattern where the flavour takes it from there
    if (flavor.split_pattern_from_file) vocab.clear();  // tokenizer.json holds the pattern
    if (!vocab.empty()) {
        merges = read_text(dir + "/merges.txt", true);
        const std::string added_path = dir + "/added_tokens.json";
        const std::string added_text = flavor.added_tokens ? read_text(added_path, false) : "";
        if (!added_text.empty()) {
            const nlohmann::json j = parse_json(added_text, added_path);
            if (!j.is_object()) throw ModelError(added_path + ": expected an object of token -> id");
            for (const auto& [content, id] : j.items()) added.push_back(added_token(content, id, added_path));
        }
    } else {
        // transformers 5 saves only tokenizer.json: take the BPE model's vocabulary and merges from it.
        const std::string path = dir + "/tokenizer.json";
        const std::string text = read_text(path, false);
        if (text.empty())
            throw ModelError(dir +
                             ": no vocab.json + merges.txt and no tokenizer.json (missing tokenizer files?)");
        nlohmann::json j = parse_json(text, path);
        nlohmann::json* model = j.is_object() && j.contains("model") ? &j["model"] : nullptr;
        if (!model || !model->is_object() || model->value("type", "") != "BPE" ||
            !(*model)["vocab"].is_object() || !(*model)["merges"].is_array())
            throw ModelError(path + ": expected a BPE model with \"vocab\" and \"merges\"");
        if (model->contains("end_of_word_suffix")) {
            const nlohmann::json& suffix = (*model)["end_of_word_suffix"];
            if ((suffix.is_string() ? suffix.get<std::string>() : "") != flavor.end_of_word_suffix)
                throw ModelError(path + ": not a " + flavor.name + " tokenizer (end_of_word_suffix is " +
                                 suffix.dump() + ", expected \"" + flavor.end_of_word_suffix + "\")");
        }
        ignore_merges = model->value("ignore_merges", false);
        if (ignore_merges && !flavor.end_of_word_suffix.empty())
            throw ModelError(path + ": ignore_merges is not supported for " + flavor.name);
        if (flavor.split_pattern_from_file) {
            used.split_pattern = file_split_pattern(j, path);
            if (j.contains("normalizer") && !j.at("normalizer").is_null())
                throw ModelError(path + ": a normalizer is set; a " + flavor.name + " tokenizer has none");
        }
        vocab = (*model)["vocab"].dump();
        for (const auto& m : (*model)["merges"]) {
            if (m.is_string())
                merges += m.get<std::string>() + "\n";
            else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
                merges += m[0].get<std::string>() + " " + m[1].get<std::string>() + "\n";
            else
                throw ModelError(path + ": a merge is neither \"a b\" nor [\"a\", \"b\"]");
        }
        if (flavor.added_tokens && j.contains("added_tokens")) {
            if (!j["added_tokens"].is_array()) throw ModelError(path + ": \"added_tokens\" is not a list");
            for (const auto& entry : j["added_tokens"])
                added.push_back(added_token(
                    entry, entry.is_object() ? entry.value("id", nlohmann::json()) : nlohmann::json(), path));
        }
    }
    return build(vocab, merges, config, std::move(added), dir, used, ignore_merges);
}

BpeTokenizer BpeTokenizer::from_strings(const std::string& vocab_json, const std::string& merges_txt,
                                        const std::string& config_json, const std::string& where,
                                        const BpeFlavor& flavor) {
    return build(vocab_json, merges_txt, config_json, {}, where, flavor, false);
}

BpeTokenizer BpeTokenizer::build(const std::string& vocab_json, const std::string& merges_txt,
                                 const std::string& config_json, std::vector<Literal> added,
                                 const std::string& where, const BpeFlavor& flavor, bool ignore_merges) {
    BpeTokenizer t;
    t.flavor_ = flavor;
    t.ignore_merges_ = ignore_merges;
    auto patterns = std::make_shared<Patterns>();
    {
        UErrorCode status = U_ZERO_ERROR;
        UParseError pe;
        auto compile = [&](const std::string& p) {
            return std::unique_ptr<icu::RegexPattern>(
                icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(p), 0, pe, status));
        };
        if (flavor.split_pattern.empty())
            throw ModelError(where + ": the " + flavor.name +
                             " tokenizer's split pattern comes from tokenizer.json");
        patterns->split = compile(flavor.split_pattern);
        if (flavor.split_again_byte_level) patterns->byte_level = compile(kByteLevelPattern);
        if (flavor.collapse_white_space) patterns->white_space = compile("\\p{White_Space}+");
        if (U_FAILURE(status))
            throw ModelError("ICU could not set up the " + flavor.name +
                             " tokenizer: " + u_errorName(status));
    }
    t.patterns_ = std::move(patterns);
    t.read_vocab(vocab_json, where);
    t.read_merges(merges_txt, where);

    nlohmann::json config = nlohmann::json::object();
    const std::string config_file = where + "/tokenizer_config.json";
    if (!config_json.empty()) config = parse_json(config_json, config_file);
    if (!config.is_object()) throw ModelError(config_file + ": expected an object");
    if (flavor.added_tokens && config.contains("added_tokens_decoder")) {
        const nlohmann::json& decoder = config["added_tokens_decoder"];
        if (!decoder.is_object())
            throw ModelError(config_file + ": \"added_tokens_decoder\" is not an object of id -> token");
        for (const auto& [key, entry] : decoder.items()) {
            int64_t id = -1;
            try {
                std::size_t used = 0;
                id = std::stoll(key, &used);
                if (used != key.size()) id = -1;
            } catch (const std::exception&) {
            }
            added.push_back(added_token(entry, nlohmann::json(id), config_file));
        }
    }
    t.add_tokens(added, where);
    t.read_special_tokens(config, where);
    return t;
}

void BpeTokenizer::read_vocab(const std::string& vocab_json, const std::string& where) {
    const nlohmann::json vocab = parse_json(vocab_json, where + "/vocab.json");
    if (!vocab.is_object() || vocab.empty())
        throw ModelError(where + "/vocab.json: expected an object of token -> id");
    for (const auto& [token, id] : vocab.items()) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 24))
            throw ModelError(where + "/vocab.json: token '" + token.substr(0, 40) + "' has a bad id");
        vocab_[token] = id.get<int64_t>();
    }
    id_to_token_.resize(vocab_.size());
    for (const auto& [token, id] : vocab_) {
        if (static_cast<std::size_t>(id) >= id_to_token_.size())
            id_to_token_.resize(static_cast<std::size_t>(id) + 1);
        id_to_token_[static_cast<std::size_t>(id)] = token;
    }
}

void BpeTokenizer::read_merges(const std::string& merges_txt, const std::string& where) {
    std::istringstream merges(merges_txt);
    int rank = 0, line_no = 0;
    for (std::string line; std::getline(merges, line);) {
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
        const auto space = line.find(' ');
        if (space == std::string::npos || space == 0 || space + 1 >= line.size() ||
            line.find(' ', space + 1) != std::string::npos)
            throw ModelError(where + "/merges.txt:" + std::to_string(line_no) +
                             ": expected two symbols separated by one space");
        merge_rank_.emplace(line, rank++);
    }
}

void BpeTokenizer::add_literal(const std::string& content, int64_t id) {
    if (std::none_of(literals_.begin(), literals_.end(),
                     [&](const Literal& l) { return l.first == content; }))
        literals_.emplace_back(content, id);
}

void BpeTokenizer::add_tokens(const std::vector<Literal>& added, const std::string& where) {
    // Added tokens join the vocabulary (after it in Qwen2's files; inside it in Mistral's, where
    // they are matched literally all the same); a clash is a broken folder.
    for (const auto& [content, id] : added) {
        const auto have = vocab_.find(content);
        if (have != vocab_.end()) {
            if (have->second != id)
                throw ModelError(where + ": added token '" + content.substr(0, 40) + "' has id " +
                                 std::to_string(id) + " in one file and " + std::to_string(have->second) +
                                 " in another");
            add_literal(content, id);
            continue;
        }
        if (static_cast<std::size_t>(id) >= id_to_token_.size())
            id_to_token_.resize(static_cast<std::size_t>(id) + 1);
        if (!id_to_token_[static_cast<std::size_t>(id)].empty())
            throw ModelError(where + ": added token '" + content.substr(0, 40) + "' takes id " +
                             std::to_string(id) + ", which is already '" +
                             id_to_token_[static_cast<std::size_t>(id)].substr(0, 40) + "'");
        id_to_token_[static_cast<std::size_t>(id)] = content;
        vocab_[content] = id;
        add_literal(content, id);
    }
}

void BpeTokenizer::read_special_tokens(const nlohmann::json& config, const std::string& where) {
    // The special tokens the config names (a null one is the flavour's default); "" means none.
    auto special = [&](const char* key, const std::string& fallback) -> int64_t {
        std::string content = config.contains(key) ? token_content(config[key]) : "";
        if (content.empty()) content = fallback;
        if (content.empty()) return -1;
        auto it = vocab_.find(content);
        if (it == vocab_.end())
            throw ModelError(where + ": " + key + " '" + content +
                             "' is not in vocab.json or the added tokens");
        // Every special token written literally in a prompt is that token, as in transformers (even a
        // pad token of "!", which SD3's second tokenizer uses).
        add_literal(content, it->second);
        return it->second;
    };
    bos_id_ = special("bos_token", flavor_.bos_token);
    eos_id_ = special("eos_token", flavor_.eos_token);
    pad_id_ = special("pad_token", flavor_.pad_token);
    if (flavor_.model_has_unk) unk_id_ = special("unk_token", flavor_.unk_token);
    if (config.contains("model_max_length") && config["model_max_length"].is_number_integer())
        configured_max_length_ = std::max<int64_t>(0, config["model_max_length"].get<int64_t>());
}

int64_t BpeTokenizer::id_of(const std::string& token) const {
    const auto it = vocab_.find(token);
    return it == vocab_.end() ? -1 : it->second;
}

void BpeTokenizer::bpe(const std::string& piece, std::vector<int64_t>& out) const {
    if (piece.empty()) return;
    const std::string* symbol_of = byte_map();
    if (ignore_merges_) {
        std::string whole;
        for (unsigned char b : piece) whole += symbol_of[b];
        if (const auto it = vocab_.find(whole); it != vocab_.end()) {
            out.push_back(it->second);
            return;
        }
    }
    std::vector<std::string> symbols;
    for (unsigned char b : piece) {
        // Without an unk token, tokenizers drops a symbol missing from the vocabulary before merging.
        if (unk_id_ < 0 && !vocab_.count(symbol_of[b])) continue;
        symbols.push_back(symbol_of[b]);
    }
    if (symbols.empty()) return;
    symbols.back() += flavor_.end_of_word_suffix;
    while (symbols.size() > 1) {
        int best_rank = INT_MAX;
        std::size_t best = 0;
        for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
            auto it = merge_rank_.find(symbols[i] + " " + symbols[i + 1]);
            if (it != merge_rank_.end() && it->second < best_rank) {
                best_rank = it->second;
                best = i;
            }
        }
        if (best_rank == INT_MAX) break;
        symbols[best] += symbols[best + 1];
        symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    for (const std::string& s : symbols) {
        auto it = vocab_.find(s);
        if (it != vocab_.end())
            out.push_back(it->second);
        else if (unk_id_ >= 0)
            out.push_back(unk_id_);
    }
}

void BpeTokenizer::tokenize_span(const std::string& span, std::vector<int64_t>& out) const {
    if (span.empty()) return;
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
    if (U_FAILURE(status)) throw ModelError(std::string("ICU has no NFC normaliser: ") + u_errorName(status));
    icu::UnicodeString s = flavor_.nfc ? nfc->normalize(icu::UnicodeString::fromUTF8(span), status)
                                       : icu::UnicodeString::fromUTF8(span);
    if (flavor_.collapse_white_space) {
        std::unique_ptr<icu::RegexMatcher> ws(patterns_->white_space->matcher(s, status));
        s = ws->replaceAll(icu::UnicodeString(u' '), status);
    }
    if (flavor_.lowercase) {
        icu::UnicodeString lower;
        for (int32_t i = 0; i < s.length();) {
            const UChar32 cp = s.char32At(i);
            UChar src[2], dst[8];
            int32_t src_len = 0;
            U16_APPEND_UNSAFE(src, src_len, cp);
            UErrorCode st = U_ZERO_ERROR;
            const int32_t n = u_strToLower(dst, 8, src, src_len, "", &st);
            if (U_SUCCESS(st))
                lower.append(dst, n);
            else
                lower.append(cp);
            i += U16_LENGTH(cp);
        }
        s = lower;
    }
    if (U_FAILURE(status)) throw ModelError(std::string("ICU normalization failed: ") + u_errorName(status));
    std::unique_ptr<icu::RegexMatcher> m(patterns_->split->matcher(s, status));
    while (U_SUCCESS(status) && m->find(status)) {
        const icu::UnicodeString piece = m->group(status);
        if (!patterns_->byte_level) {
            std::string word;
            piece.toUTF8String(word);
            bpe(word, out);
            continue;
        }
        std::unique_ptr<icu::RegexMatcher> sub(patterns_->byte_level->matcher(piece, status));
        while (U_SUCCESS(status) && sub->find(status)) {
            std::string word;
            sub->group(status).toUTF8String(word);
            bpe(word, out);
        }
    }
    if (U_FAILURE(status))
        throw ModelError(std::string("ICU regex failed while tokenizing: ") + u_errorName(status));
}

std::vector<int64_t> BpeTokenizer::tokenize(const std::string& text) const {
    std::vector<int64_t> ids;
    // Special and added tokens written literally are matched on the raw text, before normalisation.
    std::size_t start = 0;
    while (start <= text.size()) {
        std::size_t best = std::string::npos;
        const Literal* which = nullptr;
        for (const Literal& lit : literals_) {
            const std::size_t at = text.find(lit.first, start);
            // Leftmost match, and the longest token where two start at the same place.
            if (at < best ||
                (at == best && at != std::string::npos && lit.first.size() > which->first.size())) {
                best = at;
                which = &lit;
            }
        }
        if (!which) {
            tokenize_span(text.substr(start), ids);
            break;
        }
        tokenize_span(text.substr(start, best - start), ids);
        ids.push_back(which->second);
        start = best + which->first.size();
    }
    return ids;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
    static const auto* back = [] {
        auto* m = new std::unordered_map<std::string, char>;
        for (int b = 0; b < 256; ++b) (*m)[byte_map()[b]] = static_cast<char>(b);
        return m;
    }();
    std::string bytes;
    for (int64_t id : ids) {
        if (id < 0 || static_cast<std::size_t>(id) >= id_to_token_.size()) continue;
        // A token whose every character is a byte symbol is those bytes; any other (an added token
        // outside the alphabet) is its own text, as tokenizers' byte-level decoder does.
        const icu::UnicodeString u = icu::UnicodeString::fromUTF8(id_to_token_[static_cast<std::size_t>(id)]);
        std::string mapped;
        bool all = true;
        for (int32_t i = 0; i < u.length() && all;) {
            const UChar32 cp = u.char32At(i);
            std::string ch;
            icu::UnicodeString(cp).toUTF8String(ch);
            const auto it = back->find(ch);
            if (it == back->end())
                all = false;
            else
                mapped += it->second;
            i += U16_LENGTH(cp);
        }
        bytes += all ? mapped : id_to_token_[static_cast<std::size_t>(id)];
    }
    std::string result;
    const std::string& suffix = flavor_.end_of_word_suffix;
    if (suffix.empty()) {
        result = std::move(bytes);
    } else {
        for (std::size_t pos = 0; pos < bytes.size();) {
            if (bytes.compare(pos, suffix.size(), suffix) == 0) {
                result += ' ';
                pos += suffix.size();
            } else {
                result += bytes[pos++];
            }
        }
        while (!result.empty() && result.back() == ' ') result.pop_back();
    }
    std::string valid;  // invalid UTF-8 (a token cut mid-character) becomes U+FFFD
    icu::UnicodeString::fromUTF8(result).toUTF8String(valid);
    return valid;
}

// ---- CLIP's configuration: bos + tokens + eos, truncated and padded.

int ClipTokenizer::model_max_length() const {
    const int64_t m = configured_max_length();
    return m >= 2 && m <= 4096 ? static_cast<int>(m) : 77;
}

ClipEncoding ClipTokenizer::encode(const std::string& text) const { return encode(text, model_max_length()); }

ClipEncoding ClipTokenizer::encode(const std::string& text, int max_length) const {
    if (max_length < 2) throw ModelError("tokenizer max_length must be at least 2");
    std::vector<int64_t> tokens = tokenize(text);
    ClipEncoding enc;
    const std::size_t room = static_cast<std::size_t>(max_length) - 2;
    if (tokens.size() > room) {
        enc.dropped_tokens = static_cast<int>(tokens.size() - room);
        enc.truncated.assign(tokens.begin() + static_cast<std::ptrdiff_t>(room), tokens.end());
        tokens.resize(room);
    }
    enc.ids.reserve(static_cast<std::size_t>(max_length));
    enc.ids.push_back(bos_id());
    enc.ids.insert(enc.ids.end(), tokens.begin(), tokens.end());
    enc.ids.push_back(eos_id());
    enc.ids.resize(static_cast<std::size_t>(max_length), pad_id());
    return enc;
}

}  // namespace dp::runtime
