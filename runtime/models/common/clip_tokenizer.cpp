#include "runtime/models/common/clip_tokenizer.h"

#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/errors.h"
#include "strategies/model_files.h"

namespace dp::runtime {
namespace {

// CLIP's pre-tokenizer pattern, with \s spelled as the White_Space property (what the reference's
// regex engine means by \s).
constexpr const char* kSplitPattern =
    R"(<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\p{White_Space}\p{L}\p{N}]+)";
// The byte-level step splits each piece again with GPT-2's pattern: this is what turns a lowercase
// "<|startoftext|>" piece into "<|", "startoftext", "|>".
constexpr const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\p{White_Space}\p{L}\p{N}]+|\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+)";

std::string read_text(const std::string& path, bool required) {
    if (!strategies::model_file_exists(path)) {
        if (required) throw ModelError(path + ": cannot read (missing tokenizer file?)");
        return {};
    }
    return strategies::read_model_file(path);
}

// GPT-2's reversible byte -> printable code point map.
void build_byte_map(std::string (&out)[256]) {
    std::vector<int> printable;
    for (int b = '!'; b <= '~'; ++b) printable.push_back(b);
    for (int b = 0xA1; b <= 0xAC; ++b) printable.push_back(b);
    for (int b = 0xAE; b <= 0xFF; ++b) printable.push_back(b);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
        const bool direct = std::find(printable.begin(), printable.end(), b) != printable.end();
        const UChar32 cp = direct ? b : next++;
        icu::UnicodeString s(cp);
        out[b].clear();
        s.toUTF8String(out[b]);
    }
}

std::string token_content(const nlohmann::json& j) {
    if (j.is_string()) return j.get<std::string>();
    if (j.is_object() && j.contains("content") && j["content"].is_string())
        return j["content"].get<std::string>();
    return {};
}

struct IcuState {
    const icu::Normalizer2* nfc = nullptr;
    std::unique_ptr<icu::RegexPattern> whitespace;
    std::unique_ptr<icu::RegexPattern> split;
    std::unique_ptr<icu::RegexPattern> byte_level;
};

const IcuState& icu_state() {
    static const IcuState state = [] {
        IcuState s;
        UErrorCode status = U_ZERO_ERROR;
        s.nfc = icu::Normalizer2::getNFCInstance(status);
        UParseError pe;
        s.whitespace.reset(
            icu::RegexPattern::compile(icu::UnicodeString::fromUTF8("\\p{White_Space}+"), 0, pe, status));
        s.split.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(kSplitPattern), 0, pe, status));
        s.byte_level.reset(
            icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(kByteLevelPattern), 0, pe, status));
        if (U_FAILURE(status))
            throw ModelError(std::string("ICU could not set up the tokenizer: ") + u_errorName(status));
        return s;
    }();
    return state;
}

// NFC, white space runs to one space, per-code-point full lowercase.
icu::UnicodeString normalize(const icu::UnicodeString& text) {
    const IcuState& icu_s = icu_state();
    UErrorCode status = U_ZERO_ERROR;
    icu::UnicodeString s = icu_s.nfc->normalize(text, status);
    std::unique_ptr<icu::RegexMatcher> ws(icu_s.whitespace->matcher(s, status));
    s = ws->replaceAll(icu::UnicodeString(u' '), status);
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
    if (U_FAILURE(status)) throw ModelError(std::string("ICU normalization failed: ") + u_errorName(status));
    return lower;
}

}  // namespace

std::string clip_byte_symbol(unsigned char b) {
    static const auto* map = [] {
        auto* m = new std::string[256];
        build_byte_map(*reinterpret_cast<std::string(*)[256]>(m));
        return m;
    }();
    return map[b];
}

