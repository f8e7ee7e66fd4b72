// T5 (SD3's text_encoder_3 and tokenizer_3) against transformers: tokenizer ids on tricky and
// fuzzed strings, its folders and errors; the encoder's hidden states in fp32, bf16 and fp16,
// its config errors and weight layouts. Its tensor parallelism and a layer more than its weights are a
// row of test_text_encoders.cpp.
#include "unit/doctest_torch.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/models/common/t5_encoder.h"
#include "runtime/models/common/t5_tokenizer.h"
#include "unit/temp_dir.h"

using namespace dp::runtime;

namespace {

const std::string kTokenizer = golden_path("t5_tokenizer");
const std::string kEncoder = golden_path("t5_encoder");

std::vector<int64_t> ids_of(const at::Tensor& t) {
    const at::Tensor c = t.to(at::kLong).contiguous();
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// A fresh folder under /tmp, removed (with its files) when the test ends.
struct TempDir : dp::test::TempDir {
    TempDir() : dp::test::TempDir("t5") {}
};

struct TokenizerGolden {
    std::shared_ptr<SafetensorsFile> file = SafetensorsFile::open(golden_path("t5_tokenizer.safetensors"));
    nlohmann::json meta = nlohmann::json::parse(file->metadata().at("cases"));
    std::vector<int64_t> tensor(const std::string& name) const {
        return ids_of(load_tensor(file, name, at::kLong));
    }
};

// Every fuzzed string's ids as the reference gave them (with </s>).
void check_fuzz(const T5Tokenizer& tok, const TokenizerGolden& g) {
    const std::vector<int64_t> flat = g.tensor("fuzz.ids"), lengths = g.tensor("fuzz.lengths");
    const auto& fuzz = g.meta["fuzz"];
    REQUIRE(fuzz.size() == lengths.size());
    std::size_t at = 0, wrong = 0;
    for (std::size_t i = 0; i < fuzz.size(); ++i) {
        const std::string text = fuzz[i].get<std::string>();
        const auto n = static_cast<std::size_t>(lengths[i]);
        const std::vector<int64_t> want(flat.begin() + static_cast<std::ptrdiff_t>(at),
                                        flat.begin() + static_cast<std::ptrdiff_t>(at + n));
        at += n;
        std::vector<int64_t> got = tok.tokenize(text);
        got.push_back(tok.eos_id());
        if (got != want && ++wrong <= 5) CHECK_MESSAGE(got == want, "fuzzed string " << i << ": " << text);
    }
    CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("T5 tokenizer ids equal transformers' on every golden string, padded, truncated and decoded") {
    const TokenizerGolden g;
    const T5Tokenizer tok = T5Tokenizer::from_folder(kTokenizer);
    const int max_length = g.meta["max_length"].get<int>();
    const auto& strings = g.meta["strings"];
    REQUIRE(strings.size() >= 40);
    CHECK(tok.vocab_size() == g.meta["vocab_size"].get<int64_t>());
    CHECK(tok.eos_id() == 1);
    CHECK(tok.pad_id() == 0);
    int truncated = 0;
    for (std::size_t i = 0; i < strings.size(); ++i) {
        const std::string text = strings[i].get<std::string>();
        CAPTURE(i);
        CAPTURE(text);
        const std::vector<int64_t> full = g.tensor("full." + std::to_string(i));
        const T5Encoding enc = tok.encode(text, max_length);
        CHECK(enc.ids == g.tensor("ids." + std::to_string(i)));
        std::vector<int64_t> ours = tok.tokenize(text);
        ours.push_back(tok.eos_id());
        CHECK(ours == full);
        const auto dropped = std::max<int64_t>(0, static_cast<int64_t>(full.size()) - max_length);
        CHECK(enc.dropped_tokens == dropped);
        CHECK(enc.truncated.size() == static_cast<std::size_t>(dropped));
        CHECK(tok.decode(full) == g.meta["decoded"][i].get<std::string>());
        CHECK(tok.decode(enc.truncated) == g.meta["removed"][i].get<std::string>());
        truncated += dropped > 0;
    }
    CHECK(truncated >= 3);
    check_fuzz(tok, g);
}

TEST_CASE("T5 tokenizer folders with spiece.model alone or tokenizer.json alone tokenize the same") {
    const TokenizerGolden g;
    const auto& strings = g.meta["strings"];
    for (const std::string file : {"spiece.model", "tokenizer.json"}) {
        CAPTURE(file);
        const TempDir dir;
        dir.copy(kTokenizer + "/" + file, file);
        const T5Tokenizer tok = T5Tokenizer::from_folder(dir.path);
        CHECK(tok.vocab_size() == g.meta["vocab_size"].get<int64_t>());
        for (std::size_t i = 0; i < strings.size(); ++i) {
            std::vector<int64_t> ours = tok.tokenize(strings[i].get<std::string>());
            ours.push_back(tok.eos_id());
            CHECK(ours == g.tensor("full." + std::to_string(i)));
        }
        check_fuzz(tok, g);
    }
}

TEST_CASE("T5 tokenizer: literal specials, white space, truncation and max_length edges") {
    const T5Tokenizer tok = T5Tokenizer::from_folder(kTokenizer);
    CHECK(tok.encode("", 4).ids == std::vector<int64_t>{1, 0, 0, 0});
    CHECK(tok.encode(" \t\n ", 3).ids == std::vector<int64_t>{1, 0, 0});
    CHECK(tok.tokenize("</s>") == std::vector<int64_t>{1});
    CHECK(tok.tokenize("<pad><extra_id_0>") == std::vector<int64_t>{0, tok.vocab_size() - 1});
    CHECK(tok.tokenize("  a  photo ") == tok.tokenize("a photo"));
    const T5Encoding one = tok.encode("a photo of a cat", 1);  // room for </s> only
    CHECK(one.ids == std::vector<int64_t>{1});
    CHECK(one.dropped_tokens == static_cast<int64_t>(tok.tokenize("a photo of a cat").size()));
    CHECK(tok.decode(one.truncated) == "a photo of a cat");
    CHECK_THROWS_AS(tok.encode("x", 0), InternalError);
    CHECK(tok.decode({}).empty());
    CHECK(tok.decode({-1, 100000}).empty());
}

TEST_CASE("T5 tokenizer folders that cannot be used are errors naming the folder or file") {
    CHECK_THROWS_WITH_AS(T5Tokenizer::from_folder("/nonexistent/tokenizer_3"),
                         doctest::Contains("/nonexistent/tokenizer_3: not a T5 tokenizer folder"),
                         ModelError);
    const TempDir dir;
    dir.write("spiece.model", "not a sentencepiece model");
    const std::string spiece = dir.path + "/spiece.model";
    CHECK_THROWS_WITH_AS(T5Tokenizer::from_folder(dir.path), doctest::Contains(spiece.c_str()), ModelError);
    dir.write("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {}, "merges": []}})");
    CHECK_THROWS_WITH_AS(T5Tokenizer::from_folder(dir.path), doctest::Contains("not a Unigram model"),
                         ModelError);
    dir.write("tokenizer.json", "{oops");
    CHECK_THROWS_WITH_AS(T5Tokenizer::from_folder(dir.path),
                         doctest::Contains("tokenizer.json: not valid JSON"), ModelError);
    dir.write("tokenizer.json", R"({"model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0]]},
                                   "added_tokens": []})");
    CHECK_THROWS_WITH_AS(T5Tokenizer::from_folder(dir.path), doctest::Contains("</s> is not an added token"),
                         ModelError);
}

