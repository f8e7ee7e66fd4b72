// Qwen-Image's text encoder (Qwen2.5-VL's language model) against transformers: hidden_states[-1]
// of padded batches (right, left, no mask) in fp32 and one row in bf16, both checkpoint layouts,
// and config errors. Its tensor parallelism and a layer more than its weights are a row of
// test_text_encoders.cpp.
#include "unit/doctest_torch.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/models/common/qwen2_text_encoder.h"
#include "runtime/models/common/qwen2_tokenizer.h"
#include "runtime/models/common/qwen2_vision.h"
#include "support/test_paths.h"
#include "unit/golden_request.h"
#include "unit/temp_dir.h"

using namespace dp::runtime;

namespace {

const std::string kEncoder = golden_path("qwen2_encoder");

std::shared_ptr<SafetensorsFile> golden() {
    return SafetensorsFile::open(golden_path("qwen2_encoder.safetensors"));
}

Qwen2TextConfig golden_config() { return Qwen2TextConfig::from_json_file(kEncoder + "/config.json"); }

struct TempDir : dp::test::TempDir {
    TempDir() : dp::test::TempDir("qwen2") {}
};

}  // namespace

TEST_CASE("Qwen2.5-VL text config: the tiny golden's text_config, and a flat transformers 4 file") {
    const Qwen2TextConfig c = golden_config();
    CHECK(c.vocab_size == 300);
    CHECK(c.hidden_size == 64);
    CHECK(c.intermediate_size == 96);
    CHECK(c.num_hidden_layers == 2);
    CHECK(c.num_attention_heads == 8);
    CHECK(c.num_key_value_heads == 4);
    CHECK(c.head_dim() == 8);
    CHECK(c.group_size() == 2);
    CHECK(c.rope_theta == 1e6);
    CHECK(c.rms_norm_eps == doctest::Approx(1e-6));
    // A flat file of transformers 4 (rope_theta beside rope_scaling's mrope) reads the same.
    nlohmann::json j = nlohmann::json::parse(read_text_file(kEncoder + "/config.json"));
    nlohmann::json flat = j["text_config"];
    flat["model_type"] = "qwen2_5_vl";
    flat.erase("rope_parameters");
    flat["rope_theta"] = 5e5;
    flat["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", {1, 1, 2}}};
    const Qwen2TextConfig f = Qwen2TextConfig::from_json_text(flat.dump(), "te/config.json");
    CHECK(f.num_key_value_heads == 4);
    CHECK(f.rope_theta == 5e5);
}

TEST_CASE(
    "Qwen2.5-VL text encoder matches transformers' hidden_states[-1] on padded batches, right and left") {
    auto g = golden();
    WeightStore weights = WeightStore::open_folder(kEncoder, at::kFloat, at::kCPU);
    const Qwen2TextEncoder encoder(golden_config(), weights);
    weights.check_all_taken();  // the vision tower and lm_head are skipped, nothing else is left
    for (const std::string side : {"right", "left"}) {
        CAPTURE(side);
        const at::Tensor ids = load_tensor(g, side + ".input_ids", at::kLong);
        const at::Tensor mask = load_tensor(g, side + ".attention_mask", at::kLong);
        const at::Tensor out = encoder.forward(ids, mask);
        CHECK(static_cast<int>(out.scalar_type()) == static_cast<int>(at::kFloat));
        CHECK(at::isfinite(out).all().item<bool>());
        const double diff = masked_diff(out, load_tensor(g, side + ".hidden", at::kFloat), mask);
        MESSAGE(side << ": max |diff| " << diff);
        CHECK(diff <= 1e-4);
    }
    // Without a mask every position is real: causal attention alone, pads attended as tokens.
    const at::Tensor ids = load_tensor(g, "right.input_ids", at::kLong);
    const at::Tensor want = load_tensor(g, "nomask.hidden", at::kFloat);
    CHECK(max_diff(encoder.forward(ids), want) <= 1e-4);
    // The mask matters: the padded rows differ from the unmasked run at their real positions.
    const at::Tensor mask = load_tensor(g, "right.attention_mask", at::kLong);
    CHECK(masked_diff(encoder.forward(ids, mask), want, mask) <= 1e-4);  // right pads come after
    const at::Tensor left_ids = load_tensor(g, "left.input_ids", at::kLong);
    const at::Tensor left_mask = load_tensor(g, "left.attention_mask", at::kLong);
    CHECK(masked_diff(encoder.forward(left_ids), load_tensor(g, "left.hidden", at::kFloat), left_mask) >
          1e-2);
}