ClipTokenizer ClipTokenizer::from_folder(const std::string& dir) {
    std::string config = read_text(dir + "/tokenizer_config.json", false);
    const std::string special_map = read_text(dir + "/special_tokens_map.json", false);
    if (config.empty() && !special_map.empty()) config = special_map;
    std::string vocab = read_text(dir + "/vocab.json", false);
    std::string merges;
    if (!vocab.empty()) {
        merges = read_text(dir + "/merges.txt", true);
    } else {
        // transformers 5 saves only tokenizer.json: take the BPE model's vocabulary and merges from it.
        const std::string path = dir + "/tokenizer.json";
        const std::string text = read_text(path, false);
        if (text.empty())
            throw ModelError(dir +
                             ": no vocab.json + merges.txt and no tokenizer.json (missing tokenizer files?)");
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(text);
        } catch (const nlohmann::json::exception& e) {
            throw ModelError(path + ": not valid JSON (" + std::string(e.what()).substr(0, 160) + ")");
        }
        const nlohmann::json* model = j.is_object() && j.contains("model") ? &j["model"] : nullptr;
        if (!model || !model->is_object() || model->value("type", "") != "BPE" ||
            !(*model)["vocab"].is_object() || !(*model)["merges"].is_array())
            throw ModelError(path + ": expected a BPE model with \"vocab\" and \"merges\"");
        if (model->contains("end_of_word_suffix") && (*model)["end_of_word_suffix"] != "</w>")
            throw ModelError(path + ": not a CLIP tokenizer (end_of_word_suffix is not \"</w>\")");
        if (model->value("ignore_merges", false))
            throw ModelError(path + ": ignore_merges is not supported for CLIP");
        vocab = (*model)["vocab"].dump();
        for (const auto& m : (*model)["merges"]) {
            if (m.is_string())
                merges += m.get<std::string>() + "\n";
            else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
                merges += m[0].get<std::string>() + " " + m[1].get<std::string>() + "\n";
            else
                throw ModelError(path + ": a merge is neither \"a b\" nor [\"a\", \"b\"]");
        }
    }
    return from_strings(vocab, merges, config, dir);
}

ClipTokenizer ClipTokenizer::from_strings(const std::string& vocab_json, const std::string& merges_txt,
                                          const std::string& config_json, const std::string& where) {
    ClipTokenizer t;
    build_byte_map(t.byte_to_symbol_);
    nlohmann::json vocab;
    try {
        vocab = nlohmann::json::parse(vocab_json);
    } catch (const nlohmann::json::exception& e) {
        throw ModelError(where + "/vocab.json: not valid JSON (" + std::string(e.what()).substr(0, 160) +
                         ")");
    }
    if (!vocab.is_object() || vocab.empty())
        throw ModelError(where + "/vocab.json: expected an object of token -> id");
    for (const auto& [token, id] : vocab.items()) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 24))
            throw ModelError(where + "/vocab.json: token '" + token.substr(0, 40) + "' has a bad id");
        t.vocab_[token] = id.get<int64_t>();
    }
    t.id_to_token_.resize(t.vocab_.size());
    for (const auto& [token, id] : t.vocab_) {
        if (static_cast<std::size_t>(id) >= t.id_to_token_.size())
            t.id_to_token_.resize(static_cast<std::size_t>(id) + 1);
        t.id_to_token_[static_cast<std::size_t>(id)] = token;
    }

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
        t.merge_rank_.emplace(line, rank++);
    }

    nlohmann::json config = nlohmann::json::object();
    if (!config_json.empty()) {
        try {
            config = nlohmann::json::parse(config_json);
        } catch (const nlohmann::json::exception& e) {
            throw ModelError(where + "/tokenizer_config.json: not valid JSON (" +
                             std::string(e.what()).substr(0, 160) + ")");
        }
    }
    auto special = [&](const char* key, const char* fallback) {
        std::string content = config.contains(key) ? token_content(config[key]) : "";
        if (content.empty()) content = fallback;
        auto it = t.vocab_.find(content);
        if (it == t.vocab_.end())
            throw ModelError(where + ": " + key + " '" + content + "' is not in vocab.json");
        return std::pair<std::string, int64_t>(content, it->second);
    };
    const auto bos = special("bos_token", "<|startoftext|>");
    const auto eos = special("eos_token", "<|endoftext|>");
    t.bos_id_ = bos.second;
    t.eos_id_ = eos.second;
    const auto pad = special("pad_token", "<|endoftext|>");
    const auto unk = special("unk_token", "<|endoftext|>");
    t.pad_id_ = pad.second;
    t.unk_id_ = unk.second;
    // Every special token written literally in a prompt is that token, as in transformers (even a
    // pad token of "!", which SD3's second tokenizer uses).
    for (const auto& sp : {bos, eos, pad, unk})
        if (std::none_of(t.specials_.begin(), t.specials_.end(),
                         [&](const auto& have) { return have.first == sp.first; }))
            t.specials_.push_back(sp);
    if (config.contains("model_max_length") && config["model_max_length"].is_number_integer()) {
        const auto m = config["model_max_length"].get<int64_t>();
        if (m >= 2 && m <= 4096) t.model_max_length_ = static_cast<int>(m);
    }
    return t;
}

