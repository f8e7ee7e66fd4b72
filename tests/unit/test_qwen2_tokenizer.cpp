// Qwen2 tokenizer ids against transformers' Qwen2Tokenizer on tricky strings (CJK, emoji with
// joiners, white space runs, contractions in both cases, digit runs, combining marks, added tokens
// written inline, Qwen-Image's prompt template), from every folder layout a real one comes in.
#include "unit/doctest_torch.h"

#include <stdlib.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "runtime/io/errors.h"
#include "runtime/io/safetensors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/models/common/mistral_tokenizer.h"
#include "runtime/models/common/qwen2_tokenizer.h"
#include "unit/temp_dir.h"

using namespace dp::runtime;

namespace {
const std::string kFolder = golden_path("qwen2_tokenizer");           // vocab.json + merges.txt + config
const std::string kJsonFolder = golden_path("qwen2_tokenizer_json");  // tokenizer.json + config

struct TempDir : dp::test::TempDir {
    TempDir() : dp::test::TempDir("qwen2_tok") {}
    void copy_from(const std::string& dir, const std::string& name) const { copy(dir + "/" + name, name); }
};

std::vector<int64_t> ids_of(const std::shared_ptr<SafetensorsFile>& f, const std::string& name) {
    at::Tensor t = load_tensor(f, name, at::kLong);
    return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

nlohmann::json golden_meta(const std::shared_ptr<SafetensorsFile>& f) {
    return nlohmann::json::parse(f->metadata().at("cases"));
}
}  // namespace

TEST_CASE("Qwen2 ids equal transformers' on every golden string, from every folder layout") {
    auto golden = SafetensorsFile::open(golden_path("qwen2_tokenizer.safetensors"));
    const nlohmann::json meta = golden_meta(golden);
    const auto& strings = meta["strings"];
    REQUIRE(strings.size() >= 20);

    // tokenizer.json with nothing beside it, and with its merges written as "a b" strings.
    TempDir alone, string_merges, no_added_json;
    alone.copy_from(kJsonFolder, "tokenizer.json");
    nlohmann::json tj = nlohmann::json::parse(read_text_file(kJsonFolder + "/tokenizer.json"));
    REQUIRE(tj["model"]["merges"][0].is_array());
    for (auto& m : tj["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
    string_merges.write("tokenizer.json", tj.dump());
    string_merges.copy_from(kJsonFolder, "tokenizer_config.json");
    // vocab.json + merges.txt with the added tokens only in tokenizer_config.json's added_tokens_decoder.
    for (const char* name : {"vocab.json", "merges.txt", "tokenizer_config.json"})
        no_added_json.copy_from(kFolder, name);

    const std::vector<std::pair<std::string, Qwen2Tokenizer>> layouts = {
        {"vocab.json + merges.txt", Qwen2Tokenizer::from_folder(kFolder)},
        {"tokenizer.json", Qwen2Tokenizer::from_folder(kJsonFolder)},
        {"tokenizer.json alone", Qwen2Tokenizer::from_folder(alone.path)},
        {"tokenizer.json with string merges", Qwen2Tokenizer::from_folder(string_merges.path)},
        {"no added_tokens.json", Qwen2Tokenizer::from_folder(no_added_json.path)},
    };
    for (const auto& [layout, tok] : layouts) {
        CAPTURE(layout);
        CHECK(tok.vocab_size() == meta["vocab_size"].get<std::size_t>());
        CHECK(tok.pad_id() == meta["pad_id"].get<int64_t>());
        CHECK(tok.bos_id() == -1);
        for (const auto& [token, id] : meta["added"].items()) {
            CAPTURE(token);
            CHECK(tok.id_of(token) == id.get<int64_t>());
            CHECK(tok.tokenize(token) == std::vector<int64_t>{id.get<int64_t>()});
        }
        for (std::size_t i = 0; i < strings.size(); ++i) {
            const std::string text = strings[i].get<std::string>();
            CAPTURE(text);
            const std::vector<int64_t> ids = tok.tokenize(text);
            CHECK(ids == ids_of(golden, "ids." + std::to_string(i)));
            CHECK(tok.decode(ids) == meta["decoded"][i].get<std::string>());
        }
    }
    // The eos the config names (<|im_end|>); with no config, transformers' default <|endoftext|>.
    CHECK(layouts[0].second.eos_id() == meta["eos_id"].get<int64_t>());
    CHECK(layouts[1].second.eos_id() == meta["eos_id"].get<int64_t>());
    CHECK(layouts[2].second.eos_id() == meta["pad_id"].get<int64_t>());
}

TEST_CASE(
    "Qwen2 ids equal transformers' on 400 random strings of white space, marks, emoji and added tokens") {
    auto golden = SafetensorsFile::open(golden_path("qwen2_tokenizer.safetensors"));
    const nlohmann::json meta = golden_meta(golden);
    const std::vector<int64_t> flat = ids_of(golden, "fuzz.ids"), lengths = ids_of(golden, "fuzz.lengths");
    REQUIRE(lengths.size() == meta["fuzz"].size());
    for (const std::string& dir : {kFolder, kJsonFolder}) {
        const Qwen2Tokenizer tok = Qwen2Tokenizer::from_folder(dir);
        std::size_t at = 0;
        for (std::size_t i = 0; i < lengths.size(); ++i) {
            const std::string text = meta["fuzz"][i].get<std::string>();
            CAPTURE(dir);
            CAPTURE(text);
            const std::vector<int64_t> want(flat.begin() + static_cast<std::ptrdiff_t>(at),
                                            flat.begin() + static_cast<std::ptrdiff_t>(at + lengths[i]));
            at += static_cast<std::size_t>(lengths[i]);
            CHECK(tok.tokenize(text) == want);
        }
        CHECK(at == flat.size());
    }
}

TEST_CASE("Qwen2's tokenizer: the prompt template's special tokens are single ids, nothing is wrapped") {
    const Qwen2Tokenizer tok = Qwen2Tokenizer::from_folder(kFolder);
    const int64_t im_start = tok.id_of("<|im_start|>"), im_end = tok.id_of("<|im_end|>");
    REQUIRE(im_start >= 0);
    REQUIRE(im_end >= 0);
    CHECK(tok.tokenize("").empty());
    const std::vector<int64_t> ids = tok.tokenize("<|im_start|>user\nx<|im_end|>\n");
    CHECK(ids.front() == im_start);
    CHECK(std::count(ids.begin(), ids.end(), im_end) == 1);
    CHECK(tok.id_of("not a token") == -1);
}

TEST_CASE("bad Qwen2 tokenizer files are errors naming the file") {
    CHECK_THROWS_WITH_AS(Qwen2Tokenizer::from_folder("/nonexistent"), doctest::Contains("tokenizer.json"),
                         ModelError);
    const std::string vocab = read_text_file(kFolder + "/vocab.json");
    const std::string merges = read_text_file(kFolder + "/merges.txt");
    CHECK_THROWS_WITH_AS(Qwen2Tokenizer::from_strings("{oops", merges, "", "tok"),
                         doctest::Contains("tok/vocab.json"), ModelError);
    CHECK_THROWS_WITH_AS(Qwen2Tokenizer::from_strings(vocab, "a b c\n", "", "tok"),
                         doctest::Contains("tok/merges.txt:1"), ModelError);
    CHECK_THROWS_WITH_AS(Qwen2Tokenizer::from_strings(vocab, merges, "[1", "tok"),
                         doctest::Contains("tok/tokenizer_config.json"), ModelError);
    CHECK_THROWS_WITH_AS(
        Qwen2Tokenizer::from_strings(vocab, merges, R"({"eos_token": "a", "pad_token": "<|nope|>"})", "tok"),
        doctest::Contains("pad_token '<|nope|>'"), ModelError);
    CHECK_THROWS_WITH_AS(
        Qwen2Tokenizer::from_strings(vocab, merges,
                                     R"({"added_tokens_decoder": {"5": {"content": "<|x|>"}}})", "tok"),
        doctest::Contains("takes id 5"), ModelError);
    CHECK_THROWS_WITH_AS(
        Qwen2Tokenizer::from_strings(
            vocab, merges, R"({"added_tokens_decoder": {"99999": {"content": "<|x|>", "lstrip": true}}})",
            "tok"),
        doctest::Contains("tok/tokenizer_config.json: added token '<|x|>' sets \"lstrip\""), ModelError);

    TempDir bad_json, clip_json, bad_merge, bad_added;
    bad_json.write("tokenizer.json", "{\"model\": ");
    CHECK_THROWS_WITH_AS(Qwen2Tokenizer::from_folder(bad_json.path),
                         doctest::Contains((bad_json.path + "/tokenizer.json: not valid JSON").c_str()),
                         ModelError);
    nlohmann::json tj = nlohmann::json::parse(read_text_file(kJsonFolder + "/tokenizer.json"));
    tj["model"]["end_of_word_suffix"] = "</w>";
    clip_json.write("tokenizer.json", tj.dump());
    CHECK_THROWS_WITH_AS(Qwen2Tokenizer::from_folder(clip_json.path),
                         doctest::Contains("tokenizer.json: not a Qwen2 tokenizer"), ModelError);
    tj["model"]["end_of_word_suffix"] = "";
    tj["model"]["merges"][3] = 7;
    bad_merge.write("tokenizer.json", tj.dump());
    CHECK_THROWS_WITH_AS(Qwen2Tokenizer::from_folder(bad_merge.path),
                         doctest::Contains("tokenizer.json: a merge is neither"), ModelError);
    for (const char* name : {"vocab.json", "merges.txt"}) bad_added.copy_from(kFolder, name);
    bad_added.write("added_tokens.json", R"({"<|endoftext|>": "x"})");
    CHECK_THROWS_WITH_AS(Qwen2Tokenizer::from_folder(bad_added.path),
                         doctest::Contains((bad_added.path + "/added_tokens.json").c_str()), ModelError);
}

// Mistral 3's tekken tokenizer (scripts/golden/golden_mistral3.py): the same vocabulary under the
// two split patterns its published files are said to carry (Llama 3's, tekken's), from the file.
TEST_CASE(
    "Mistral 3's tokenizer: ids equal transformers' under either split pattern, and FLUX.2-dev's "
    "prompts in its system template with their control tokens") {
    const auto g = SafetensorsFile::open(golden_path("mistral3_encoder.safetensors"));
    const nlohmann::json meta = golden_meta(g);
    for (const auto& [folder, prefix] :
         {std::pair{"tokenizer", "ids."}, std::pair{"tokenizer_tekken", "tekken_ids."}}) {
        CAPTURE(folder);
        const MistralTokenizer tok = MistralTokenizer::from_folder(golden_path("mistral3_encoder/") + folder);
        CHECK(tok.bos_id() == meta.at("bos_id").get<int64_t>());
        CHECK(tok.pad_id() == meta.at("pad_id").get<int64_t>());
        for (const auto& [token, id] : meta.at("special").items())
            CHECK(tok.id_of(token) == id.get<int64_t>());
        for (std::size_t i = 0; i < meta.at("strings").size(); ++i) {
            CAPTURE(meta.at("strings")[i].get<std::string>());
            CHECK(tok.tokenize(meta.at("strings")[i].get<std::string>()) ==
                  ids_of(g, prefix + std::to_string(i)));
        }
    }
    // The pipeline's rows: the rendered template, cut at max_sequence_length, padded on its side.
    const MistralTokenizer tok = MistralTokenizer::from_folder(golden_path("mistral3_encoder/tokenizer"));
    for (const std::string name : {"left", "right", "cut", "cut_system", "ids_only"}) {
        CAPTURE(name);
        const nlohmann::json& c = meta.at("cases").at(name);
        const at::Tensor ids = load_tensor(g, name + ".input_ids", at::kLong);
        const at::Tensor mask = load_tensor(g, name + ".attention_mask", at::kLong);
        const bool left = c.at("padding_side") == "left";
        for (std::size_t k = 0; k < c.at("texts").size(); ++k) {
            std::vector<int64_t> own = tok.tokenize(c.at("texts")[k].get<std::string>());
            own.resize(std::min<std::size_t>(own.size(), c.at("max_sequence_length").get<std::size_t>()));
            const auto row = static_cast<int64_t>(k), n = static_cast<int64_t>(own.size());
            CHECK(mask[row].sum().item<int64_t>() == n);
            const at::Tensor real = ids[row].narrow(0, left ? ids.size(1) - n : 0, n);
            CHECK(at::equal(real, at::tensor(own, at::kLong)));
        }
    }
    TempDir dir;  // a vocab.json + merges.txt folder carries no split pattern
    dir.copy_from(kFolder, "vocab.json");
    dir.copy_from(kFolder, "merges.txt");
    CHECK_THROWS_WITH_AS(MistralTokenizer::from_folder(dir.path), doctest::Contains("tokenizer.json"),
                         ModelError);
}