TEST_CASE("Qwen2.5-VL text encoder in bf16 matches transformers' bf16 run") {
    auto g = golden();
    WeightStore weights = WeightStore::open_folder(kEncoder, at::kBFloat16, at::kCPU);
    const Qwen2TextEncoder encoder(golden_config(), weights);
    const at::Tensor out = encoder.forward(load_tensor(g, "bf16.input_ids", at::kLong));
    CHECK(static_cast<int>(out.scalar_type()) == static_cast<int>(at::kBFloat16));
    const at::Tensor want = load_tensor(g, "bf16.hidden", at::kFloat);
    const double diff = max_diff(out, want);
    MESSAGE("bf16: max |diff| " << diff << " (max |h| " << want.abs().max().item<double>() << ")");
    CHECK(diff <= 1.6e-2);  // one unit in the last place of |h| ~2.8 (0 measured on CPU)
}

TEST_CASE("Qwen2.5-VL text encoder reads model.* and model.language_model.* checkpoints alike") {
    auto source = SafetensorsFile::open(kEncoder + "/model.safetensors");
    std::vector<std::pair<std::string, at::Tensor>> renamed;
    for (const auto& [name, info] : source->tensors()) {
        std::string n = name;
        if (n.rfind("model.", 0) == 0) n = "model.language_model." + n.substr(6);
        if (n.rfind("visual.", 0) == 0) n = "model." + n;
        renamed.emplace_back(n, load_tensor(source, name, at::kFloat));
    }
    const TempDir dir;
    save_safetensors(dir.path + "/model.safetensors", renamed);
    const at::Tensor ids = at::arange(3, 20, at::kLong).view({1, -1});
    WeightStore legacy = WeightStore::open_folder(kEncoder, at::kFloat, at::kCPU);
    WeightStore modules = WeightStore::open_folder(dir.path, at::kFloat, at::kCPU);
    const Qwen2TextConfig config = golden_config();
    const Qwen2TextEncoder a(config, legacy), b(config, modules);
    CHECK_NOTHROW(modules.check_all_taken());
    CHECK(max_diff(a.forward(ids), b.forward(ids)) == 0);
}

