// CLIPTextModelWithProjection against transformers (tiny CLIP-L and CLIP-G shapes, fp32, CPU):
// the hidden states SD3 uses (with and without clip_skip) and the projected pooled output; and
// CLIPTextModel (FLUX's, no projection): its pooler_output.
#include "unit/doctest_torch.h"

#include <unistd.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/models/common/clip_text_encoder.h"
#include "support/test_paths.h"

using namespace dp::runtime;

namespace {}  // namespace

TEST_CASE("CLIP text encoders match transformers within 1e-4") {
    for (const std::string name : {"clip_l", "clip_g"}) {
        CAPTURE(name);
        const std::string dir = golden_path(name);
        WeightStore weights = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
        ClipTextEncoder encoder(ClipTextConfig::from_json_file(dir + "/config.json"), weights);
        weights.check_all_taken();
        auto golden = SafetensorsFile::open(dir + ".safetensors");
        const at::Tensor ids = load_tensor(golden, "input_ids", at::kLong);
        const ClipTextOutput out0 = encoder.forward(ids, 0);
        const ClipTextOutput out1 = encoder.forward(ids, 1);
        const double d_hidden = max_diff(out0.hidden, load_tensor(golden, "hidden_skip0", at::kFloat));
        const double d_skip = max_diff(out1.hidden, load_tensor(golden, "hidden_skip1", at::kFloat));
        const double d_pooled = max_diff(out0.pooled, load_tensor(golden, "pooled", at::kFloat));
        MESSAGE(name << ": max |diff| hidden " << d_hidden << ", clip_skip=1 " << d_skip << ", pooled "
                     << d_pooled);
        CHECK(d_hidden <= 1e-4);
        CHECK(d_skip <= 1e-4);
        CHECK(d_pooled <= 1e-4);
    }
}

TEST_CASE("CLIPTextModel (no projection) gives transformers' pooler_output within 1e-4") {
    const std::string dir = std::string(DP_MODELS_DIR) + "/tiny-random-flux-dev/text_encoder";
    const ClipTextConfig config = ClipTextConfig::from_json_file(dir + "/config.json");
    CHECK_FALSE(config.projection);
    WeightStore weights = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
    ClipTextEncoder encoder(config, weights);
    weights.check_all_taken();
    auto golden = SafetensorsFile::open(golden_path("flux_clip.safetensors"));
    const ClipTextOutput out = encoder.forward(load_tensor(golden, "input_ids", at::kLong));
    const at::Tensor pooled = load_tensor(golden, "pooled", at::kFloat);
    CHECK(out.pooled.sizes() == at::IntArrayRef({3, config.hidden_size}));
    const double d_pooled = max_diff(out.pooled, pooled);
    const double d_hidden = max_diff(out.hidden, load_tensor(golden, "hidden_skip0", at::kFloat));
    MESSAGE("CLIPTextModel: max |diff| pooled " << d_pooled << ", hidden " << d_hidden);
    CHECK(d_pooled <= 1e-4);
    CHECK(d_hidden <= 1e-4);

    // The hub's checkpoints name the same tensors text_model.*: the same output.
    const std::string renamed = "/tmp/dp_clip_text_model_" + std::to_string(getpid());
    REQUIRE(std::system(("rm -rf " + renamed + " && mkdir -p " + renamed).c_str()) == 0);
    auto file = SafetensorsFile::open(dir + "/model.safetensors");
    std::vector<std::pair<std::string, at::Tensor>> prefixed;
    for (const auto& [name, info] : file->tensors())
        prefixed.emplace_back("text_model." + name, load_tensor(file, name, at::kFloat));
    save_safetensors(renamed + "/model.safetensors", prefixed);
    WeightStore hub = WeightStore::open_folder(renamed, at::kFloat, at::kCPU);
    ClipTextEncoder hub_encoder(config, hub);
    hub.check_all_taken();
    CHECK(max_diff(hub_encoder.forward(load_tensor(golden, "input_ids", at::kLong)).pooled, pooled) <= 1e-4);
    std::system(("rm -rf " + renamed).c_str());

    // SD3's encoders keep their projection: the default without "architectures" too.
    CHECK(ClipTextConfig::from_json_file(golden_path("clip_l/config.json")).projection);
    CHECK(ClipTextConfig::from_json_text("{}", "c.json").projection);
    // A CLIPTextModel config over weights that hold a projection is refused, naming both.
    ClipTextConfig without = ClipTextConfig::from_json_file(golden_path("clip_l/config.json"));
    without.projection = false;
    WeightStore projected = WeightStore::open_folder(golden_path("clip_l"), at::kFloat, at::kCPU);
    CHECK_THROWS_WITH_AS(
        ClipTextEncoder(without, projected),
        doctest::Contains("text_projection.weight but config.json's architectures names CLIPTextModel"),
        ModelError);
    // And a CLIPTextModelWithProjection config over weights without one: the missing tensor by name.
    ClipTextConfig with = config;
    with.projection = true;
    WeightStore plain = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
    CHECK_THROWS_WITH_AS(ClipTextEncoder(with, plain), doctest::Contains("text_projection.weight"),
                         ModelError);
}

