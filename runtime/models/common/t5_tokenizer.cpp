#include "runtime/models/common/t5_tokenizer.h"

#include <sentencepiece_processor.h>
#include <unicode/brkiter.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>

#include "runtime/io/errors.h"
#include "strategies/model_files.h"

namespace dp::runtime {
namespace {

constexpr std::string_view kMeta = "\xE2\x96\x81";  // "▁", SentencePiece's word boundary

// ---- Protocol-buffer wire format: just enough to read and write SentencePiece's ModelProto. ----

struct WireField {
    uint32_t number = 0;
    uint32_t type = 0;         // 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32
    uint64_t varint = 0;       // type 0
    std::string_view payload;  // type 1, 2 and 5
};

bool read_varint(std::string_view in, std::size_t& pos, uint64_t& value) {
    value = 0;
    for (int shift = 0; shift < 64 && pos < in.size(); shift += 7) {
        const auto byte = static_cast<unsigned char>(in[pos++]);
        value |= static_cast<uint64_t>(byte & 0x7F) << shift;
        if (!(byte & 0x80)) return true;
    }
    return false;
}

// The fields of one message, in order. Throws ModelError naming `where` when it is malformed.
std::vector<WireField> wire_fields(std::string_view in, const std::string& where) {
    std::vector<WireField> out;
    std::size_t pos = 0;
    while (pos < in.size()) {
        uint64_t key = 0;
        WireField f;
        if (!read_varint(in, pos, key))
            throw ModelError(where + ": not a SentencePiece model (bad protobuf)");
        f.number = static_cast<uint32_t>(key >> 3);
        f.type = static_cast<uint32_t>(key & 7);
        uint64_t size = 0;
        if (f.type == 0) {
            if (!read_varint(in, pos, f.varint)) throw ModelError(where + ": truncated SentencePiece model");
            out.push_back(f);
            continue;
        }
        if (f.type == 1)
            size = 8;
        else if (f.type == 5)
            size = 4;
        else if (f.type != 2 || !read_varint(in, pos, size))
            throw ModelError(where + ": not a SentencePiece model (bad protobuf)");
        if (size > in.size() - pos) throw ModelError(where + ": truncated SentencePiece model");
        f.payload = in.substr(pos, size);
        pos += size;
        out.push_back(f);
    }
    return out;
}

void put_varint(std::string& out, uint64_t v) {
    while (v >= 0x80) {
        out.push_back(static_cast<char>((v & 0x7F) | 0x80));
        v >>= 7;
    }
    out.push_back(static_cast<char>(v));
}
void put_int(std::string& out, uint32_t field, int64_t v) {  // int32 / enum / bool
    put_varint(out, uint64_t{field} << 3);
    put_varint(out, static_cast<uint64_t>(v));
}
void put_bytes(std::string& out, uint32_t field, std::string_view v) {
    put_varint(out, (uint64_t{field} << 3) | 2);
    put_varint(out, v.size());
    out.append(v);
}
void put_float(std::string& out, uint32_t field, float v) {
    put_varint(out, (uint64_t{field} << 3) | 5);
    char bytes[4];
    std::memcpy(bytes, &v, 4);  // little-endian, as the wire format
    out.append(bytes, 4);
}

// ---- What the reference's unigram model is made of. ----

struct Vocabulary {
    std::vector<std::string> pieces;
    std::vector<float> scores;
    int64_t unk_id = 2;
    std::string charsmap;  // SentencePiece's precompiled normaliser; empty: none
};

// The pieces (in id order) and the normaliser of a spiece.model. Note [T5 tokenization] has
// transformers append T5's sentinels to these.
Vocabulary read_spiece(const std::string& bytes, const std::string& path) {
    Vocabulary v;
    v.unk_id = -1;
    for (const WireField& f : wire_fields(bytes, path)) {
        if (f.number == 1 && f.type == 2) {  // SentencePiece { piece = 1; score = 2; type = 3 }
            std::string piece;
            float score = 0;
            int64_t type = 1;
            for (const WireField& p : wire_fields(f.payload, path)) {
                if (p.number == 1 && p.type == 2) piece = std::string(p.payload);
                if (p.number == 2 && p.type == 5) std::memcpy(&score, p.payload.data(), 4);
                if (p.number == 3 && p.type == 0) type = static_cast<int64_t>(p.varint);
            }
            if (type == 2) v.unk_id = static_cast<int64_t>(v.pieces.size());
            v.pieces.push_back(std::move(piece));
            v.scores.push_back(score);
        } else if (f.number == 3 && f.type == 2) {  // NormalizerSpec { precompiled_charsmap = 2 }
            for (const WireField& n : wire_fields(f.payload, path))
                if (n.number == 2 && n.type == 2) v.charsmap = std::string(n.payload);
        }
    }
    if (v.pieces.empty()) throw ModelError(path + ": not a SentencePiece model (it has no pieces)");
    if (v.unk_id < 0) throw ModelError(path + ": the SentencePiece model has no unknown piece");
    return v;
}

std::string base64_decode(const std::string& in, const std::string& where) {
    std::string out;
    uint32_t acc = 0;
    int bits = 0;
    for (char c : in) {
        int d;
        if (c >= 'A' && c <= 'Z')
            d = c - 'A';
        else if (c >= 'a' && c <= 'z')
            d = c - 'a' + 26;
        else if (c >= '0' && c <= '9')
            d = c - '0' + 52;
        else if (c == '+')
            d = 62;
        else if (c == '/')
            d = 63;
        else if (c == '=')
            break;
        else
            throw ModelError(where + ": precompiled_charsmap is not base64");
        acc = (acc << 6) | static_cast<uint32_t>(d);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out.push_back(static_cast<char>((acc >> bits) & 0xFF));
        }
    }
    return out;
}

struct AddedToken {
    std::string content;
    int64_t id = 0;
    bool lstrip = false, rstrip = false;
};

// tokenizer.json: the unigram vocabulary (with the sentinels), its charsmap and the added tokens.
Vocabulary read_tokenizer_json(const std::string& path, std::vector<AddedToken>& added) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(strategies::read_model_file(path));
    } catch (const nlohmann::json::exception& e) {
        throw ModelError(path + ": not valid JSON (" + std::string(e.what()).substr(0, 160) + ")");
    }
    const nlohmann::json& model = j.contains("model") ? j["model"] : nlohmann::json();
    if (!model.is_object() || model.value("type", "") != "Unigram" || !model.contains("vocab") ||
        !model["vocab"].is_array())
        throw ModelError(path +
                         ": \"model\" is not a Unigram model with a \"vocab\" (is this T5's tokenizer?)");
    Vocabulary v;
    for (const nlohmann::json& e : model["vocab"]) {
        if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number())
            throw ModelError(path + ": model.vocab entries must be [piece, score]");
        v.pieces.push_back(e[0].get<std::string>());
        v.scores.push_back(e[1].get<float>());
    }
    if (!model.contains("unk_id") || !model["unk_id"].is_number_integer())
        throw ModelError(path + ": model.unk_id is missing");
    v.unk_id = model["unk_id"].get<int64_t>();
    if (v.pieces.empty() || v.unk_id < 0 || v.unk_id >= static_cast<int64_t>(v.pieces.size()))
        throw ModelError(path + ": model.unk_id is not an id of model.vocab");
    if (model.value("byte_fallback", false)) throw ModelError(path + ": byte_fallback is not supported");
    // transformers keeps the Precompiled normaliser (alone or in a Sequence) and nothing else.
    const nlohmann::json& norm = j.contains("normalizer") ? j["normalizer"] : nlohmann::json();
    std::vector<nlohmann::json> normalizers;
    if (norm.is_object() && norm.value("type", "") == "Sequence" && norm.contains("normalizers"))
        normalizers = norm["normalizers"].get<std::vector<nlohmann::json>>();
    else if (norm.is_object())
        normalizers = {norm};
    for (const nlohmann::json& n : normalizers)
        if (n.is_object() && n.value("type", "") == "Precompiled" && n.contains("precompiled_charsmap") &&
            n["precompiled_charsmap"].is_string()) {
            v.charsmap = base64_decode(n["precompiled_charsmap"].get<std::string>(), path);
            break;
        }
    if (j.contains("added_tokens") && j["added_tokens"].is_array())
        for (const nlohmann::json& t : j["added_tokens"]) {
            if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
                !t.contains("content") || !t["content"].is_string())
                throw ModelError(path + ": added_tokens entries need an integer id and a string content");
            AddedToken a{t["content"].get<std::string>(), t["id"].get<int64_t>(), t.value("lstrip", false),
                         t.value("rstrip", false)};
            if (t.value("single_word", false) || t.value("normalized", false))
                throw ModelError(path + ": added token '" + a.content +
                                 "' is single_word or normalized, which is not supported (T5's are neither)");
            if (!a.content.empty()) added.push_back(std::move(a));
        }
    return v;
}