TEST_CASE("Qwen2.5-VL text config errors name the file and key") {
    const std::string good = read_text_file(kEncoder + "/config.json");
    struct Bad {
        std::string key;  // under text_config; "rope_parameters.K" under its rope_parameters
        nlohmann::json value;
        std::string named;  // what the message must name
    };
    CHECK_NOTHROW(Qwen2TextConfig::from_json_text(good, "te/config.json"));
    for (const Bad& b :
         {Bad{"hidden_act", "gelu", "hidden_act"}, Bad{"hidden_size", "wide", "hidden_size"},
          Bad{"num_attention_heads", 7, "num_attention_heads"},
          Bad{"num_key_value_heads", 3, "num_key_value_heads"},
          Bad{"use_sliding_window", true, "use_sliding_window"}, Bad{"rms_norm_eps", -1, "rms_norm_eps"},
          Bad{"model_type", "llama", "model_type"}, Bad{"rope_parameters.rope_type", "yarn", "rope_type"},
          Bad{"rope_parameters.rope_theta", "big", "rope_theta"},
          Bad{"rope_parameters.mrope_section", nlohmann::json::array({16, 24, 24}), "mrope_section"},
          Bad{"rope_parameters", 3, "rope_parameters"}}) {
        CAPTURE(b.key);
        nlohmann::json j = nlohmann::json::parse(good);
        nlohmann::json& t = j["text_config"];
        if (b.key.rfind("rope_parameters.", 0) == 0)
            t["rope_parameters"][b.key.substr(16)] = b.value;
        else
            t[b.key] = b.value;
        CHECK_THROWS_WITH_AS(Qwen2TextConfig::from_json_text(j.dump(), "te/config.json"),
                             doctest::Contains("te/config.json: text_config"), ModelError);
        CHECK_THROWS_WITH_AS(Qwen2TextConfig::from_json_text(j.dump(), "te/config.json"),
                             doctest::Contains(b.named.c_str()), ModelError);
    }
    nlohmann::json j = nlohmann::json::parse(good);
    j["model_type"] = "qwen2_vl";
    CHECK_THROWS_WITH_AS(Qwen2TextConfig::from_json_text(j.dump(), "te/config.json"),
                         doctest::Contains("'model_type' is 'qwen2_vl'"), ModelError);
    j = nlohmann::json::parse(good);
    j["text_config"] = "none";
    CHECK_THROWS_WITH_AS(Qwen2TextConfig::from_json_text(j.dump(), "te/config.json"),
                         doctest::Contains("'text_config' must be an object"), ModelError);
    CHECK_THROWS_WITH_AS(Qwen2TextConfig::from_json_file("/nonexistent/config.json"),
                         doctest::Contains("/nonexistent/config.json"), ModelError);
}

// Note [Qwen2.5-VL positions with images]: the processor's patches, the vision tower's tokens and
// the language model's hidden states for the edit templates with pictures inside them, against
// transformers (scripts/golden/golden_qwen_edit.py), with the three-section positions and with
// diffusers' sequential ones.
namespace {

const std::string kEditModel = std::string(DP_MODELS_DIR) + "/tiny-random-qwen-image-edit";

// A case's pictures as its pipeline gives them to the processor: decoded, and resized with PIL's
// Lanczos where the case names a size (the pipeline's calculate_dimensions).
std::vector<VisionPatches> case_patches(const nlohmann::json& c, const Qwen2VLProcessorConfig& processor) {
    std::vector<VisionPatches> out;
    for (std::size_t k = 0; k < c.at("images").size(); ++k) {
        dp::images::RgbImage rgb = dp::images::decode_image(dp::test::repository_path(c.at("images")[k]));
        const nlohmann::json& size = c.at("pipeline_resize")[k];
        if (!size.is_null()) rgb = dp::images::resize(rgb, size[0].get<int>(), size[1].get<int>());
        out.push_back(qwen2vl_patches(rgb, processor));
    }
    return out;
}

}  // namespace