TEST_CASE("T5 encoder matches transformers in fp32, bf16 and fp16 (fp16 keeps wo in fp32)") {
    auto golden = SafetensorsFile::open(golden_path("t5_encoder.safetensors"));
    const at::Tensor ids = load_tensor(golden, "input_ids", at::kLong);
    const T5Config config = T5Config::from_json_file(kEncoder + "/config.json");
    CHECK(config.relative_attention_max_distance == 20);
    // Measured on CPU: 0 in every dtype (the same kernels as the reference, the CPU paths pinned as
    // the golden tensors were written: Note [Tests pin the CPU code paths]). The half-precision
    // bounds are one unit in the last place of the largest outputs (|h| ~3.4): tight enough to
    // catch running in fp32 and casting (bf16 3.7e-2, fp16 3.3e-3 off) or fp16 without its fp32
    // wo (3.9e-3 off), loose enough for another kernel's rounding.
    struct Case {
        const char* name;
        at::ScalarType dtype;
        double tolerance;
    };
    for (const Case c : {Case{"fp32", at::kFloat, 1e-4}, Case{"bf16", at::kBFloat16, 1.6e-2},
                         Case{"fp16", at::kHalf, 2e-3}}) {
        const std::string name = c.name;
        CAPTURE(name);
        WeightStore weights = WeightStore::open_folder(kEncoder, c.dtype, at::kCPU);
        const T5Encoder encoder(config, weights);
        weights.check_all_taken();
        const at::Tensor out = encoder.forward(ids);
        CHECK(static_cast<int>(out.scalar_type()) == static_cast<int>(c.dtype));
        const at::Tensor want = load_tensor(golden, "hidden." + name, at::kFloat);
        const double diff = max_diff(out, want);
        MESSAGE(name << ": max |diff| " << diff << " (max |h| " << want.abs().max().item<double>() << ")");
        CHECK(diff <= c.tolerance);
    }
}