// ---- The precompiled charsmap: a darts-clone double array over UTF-8, and the replacements. ----

class Charsmap {
  public:
    Charsmap() = default;
    Charsmap(const std::string& blob, const std::string& where) {
        if (blob.empty()) return;
        uint32_t trie_bytes = 0;
        if (blob.size() < 4) throw ModelError(where + ": precompiled charsmap is truncated");
        std::memcpy(&trie_bytes, blob.data(), 4);
        if (trie_bytes % 4 != 0 || trie_bytes > blob.size() - 4 || trie_bytes == 0)
            throw ModelError(where + ": precompiled charsmap is corrupt");
        units_.resize(trie_bytes / 4);
        std::memcpy(units_.data(), blob.data() + 4, trie_bytes);
        normalized_ = blob.substr(4 + trie_bytes);
    }
    bool empty() const { return units_.empty(); }

    // The replacement of the shortest key that is a prefix of `chunk` (what the reference takes),
    // or nullptr when none is.
    const char* first_prefix(std::string_view chunk) const {
        std::size_t pos = 0;
        pos ^= offset(units_[0]);
        for (unsigned char c : chunk) {
            pos ^= c;
            if (pos >= units_.size()) return nullptr;
            const uint32_t unit = units_[pos];
            if ((unit & ((1U << 31) | 0xFF)) != c) return nullptr;
            pos ^= offset(unit);
            if (pos >= units_.size()) return nullptr;
            if ((unit >> 8) & 1) {
                const uint32_t value = units_[pos] & ((1U << 31) - 1);
                return value < normalized_.size() ? normalized_.c_str() + value : nullptr;
            }
        }
        return nullptr;
    }