TEST_CASE(
    "Qwen2.5-VL with images: the processor's patches, the vision tower, the three-section positions and "
    "the hidden states of edit prompts equal transformers'") {
    const auto g = SafetensorsFile::open(golden_path("qwen_edit.safetensors"));
    const nlohmann::json cases = dp::test::golden_cases(g);
    const Qwen2VLProcessorConfig processor =
        Qwen2VLProcessorConfig::from_json_file(kEditModel + "/processor/preprocessor_config.json");
    CHECK(processor.max_pixels == 2304);  // the folder's size.longest_edge
    std::map<std::string, std::vector<VisionPatches>> patches;
    for (const std::string name : {"processor.edit", "processor.plus", "processor.direct"}) {
        CAPTURE(name);
        patches[name] = case_patches(cases.at(name), processor);
        std::vector<at::Tensor> values;
        for (const VisionPatches& p : patches[name]) values.push_back(p.values);
        const at::Tensor want = load_tensor(g, name + ".pixel_values", at::kFloat);
        REQUIRE(at::cat(values).sizes() == want.sizes());
        CHECK(max_diff(at::cat(values), want) <= 1e-6);
        const at::Tensor grids = load_tensor(g, name + ".image_grid_thw", at::kLong);
        for (std::size_t k = 0; k < patches[name].size(); ++k) {
            CHECK(grids[static_cast<int64_t>(k)][1].item<int64_t>() == patches[name][k].grid_h);
            CHECK(grids[static_cast<int64_t>(k)][2].item<int64_t>() == patches[name][k].grid_w);
        }
    }
    const std::string config = kEditModel + "/text_encoder/config.json";
    const Qwen2VisionConfig vision = Qwen2VisionConfig::from_json_file(config);
    WeightStore weights = WeightStore::open_folder(kEditModel + "/text_encoder", at::kFloat, at::kCPU);
    const Qwen2TextEncoder encoder(Qwen2TextConfig::from_json_file(config), weights, {},
                                   dp::strategies::qwen2_decoder_spec(), &vision);
    CHECK_NOTHROW(weights.check_all_taken());  // the tower's tensors all read, lm_head skipped
    const at::Tensor seen = encoder.vision()->forward(patches["processor.plus"]);
    const double tower = max_diff(seen, load_tensor(g, "vision.plus.image_embeds", at::kFloat));
    MESSAGE("vision tower: max |diff| " << tower);
    CHECK(tower <= 1e-4);
    // Each row's pictures: text.edit one, text.plus two, text.batch one per row (its own).
    for (const std::string name : {"text.edit", "text.plus", "text.batch"}) {
        CAPTURE(name);
        const at::Tensor ids = load_tensor(g, name + ".input_ids", at::kLong);
        const at::Tensor mask = load_tensor(g, name + ".attention_mask", at::kLong);
        const std::vector<VisionPatches>& all = patches.at(cases.at(name).at("pixels").get<std::string>());
        std::vector<at::Tensor> rows;
        for (int64_t r = 0; r < ids.size(0); ++r) {
            const std::vector<int64_t> row(ids[r].data_ptr<int64_t>(),
                                           ids[r].data_ptr<int64_t>() + ids.size(1));
            const std::vector<VisionPatches> own =
                name == "text.batch" ? std::vector<VisionPatches>{all[static_cast<std::size_t>(r)]} : all;
            rows.push_back(qwen2vl_positions(row, mask[r].sum().item<int64_t>(), vision.image_token_id, own,
                                             vision.spatial_merge_size));
        }
        const at::Tensor positions = at::stack(rows, 1);
        if (g->contains(name + ".position_ids"))
            CHECK(at::equal(positions, load_tensor(g, name + ".position_ids", at::kLong)));
        const at::Tensor images = name == "text.edit" ? encoder.vision()->forward(all) : seen;
        const double mrope = masked_diff(encoder.forward(ids, mask, positions, images, vision.image_token_id),
                                         load_tensor(g, name + ".hidden_mrope", at::kFloat), mask);
        const double sequential = masked_diff(encoder.forward(ids, mask, {}, images, vision.image_token_id),
                                              load_tensor(g, name + ".hidden_sequential", at::kFloat), mask);
        MESSAGE(name << ": max |diff| " << mrope << " (M-RoPE), " << sequential << " (sequential)");
        CHECK(mrope <= 1e-4);
        CHECK(sequential <= 1e-4);
    }
}

TEST_CASE("smart_resize rounds as Python does (half to even) and keeps within min and max pixels") {
    CHECK(smart_resize(41, 50, 4, 64, 2304) == std::pair<int64_t, int64_t>{40, 48});  // 12.5 -> 12
    CHECK(smart_resize(1024, 1024, 28, 3136, 12845056) == std::pair<int64_t, int64_t>{1036, 1036});
    CHECK(smart_resize(1024, 1024, 28, 3136, 1003520) == std::pair<int64_t, int64_t>{980, 980});
    CHECK(smart_resize(10, 10, 28, 3136, 1003520) == std::pair<int64_t, int64_t>{56, 56});  // scaled up
    CHECK_THROWS_AS(smart_resize(1, 300, 28, 3136, 1003520), ModelError);                   // ratio over 200
}