TEST_CASE(
    "T5's other feed-forwards (v1.0 relu, gated-silu, gelu) match transformers, and relu is the default") {
    auto golden = SafetensorsFile::open(golden_path("t5_feed_forwards.safetensors"));
    const at::Tensor ids = load_tensor(golden, "input_ids", at::kLong);
    for (const auto& [kind, folder] :
         std::vector<std::pair<std::string, std::string>>{{"relu", "t5_encoder_relu"},
                                                          {"gated-silu", "t5_encoder_gated_silu"},
                                                          {"gelu", "t5_encoder_gelu"}}) {
        CAPTURE(kind);
        const std::string dir = golden_path(folder);
        const T5Config config = T5Config::from_json_file(dir + "/config.json");
        CHECK(config.feed_forward_proj == kind);
        WeightStore weights = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
        const T5Encoder encoder(config, weights);
        weights.check_all_taken();
        const double diff = max_diff(encoder.forward(ids), load_tensor(golden, "hidden." + kind, at::kFloat));
        MESSAGE(kind << ": max |diff| " << diff);
        CHECK(diff <= 1e-5);
    }
    nlohmann::json j = nlohmann::json::parse(read_text_file(golden_path("t5_encoder_relu/config.json")));
    j.erase("feed_forward_proj");
    CHECK(T5Config::from_json_text(j.dump(), "c.json").activation() == "relu");
    CHECK_FALSE(T5Config::from_json_text(j.dump(), "c.json").gated());
}

TEST_CASE("T5 encoder outputs at pads are neither zero nor equal to each other, as the reference's") {
    auto golden = SafetensorsFile::open(golden_path("t5_encoder.safetensors"));
    const at::Tensor ids = load_tensor(golden, "input_ids", at::kLong);
    WeightStore weights = WeightStore::open_folder(kEncoder, at::kFloat, at::kCPU);
    const T5Encoder encoder(T5Config::from_json_file(kEncoder + "/config.json"), weights);
    const at::Tensor ours = encoder.forward(ids);
    const at::Tensor want = load_tensor(golden, "hidden.fp32", at::kFloat);
    for (const at::Tensor& h : {ours, want}) {
        const at::Tensor row = h[0];  // row 0: the prompt, </s>, then pads
        std::vector<int64_t> pads;
        for (int64_t t = 0; t < ids.size(1); ++t)
            if (ids[0][t].item<int64_t>() == 0) pads.push_back(t);
        REQUIRE(pads.size() >= 8);
        for (int64_t p : pads) CHECK(row[p].abs().max().item<double>() > 1e-3);
        for (std::size_t i = 1; i < pads.size(); ++i)
            CHECK(max_diff(row[pads[i]], row[pads[i - 1]]) > 1e-4);  // the position bias tells them apart
    }
}