  private:
    static std::size_t offset(uint32_t unit) { return (unit >> 10) << ((unit & (1U << 9)) >> 6); }
    std::vector<uint32_t> units_;
    std::string normalized_;  // NUL-terminated replacements
};

// Unicode's White_Space, as the reference's WhitespaceSplit (Rust's char::is_whitespace) has it.
bool is_white_space(UChar32 c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

}  // namespace

struct T5Tokenizer::Impl {
    sentencepiece::SentencePieceProcessor spm;
    Charsmap charsmap;
    std::vector<std::string> pieces;  // the reference's vocabulary, by id
    std::vector<AddedToken> added;    // longest first, for leftmost-longest matching
    int64_t unk_id = 2, spm_unk = 0, eos = 1, pad = 0, size = 0;

    std::string normalize(const std::string& text) const;
    void encode_span(const std::string& span, std::vector<int64_t>& out) const;
};

// Note [T5 tokenization]: one grapheme cluster at a time, as the reference's Precompiled.
std::string T5Tokenizer::Impl::normalize(const std::string& text) const {
    const icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);  // invalid UTF-8 becomes U+FFFD
    std::string out;
    if (charsmap.empty()) {
        u.toUTF8String(out);
        return out;
    }
    UErrorCode status = U_ZERO_ERROR;
    std::unique_ptr<icu::BreakIterator> graphemes(
        icu::BreakIterator::createCharacterInstance(icu::Locale::getRoot(), status));
    if (U_FAILURE(status))
        throw ModelError(std::string("ICU has no grapheme break rules: ") + u_errorName(status));
    graphemes->setText(u);
    std::string cluster, ch;
    for (int32_t begin = graphemes->first(), end = graphemes->next(); end != icu::BreakIterator::DONE;
         begin = end, end = graphemes->next()) {
        cluster.clear();
        u.tempSubStringBetween(begin, end).toUTF8String(cluster);
        if (cluster.size() < 6)
            if (const char* whole = charsmap.first_prefix(cluster)) {
                out += whole;
                continue;
            }
        for (int32_t i = begin; i < end; i = u.moveIndex32(i, 1)) {
            ch.clear();
            icu::UnicodeString(u.char32At(i)).toUTF8String(ch);
            const char* mapped = charsmap.first_prefix(ch);
            out += mapped ? std::string(mapped) : ch;
        }
    }
    return out;
}