void ClipTokenizer::bpe(const std::string& piece, std::vector<int64_t>& out) const {
    std::vector<std::string> symbols;
    for (unsigned char b : piece) symbols.push_back(byte_to_symbol_[b]);
    if (symbols.empty()) return;
    symbols.back() += "</w>";
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
        out.push_back(it == vocab_.end() ? unk_id_ : it->second);
    }
}

std::vector<int64_t> ClipTokenizer::tokenize(const std::string& text) const {
    std::vector<int64_t> ids;
    const IcuState& icu_s = icu_state();
    auto tokenize_span = [&](const std::string& span) {
        if (span.empty()) return;
        const icu::UnicodeString normalized = normalize(icu::UnicodeString::fromUTF8(span));
        UErrorCode status = U_ZERO_ERROR;
        std::unique_ptr<icu::RegexMatcher> m(icu_s.split->matcher(normalized, status));
        while (U_SUCCESS(status) && m->find(status)) {
            const icu::UnicodeString piece = m->group(status);
            std::unique_ptr<icu::RegexMatcher> sub(icu_s.byte_level->matcher(piece, status));
            while (U_SUCCESS(status) && sub->find(status)) {
                std::string word;
                sub->group(status).toUTF8String(word);
                bpe(word, ids);
            }
        }
    };
    // Special tokens written literally are matched on the raw text, before normalisation.
    std::size_t start = 0;
    while (start <= text.size()) {
        std::size_t best = std::string::npos;
        const std::pair<std::string, int64_t>* which = nullptr;
        for (const auto& sp : specials_) {
            const std::size_t at = text.find(sp.first, start);
            // Leftmost match, and the longest token where two start at the same place.
            if (at < best ||
                (at == best && at != std::string::npos && sp.first.size() > which->first.size())) {
                best = at;
                which = &sp;
            }
        }
        if (!which) {
            tokenize_span(text.substr(start));
            break;
        }
        tokenize_span(text.substr(start, best - start));
        ids.push_back(which->second);
        start = best + which->first.size();
    }
    return ids;
}

ClipEncoding ClipTokenizer::encode(const std::string& text) const { return encode(text, model_max_length_); }

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
    enc.ids.push_back(bos_id_);
    enc.ids.insert(enc.ids.end(), tokens.begin(), tokens.end());
    enc.ids.push_back(eos_id_);
    enc.ids.resize(static_cast<std::size_t>(max_length), pad_id_);
    return enc;
}

std::string ClipTokenizer::decode(const std::vector<int64_t>& ids) const {
    std::string symbols;
    for (int64_t id : ids)
        if (id >= 0 && static_cast<std::size_t>(id) < id_to_token_.size())
            symbols += id_to_token_[static_cast<std::size_t>(id)];
    // Map printable symbols back to bytes.
    std::unordered_map<std::string, unsigned char> back;
    for (int b = 0; b < 256; ++b) back[byte_to_symbol_[b]] = static_cast<unsigned char>(b);
    std::string out;
    const icu::UnicodeString u = icu::UnicodeString::fromUTF8(symbols);
    for (int32_t i = 0; i < u.length();) {
        const UChar32 cp = u.char32At(i);
        std::string ch;
        icu::UnicodeString(cp).toUTF8String(ch);
        auto it = back.find(ch);
        out += it != back.end() ? std::string(1, static_cast<char>(it->second)) : ch;
        i += U16_LENGTH(cp);
    }
    std::string result;
    for (std::size_t pos = 0; pos < out.size();) {
        if (out.compare(pos, 4, "</w>") == 0) {
            result += ' ';
            pos += 4;
        } else {
            result += out[pos++];
        }
    }
    while (!result.empty() && result.back() == ' ') result.pop_back();
    return result;
}

}  // namespace dp::runtime