// Note [Qwen3 text encoders]: a tiny Qwen3 (head_dim 16 apart from hidden_size / heads) and its
// tokenizer with Qwen3's added tokens (scripts/golden/golden_qwen3.py), against transformers.
TEST_CASE(
    "Qwen3: the tokenizer's ids, Z-Image's hidden_states[-2] of each prompt's tokens and FLUX.2-klein's "
    "stacked layers equal transformers', with only the layers read loaded") {
    const auto g = SafetensorsFile::open(golden_path("qwen3_encoder.safetensors"));
    const nlohmann::json meta = dp::test::golden_cases(g);
    const Qwen2Tokenizer tokenizer = Qwen2Tokenizer::from_folder(golden_path("qwen3_tokenizer"));
    for (std::size_t i = 0; i < meta.at("strings").size(); ++i) {
        const std::string text = meta.at("strings")[i].get<std::string>();
        CAPTURE(text);
        const at::Tensor want = load_tensor(g, "ids." + std::to_string(i), at::kLong);
        CHECK(tokenizer.tokenize(text) ==
              std::vector<int64_t>(want.data_ptr<int64_t>(), want.data_ptr<int64_t>() + want.numel()));
    }
    for (const auto& [token, id] : meta.at("added").items())
        CHECK(tokenizer.id_of(token) == id.get<int64_t>());

    const std::string folder = golden_path("qwen3_encoder");
    const Qwen2TextConfig config = Qwen2TextConfig::from_json_file(folder + "/config.json");
    CHECK(config.qwen3);
    CHECK_FALSE(config.qkv_bias);
    CHECK(config.head_dim() == 16);
    WeightStore all_weights = WeightStore::open_folder(folder, at::kFloat, at::kCPU);
    const Qwen2TextEncoder whole(config, all_weights);
    CHECK_NOTHROW(all_weights.check_all_taken());
    // Z-Image: the last layer and the final norm are never read, nor loaded.
    WeightStore fewer = WeightStore::open_folder(folder, at::kFloat, at::kCPU);
    const Qwen2TextEncoder z_image(config, fewer, {}, dp::strategies::qwen2_decoder_spec(), nullptr,
                                   config.num_hidden_layers - 1);
    CHECK(z_image.parameter_bytes() < whole.parameter_bytes());
    CHECK_THROWS_WITH_AS(z_image.hidden_states(at::zeros({1, 2}, at::kLong), {}, {-1}),
                         doctest::Contains("hidden_states[-1]"), ModelError);
    for (const std::string name : {"z_image", "z_image_cut", "z_image_long"}) {
        CAPTURE(name);
        const nlohmann::json& c = meta.at("cases").at(name);
        const at::Tensor ids = load_tensor(g, name + ".input_ids", at::kLong);
        const at::Tensor mask = load_tensor(g, name + ".attention_mask", at::kLong);
        for (std::size_t k = 0; k < c.at("texts").size(); ++k) {  // the template applied, then cut
            std::vector<int64_t> own = tokenizer.tokenize(c.at("texts")[k].get<std::string>());
            own.resize(std::min<std::size_t>(own.size(), c.at("max_sequence_length").get<std::size_t>()));
            const int64_t n = static_cast<int64_t>(own.size());
            CHECK(mask[static_cast<int64_t>(k)].sum().item<int64_t>() == n);
            CHECK(at::equal(ids[static_cast<int64_t>(k)].narrow(0, 0, n), at::tensor(own, at::kLong)));
        }
        // The batch as the pipeline runs it, trimmed to its longest row: the pads after it change nothing.
        const int64_t longest = mask.sum(1).max().item<int64_t>();
        const at::Tensor states =
            z_image.hidden_states(ids.narrow(1, 0, longest), mask.narrow(1, 0, longest), {-2}).front();
        const at::Tensor from_whole =
            whole.hidden_states(ids.narrow(1, 0, longest), mask.narrow(1, 0, longest), {-2}).front();
        CHECK(at::equal(states, from_whole));
        for (int64_t k = 0; k < ids.size(0); ++k) {
            const at::Tensor want = load_tensor(g, name + ".embeds." + std::to_string(k), at::kFloat);
            const double diff = max_diff(states[k].narrow(0, 0, want.size(0)), want);
            CHECK(diff <= 1e-5);
        }
    }
    // FLUX.2-klein: hidden_states[1, 2, 3] of the whole padded rows, stacked on features.
    const at::Tensor ids = load_tensor(g, "klein.input_ids", at::kLong);
    const at::Tensor mask = load_tensor(g, "klein.attention_mask", at::kLong);
    const std::vector<at::Tensor> layers = whole.hidden_states(ids, mask, {1, 2, 3});
    const at::Tensor stacked =
        at::stack(layers, 1).permute({0, 2, 1, 3}).reshape({ids.size(0), ids.size(1), -1});
    const double klein = max_diff(stacked, load_tensor(g, "klein.embeds", at::kFloat));
    MESSAGE("klein's stacked layers: max |diff| " << klein << ", pads included");
    CHECK(klein <= 1e-5);
}