// A span between added tokens: normalised, split at white space, each word "▁"-prefixed and split
// before every further "▁", each piece segmented by SentencePiece.
void T5Tokenizer::Impl::encode_span(const std::string& span, std::vector<int64_t>& out) const {
    const icu::UnicodeString norm = icu::UnicodeString::fromUTF8(normalize(span));
    std::vector<std::string> words(1);
    for (int32_t i = 0; i < norm.length(); i = norm.moveIndex32(i, 1)) {
        const UChar32 c = norm.char32At(i);
        if (is_white_space(c)) {
            if (!words.back().empty()) words.emplace_back();
            continue;
        }
        icu::UnicodeString(c).toUTF8String(words.back());
    }
    std::vector<int> ids;
    for (std::string& word : words) {
        if (word.empty()) continue;
        if (word.compare(0, kMeta.size(), kMeta) != 0) word.insert(0, kMeta);
        for (std::size_t begin = 0; begin < word.size();) {
            std::size_t end = word.find(kMeta, begin + kMeta.size());
            if (end == std::string::npos) end = word.size();
            ids.clear();
            const auto status = spm.Encode(std::string_view(word).substr(begin, end - begin), &ids);
            if (!status.ok())
                throw InternalError("SentencePiece could not encode a word: " + status.ToString());
            for (int id : ids) out.push_back(id == spm_unk ? unk_id : id);
            begin = end;
        }
    }
}

T5Tokenizer::T5Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

T5Tokenizer T5Tokenizer::from_folder(const std::string& dir) {
    const std::string spiece = dir + "/spiece.model", json = dir + "/tokenizer.json";
    const bool has_spiece = strategies::model_file_exists(spiece),
               has_json = strategies::model_file_exists(json);
    if (!has_spiece && !has_json)
        throw ModelError(dir + ": not a T5 tokenizer folder: it has neither spiece.model nor tokenizer.json");
    auto impl = std::make_shared<Impl>();
    Vocabulary v;
    std::string where;
    if (has_json) {  // what transformers reads when both are there
        where = json;
        v = read_tokenizer_json(json, impl->added);
    } else {
        where = spiece;
        v = read_spiece(strategies::read_model_file(spiece), spiece);
        // T5's sentinels follow the pieces, <extra_id_0> last (transformers' T5Tokenizer).
        int64_t extra_ids = 100;
        const std::string config = dir + "/tokenizer_config.json";
        if (strategies::model_file_exists(config)) {
            try {
                const nlohmann::json c = nlohmann::json::parse(strategies::read_model_file(config));
                if (c.contains("extra_ids") && c["extra_ids"].is_number_integer())
                    extra_ids = std::clamp<int64_t>(c["extra_ids"].get<int64_t>(), 0, 100000);
            } catch (const nlohmann::json::exception& e) {
                throw ModelError(config + ": not valid JSON (" + std::string(e.what()).substr(0, 160) + ")");
            }
        }
        for (int64_t i = extra_ids - 1; i >= 0; --i) {
            v.pieces.push_back("<extra_id_" + std::to_string(i) + ">");
            v.scores.push_back(0.0f);
        }
        for (std::size_t id = 0; id < v.pieces.size(); ++id) {
            const std::string& p = v.pieces[id];
            if (p == "<pad>" || p == "</s>" || p == "<unk>" || p.compare(0, 10, "<extra_id_") == 0)
                impl->added.push_back({p, static_cast<int64_t>(id)});
        }
    }
    // SentencePiece gets the reference's vocabulary as ordinary pieces (so that special pieces
    // spelled out by normalisation match, as they do there), an unknown piece no word can contain,
    // and no normaliser of its own (Note [T5 tokenization]).
    std::string unk_piece = "<unk>";
    while (std::find(v.pieces.begin(), v.pieces.end(), unk_piece + std::string(kMeta)) != v.pieces.end())
        unk_piece += kMeta;
    unk_piece += kMeta;
    std::string model;
    for (std::size_t i = 0; i <= v.pieces.size(); ++i) {
        const bool unk = i == v.pieces.size();
        if (!unk && v.pieces[i].empty())
            throw ModelError(where + ": piece " + std::to_string(i) + " is empty");
        if (!unk && !std::isfinite(v.scores[i]))
            throw ModelError(where + ": piece " + std::to_string(i) + " has a score that is not finite");
        std::string piece;
        put_bytes(piece, 1, unk ? unk_piece : v.pieces[i]);
        put_float(piece, 2, unk ? 0.0f : v.scores[i]);
        put_int(piece, 3, unk ? 2 : 1);  // UNKNOWN : NORMAL
        put_bytes(model, 1, piece);
    }
    std::string trainer, normalizer;
    put_int(trainer, 3, 1);  // model_type: UNIGRAM
    put_int(trainer, 4, static_cast<int64_t>(v.pieces.size() + 1));
    put_int(trainer, 40, static_cast<int64_t>(v.pieces.size()));  // unk_id
    put_int(trainer, 41, -1);                                     // no bos, eos or pad pieces
    put_int(trainer, 42, -1);
    put_int(trainer, 43, -1);
    put_bytes(normalizer, 1, "identity");
    put_int(normalizer, 3, 0);  // add_dummy_prefix
    put_int(normalizer, 4, 0);  // remove_extra_whitespaces
    put_int(normalizer, 5, 0);  // escape_whitespaces
    put_bytes(model, 2, trainer);
    put_bytes(model, 3, normalizer);
    const auto status = impl->spm.LoadFromSerializedProto(model);
    if (!status.ok())
        throw ModelError(where + ": SentencePiece cannot use this vocabulary: " + status.ToString());

    impl->charsmap = Charsmap(v.charsmap, where);
    impl->unk_id = v.unk_id;
    impl->spm_unk = static_cast<int64_t>(v.pieces.size());
    impl->size = static_cast<int64_t>(v.pieces.size());
    for (const AddedToken& a : impl->added) impl->size = std::max(impl->size, a.id + 1);
    impl->pieces = std::move(v.pieces);
    impl->pieces.resize(static_cast<std::size_t>(impl->size));
    for (const AddedToken& a : impl->added) impl->pieces[static_cast<std::size_t>(a.id)] = a.content;
    std::stable_sort(impl->added.begin(), impl->added.end(), [](const AddedToken& a, const AddedToken& b) {
        return a.content.size() > b.content.size();
    });
    auto id_of = [&](const std::string& token) -> int64_t {
        for (const AddedToken& a : impl->added)
            if (a.content == token) return a.id;
        throw ModelError(where + ": T5's special token " + token + " is not an added token");
    };
    impl->eos = id_of("</s>");
    impl->pad = id_of("<pad>");
    return T5Tokenizer(std::move(impl));
}

