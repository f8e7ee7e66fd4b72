// CLIP tokenizer ids against transformers' CLIPTokenizer on tricky strings (punctuation, emoji,
// accents, CJK, white space, literal special tokens, long input), with CLIP's real merges.
#include "unit/doctest_torch.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/models/common/clip_tokenizer.h"
#include "shapes/shapes_world.h"
#include "support/test_paths.h"

using namespace dp::runtime;

namespace {
const std::string kFolder = golden_path("clip_tokenizer");

std::vector<int64_t> ids_of(const std::shared_ptr<SafetensorsFile>& f, const std::string& name) {
    at::Tensor t = load_tensor(f, name, at::kLong);
    return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}
}  // namespace

TEST_CASE("ids equal transformers' on every golden string, padded, truncated and untruncated") {
    auto golden = SafetensorsFile::open(golden_path("clip_tokenizer.safetensors"));
    const auto strings = nlohmann::json::parse(golden->metadata().at("cases"))["strings"];
    const ClipTokenizer tok = ClipTokenizer::from_folder(kFolder);
    const ClipTokenizer bang = ClipTokenizer::from_strings(
        slurp(kFolder + "/vocab.json"), slurp(kFolder + "/merges.txt"), R"({"pad_token": "!"})", kFolder);
    REQUIRE(strings.size() >= 15);
    for (std::size_t i = 0; i < strings.size(); ++i) {
        const std::string text = strings[i].get<std::string>();
        CAPTURE(text);
        const ClipEncoding enc = tok.encode(text);
        CHECK(enc.ids == ids_of(golden, "ids." + std::to_string(i)));
        CHECK(bang.encode(text).ids == ids_of(golden, "ids_pad_bang." + std::to_string(i)));
        const std::vector<int64_t> full = ids_of(golden, "full." + std::to_string(i));
        std::vector<int64_t> ours = {tok.bos_id()};
        for (int64_t id : tok.tokenize(text)) ours.push_back(id);
        ours.push_back(tok.eos_id());
        CHECK(ours == full);
        CHECK(enc.dropped_tokens == std::max<int>(0, static_cast<int>(full.size()) - 77));
    }
}

TEST_CASE("a long prompt reports how many tokens were dropped, and decode gives them back as text") {
    const ClipTokenizer tok = ClipTokenizer::from_folder(kFolder);
    std::string text;
    for (int i = 0; i < 100; ++i) text += "red ";
    const ClipEncoding enc = tok.encode(text);
    CHECK(enc.ids.size() == 77);
    CHECK(enc.dropped_tokens == 25);
    CHECK(tok.decode(enc.truncated).find("red red") == 0);
    CHECK(tok.decode(tok.tokenize("a photo of a cat")) == "a photo of a cat");
}

TEST_CASE("bad tokenizer files are errors naming the file") {
    CHECK_THROWS_WITH_AS(ClipTokenizer::from_folder("/nonexistent"), doctest::Contains("vocab.json"),
                         ModelError);
    CHECK_THROWS_WITH_AS(ClipTokenizer::from_strings("{oops", "", "", "tok"),
                         doctest::Contains("tok/vocab.json"), ModelError);
    CHECK_THROWS_WITH_AS(ClipTokenizer::from_strings(R"({"a": 0, "<|startoftext|>": 1, "<|endoftext|>": 2})",
                                                     "a b c\n", "", "tok"),
                         doctest::Contains("tok/merges.txt:1"), ModelError);
    CHECK_THROWS_WITH_AS(ClipTokenizer::from_strings(R"({"a": 0})", "", "", "tok"),
                         doctest::Contains("not in vocab.json"), ModelError);
}

TEST_CASE(
    "the shipped shapes model's tokenizer: every grammar word is one token, and both tokenizers agree") {
    const std::string dir = std::string(DP_MODELS_DIR) + "/shapes-sd3";
    const ClipTokenizer tok = ClipTokenizer::from_folder(dir + "/tokenizer");
    const ClipTokenizer tok2 = ClipTokenizer::from_folder(dir + "/tokenizer_2");
    // The shipped tokenizer is built from grammar_words(): every word of both generators is one
    // token (the free phrasings' connectives too, though training never writes them).
    for (const std::string& word : dp::shapes::grammar_words()) {
        CAPTURE(word);
        const std::vector<int64_t> ids = tok.tokenize(word);
        CHECK(tok2.tokenize(word) == ids);
        CHECK(tok.decode(ids) == word);
        CHECK(ids.size() == 1);
    }
    // Text outside the grammar still tokenizes, through the byte symbols.
    CHECK(tok.tokenize("zebra 42!").size() > 3);
    const ClipEncoding e = tok.encode("a small red circle on the left on a blue background");
    CHECK(e.ids.size() == static_cast<std::size_t>(tok.model_max_length()));
    CHECK(e.ids.front() == tok.bos_id());
    CHECK(e.ids[12] == tok.eos_id());  // 11 words, one token each
    CHECK(e.dropped_tokens == 0);
}

TEST_CASE("fuzz: 3000 random byte strings encode to max_length ids in the vocabulary, or a clean error") {
    const ClipTokenizer tok = ClipTokenizer::from_folder(kFolder);
    const int64_t vocab = static_cast<int64_t>(nlohmann::json::parse(slurp(kFolder + "/vocab.json")).size());
    std::mt19937_64 rng(7);
    const std::string pieces[] = {"a",
                                  " ",
                                  "<|startoftext|>",
                                  "<|endoftext|>",
                                  "\xf0\x9f\x98\x80",
                                  "\xe2\x80\x8b",
                                  "\xff",
                                  "\xc3",
                                  "\xed\xa0\x80",
                                  "!",
                                  "\t\n",
                                  "ABC",
                                  "\xe4\xb8\xad",
                                  "'s",
                                  "123"};
    int encoded = 0, refused = 0;
    for (int i = 0; i < 3000; ++i) {
        std::string text;
        for (int n = static_cast<int>(rng() % 40); n > 0; --n) {
            if (rng() % 3 == 0)
                text += static_cast<char>(rng() % 256);
            else
                text += pieces[rng() % std::size(pieces)];
        }
        try {
            const ClipEncoding e = tok.encode(text);
            REQUIRE(static_cast<int>(e.ids.size()) == tok.model_max_length());
            for (int64_t id : e.ids) REQUIRE((id >= 0 && id < vocab));
            ++encoded;
        } catch (const dp::protocol::Error&) {
            ++refused;  // ours, with a message: never a crash or a foreign exception
        }
    }
    MESSAGE(encoded << " encoded, " << refused << " refused");
    CHECK(encoded > 1000);
}