TEST_CASE("a config that disagrees with the weights, or is unsupported, is refused by name") {
    const std::string dir = golden_path("clip_l");
    ClipTextConfig config = ClipTextConfig::from_json_file(dir + "/config.json");
    config.intermediate_size += 1;
    WeightStore weights = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
    CHECK_THROWS_WITH_AS(
        ClipTextEncoder(config, weights),
        doctest::Contains("mlp.fc1.weight' has shape [37, 32] but the config implies [38, 32]"), ModelError);
    config = ClipTextConfig::from_json_file(dir + "/config.json");
    config.num_hidden_layers -= 1;  // the last layer's tensors are then unexpected
    WeightStore again = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
    ClipTextEncoder fewer(config, again);
    CHECK_THROWS_WITH_AS(again.check_all_taken(),
                         doctest::Contains("unexpected tensor(s) 'text_model.encoder.layers.4"), ModelError);
    CHECK_THROWS_WITH_AS(ClipTextConfig::from_json_text(R"({"hidden_act": "relu"})", "c.json"),
                         doctest::Contains("c.json: 'hidden_act'"), ModelError);
    CHECK_THROWS_WITH_AS(ClipTextConfig::from_json_text(R"({"architectures": ["T5EncoderModel"]})", "c.json"),
                         doctest::Contains("T5EncoderModel"), ModelError);
    CHECK_THROWS_WITH_AS(
        ClipTextConfig::from_json_text(R"({"hidden_size": 30, "num_attention_heads": 4})", "c.json"),
        doctest::Contains("must divide hidden_size"), ModelError);
    WeightStore empty = WeightStore::random(1, at::kFloat, at::kCPU);
    ClipTextConfig tiny =
        ClipTextConfig::from_json_text(R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
        "num_hidden_layers": 1, "num_attention_heads": 2, "projection_dim": 4, "max_position_embeddings": 5})",
                                       "tiny");
    ClipTextEncoder random_encoder(tiny, empty);
    CHECK_THROWS_WITH_AS(random_encoder.forward(at::zeros({1, 6}, at::kLong)),
                         doctest::Contains("only 5 positions"), ModelError);
    CHECK(random_encoder.forward(at::zeros({1, 5}, at::kLong)).pooled.sizes() == at::IntArrayRef({1, 4}));
}

TEST_CASE("sharded weights (an index naming two files) load the same as one file") {
    const std::string dir = "/tmp/dp_sharded_" + std::to_string(getpid());
    REQUIRE(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()) == 0);
    auto single = SafetensorsFile::open(golden_path("clip_l/model.safetensors"));
    std::vector<std::pair<std::string, at::Tensor>> first, second;
    nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
    for (const auto& [name, info] : single->tensors()) {
        const bool in_first = first.size() <= second.size();
        (in_first ? first : second).emplace_back(name, load_tensor(single, name, at::kFloat));
        index["weight_map"][name] =
            in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    }
    save_safetensors(dir + "/model-00001-of-00002.safetensors", first);
    save_safetensors(dir + "/model-00002-of-00002.safetensors", second);
    std::ofstream(dir + "/model.safetensors.index.json") << index.dump();
    const ClipTextConfig config = ClipTextConfig::from_json_file(golden_path("clip_l/config.json"));
    WeightStore sharded = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
    WeightStore whole = WeightStore::open_folder(golden_path("clip_l"), at::kFloat, at::kCPU);
    ClipTextEncoder a(config, sharded), b(config, whole);
    sharded.check_all_taken();
    const at::Tensor ids = at::randint(3, 990, {1, 77}, at::kLong);
    // Same values; only their alignment in memory differs, which can change the SIMD path by an ulp.
    CHECK((a.forward(ids).pooled - b.forward(ids).pooled).abs().max().item<double>() <= 1e-6);

    index["weight_map"]["text_projection.weight"] = "model-00003-of-00002.safetensors";
    std::ofstream(dir + "/model.safetensors.index.json") << index.dump();
    CHECK_THROWS_WITH_AS(WeightStore::open_folder(dir, at::kFloat, at::kCPU),
                         doctest::Contains("model-00003-of-00002.safetensors"), ModelError);
    std::system(("rm -rf " + dir).c_str());
}