std::vector<int64_t> T5Tokenizer::tokenize(const std::string& text) const {
    const Impl& t = *impl_;
    std::vector<int64_t> out;
    std::string span;
    auto is_space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
    for (std::size_t i = 0; i < text.size();) {
        const AddedToken* match = nullptr;
        for (const AddedToken& a : t.added)  // longest first: the first that matches is the longest
            if (text.compare(i, a.content.size(), a.content) == 0) {
                match = &a;
                break;
            }
        if (!match) {
            span.push_back(text[i++]);
            continue;
        }
        if (match->lstrip)
            while (!span.empty() && is_space(span.back())) span.pop_back();
        t.encode_span(span, out);
        span.clear();
        out.push_back(match->id);
        i += match->content.size();
        if (match->rstrip)
            while (i < text.size() && is_space(text[i])) ++i;
    }
    t.encode_span(span, out);
    return out;
}

T5Encoding T5Tokenizer::encode(const std::string& text, int max_length) const {
    if (max_length < 1) throw InternalError("T5Tokenizer::encode: max_length must be at least 1");
    const std::vector<int64_t> tokens = tokenize(text);
    const std::size_t keep = std::min(tokens.size(), static_cast<std::size_t>(max_length - 1));
    T5Encoding e;
    e.ids.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(keep));
    e.ids.push_back(impl_->eos);
    e.ids.resize(static_cast<std::size_t>(max_length), impl_->pad);
    e.truncated.assign(tokens.begin() + static_cast<std::ptrdiff_t>(keep), tokens.end());
    e.dropped_tokens = static_cast<int64_t>(e.truncated.size());
    return e;
}

std::string T5Tokenizer::decode(const std::vector<int64_t>& ids) const {
    std::string out;
    bool first = true;
    for (int64_t id : ids) {
        if (id < 0 || id >= impl_->size || impl_->pieces[static_cast<std::size_t>(id)].empty()) continue;
        std::string token = impl_->pieces[static_cast<std::size_t>(id)];
        for (std::size_t p = token.find(kMeta); p != std::string::npos; p = token.find(kMeta, p + 1))
            token.replace(p, kMeta.size(), " ");
        if (first && !token.empty() && token[0] == ' ') token.erase(0, 1);
        first = false;
        out += token;
    }
    return out;
}

int64_t T5Tokenizer::vocab_size() const { return impl_->size; }
int64_t T5Tokenizer::eos_id() const { return impl_->eos; }
int64_t T5Tokenizer::pad_id() const { return impl_->pad; }

}  // namespace dp::runtime