TEST_CASE("T5 encoder takes shared.weight, encoder.embed_tokens.weight or both, and reports stray tensors") {
    auto source = SafetensorsFile::open(kEncoder + "/model.safetensors");
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& [name, info] : source->tensors())
        tensors.emplace_back(name, load_tensor(source, name, at::kFloat));
    const T5Config config = T5Config::from_json_file(kEncoder + "/config.json");
    const at::Tensor ids = at::arange(3, 20, at::kLong).view({1, -1});
    WeightStore reference_weights = WeightStore::open_folder(kEncoder, at::kFloat, at::kCPU);
    const at::Tensor reference = T5Encoder(config, reference_weights).forward(ids);
    auto with = [&](const std::vector<std::string>& embeddings, bool stray) {
        std::vector<std::pair<std::string, at::Tensor>> out;
        for (const auto& [name, t] : tensors)
            if (name == "shared.weight")
                for (const std::string& e : embeddings) out.emplace_back(e, t);
            else
                out.emplace_back(name, t);
        if (stray) out.emplace_back("encoder.block.9.extra.weight", at::zeros({2}));
        return out;
    };
    for (const auto& names : std::vector<std::vector<std::string>>{
             {"encoder.embed_tokens.weight"}, {"shared.weight", "encoder.embed_tokens.weight"}}) {
        CAPTURE(names.size());
        const TempDir dir;
        save_safetensors(dir.path + "/model.safetensors", with(names, false));
        WeightStore weights = WeightStore::open_folder(dir.path, at::kFloat, at::kCPU);
        const T5Encoder encoder(config, weights);
        CHECK_NOTHROW(weights.check_all_taken());
        CHECK(max_diff(encoder.forward(ids), reference) == 0);
    }
    const TempDir dir;
    save_safetensors(dir.path + "/model.safetensors", with({"shared.weight"}, true));
    WeightStore weights = WeightStore::open_folder(dir.path, at::kFloat, at::kCPU);
    const T5Encoder encoder(config, weights);
    CHECK_THROWS_WITH_AS(weights.check_all_taken(), doctest::Contains("encoder.block.9.extra.weight"),
                         ModelError);
}

TEST_CASE("T5 config errors name the file and key") {
    const std::string good = read_text_file(kEncoder + "/config.json");
    auto with = [&](const std::string& key, const nlohmann::json& value) {
        nlohmann::json j = nlohmann::json::parse(good);
        if (value.is_discarded())
            j.erase(key);
        else
            j[key] = value;
        return j.dump();
    };
    const nlohmann::json erase = nlohmann::json::value_t::discarded;
    CHECK_NOTHROW(T5Config::from_json_text(good, "te3/config.json"));
    struct Bad {
        std::string key;
        nlohmann::json value;
    };
    for (const Bad& b : {Bad{"feed_forward_proj", "gated-tanh"}, Bad{"feed_forward_proj", "swish"},
                         Bad{"feed_forward_proj", 3}, Bad{"num_heads", "four"}, Bad{"d_model", 0},
                         Bad{"model_type", "umt5"}, Bad{"relative_attention_max_distance", 4},
                         Bad{"is_decoder", true}, Bad{"layer_norm_epsilon", -1}}) {
        CAPTURE(b.key);
        CHECK_THROWS_WITH_AS(T5Config::from_json_text(with(b.key, b.value), "te3/config.json"),
                             doctest::Contains("te3/config.json"), ModelError);
        CHECK_THROWS_WITH_AS(T5Config::from_json_text(with(b.key, b.value), "te3/config.json"),
                             doctest::Contains(b.key.c_str()), ModelError);
    }
    CHECK_THROWS_WITH_AS(T5Config::from_json_file("/nonexistent/config.json"),
                         doctest::Contains("/nonexistent/config.json"), ModelError);
}

TEST_CASE(
    "T5 tokenizer takes any bytes without crashing: invalid UTF-8, NULs, lone surrogates, long inputs") {
    const T5Tokenizer tok = T5Tokenizer::from_folder(golden_path("t5_tokenizer"));
    std::mt19937_64 rng(7);
    std::vector<std::string> inputs = {std::string("\xff\xfe\x80", 3),
                                       std::string("a\0b", 3),
                                       "\xed\xa0\x80",
                                       "\xc3",
                                       "\xf4\x90\x80\x80",
                                       std::string(20000, ' '),
                                       std::string(5000, 'x') + "</s" + std::string(5000, '>')};
    for (int i = 0; i < 300; ++i) {
        std::string s(rng() % 64, '\0');
        for (char& c : s) c = static_cast<char>(rng() & 0xff);
        inputs.push_back(s);
    }
    for (const std::string& text : inputs) {
        const T5Encoding e = tok.encode(text, 32);
        REQUIRE(e.ids.size() == 32);
        for (int64_t id : e.ids) CHECK((id >= 0 && id < tok.vocab_size()));
        (void)tok.decode(e.truncated);
    }
}