// Note [blind queries]: FLUX.2-dev's Mistral 3 (scripts/golden/golden_mistral3.py: bf16 weights,
// computed in fp32 as the golden does) sends every row on, left pads included.
TEST_CASE(
    "Mistral 3: FLUX.2-dev's stacked hidden states of left- and right-padded rows, a cut prompt and a cut "
    "system message equal transformers', pads included") {
    const auto g = SafetensorsFile::open(golden_path("mistral3_encoder.safetensors"));
    const nlohmann::json meta = dp::test::golden_cases(g);
    const std::string folder = golden_path("mistral3_encoder/text_encoder");
    const Qwen2TextConfig config = Qwen2TextConfig::from_json_file(folder + "/config.json");
    CHECK(config.mistral);
    CHECK_FALSE(config.qwen3);
    CHECK(config.head_dim() == 12);  // given, while hidden_size / heads is 16
    WeightStore weights = WeightStore::open_folder(folder, at::kFloat, at::kCPU);
    const Qwen2TextEncoder encoder(config, weights);
    CHECK_NOTHROW(weights.check_all_taken());  // the vision tower, projector and lm_head skipped
    const std::vector<int64_t> layers = meta.at("layers").get<std::vector<int64_t>>();
    for (const std::string name : {"left", "right", "cut", "cut_system"}) {
        CAPTURE(name);
        const at::Tensor ids = load_tensor(g, name + ".input_ids", at::kLong);
        const at::Tensor mask = load_tensor(g, name + ".attention_mask", at::kLong);
        const std::vector<at::Tensor> states = encoder.hidden_states(ids, mask, layers);
        const at::Tensor stacked =
            at::stack(states, 1).permute({0, 2, 1, 3}).reshape({ids.size(0), ids.size(1), -1});
        const double diff = max_diff(stacked, load_tensor(g, name + ".embeds", at::kFloat));
        MESSAGE(name << ": max |diff| " << diff << ", pads included");
        CHECK(diff <= 1e-5);
    }
    nlohmann::json bad = nlohmann::json::parse(read_text_file(folder + "/config.json"));
    bad["text_config"]["model_type"] = "llama";
    CHECK_THROWS_WITH_AS(Qwen2TextConfig::from_json_text(bad.dump(), "te/config.json"),
                         doctest::Contains("supported: mistral"), ModelError);
    bad["text_config"]["model_type"] = "mistral";
    bad["text_config"]["sliding_window"] = 512;
    CHECK_THROWS_WITH_AS(Qwen2TextConfig::from_json_text(bad.dump(), "te/config.json"),
                         doctest::Contains("sliding_window"), ModelError);
}
