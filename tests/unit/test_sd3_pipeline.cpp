// End to end against diffusers' StableDiffusion3Pipeline: a tiny random SD3 (two CLIP encoders, no
// T5, transformer, VAE), same seeds and settings; the uint8 images may differ by at most 1 per
// channel on at least 99.9% of pixels, and the final latents by at most 1e-4.
#include "unit/doctest_torch.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/models/sd3/sd3_pipeline.h"

using namespace dp::runtime;

TEST_CASE("the C++ pipeline gives diffusers' image for the same weights, prompt and seed") {
    PipelineOptions options;
    options.model_dir = golden_path("sd3_tiny");
    const auto pipeline = Sd3Pipeline::load(options);
    auto golden = SafetensorsFile::open(golden_path("sd3_pipeline.safetensors"));
    const auto cases = nlohmann::json::parse(golden->metadata().at("cases"))["cases"];
    REQUIRE(cases.size() == 3);
    for (std::size_t i = 0; i < cases.size(); ++i) {
        const auto& c = cases[i];
        GenerateRequest r;
        r.prompt = c[0].get<std::string>();
        r.negative_prompt = c[1].get<std::string>();
        r.seed = c[2].get<uint64_t>();
        r.steps = c[3].get<int>();
        r.arguments.set("guidance_scale", c[4].get<double>());
        r.width = c[5].get<int>();
        r.height = c[6].get<int>();
        CAPTURE(i);
        const GenerateResult out = pipeline->generate(r);
        const at::Tensor ref_image = load_tensor(golden, "image." + std::to_string(i), at::kByte);
        const at::Tensor ref_latents = load_tensor(golden, "latents." + std::to_string(i), at::kFloat);
        REQUIRE(out.image.sizes() == ref_image.sizes());
        const at::Tensor diff = (out.image.to(at::kInt) - ref_image.to(at::kInt)).abs();
        const double within_one = diff.le(1).all(-1).to(at::kDouble).mean().item<double>();
        const double latent_diff = (out.latents - ref_latents).abs().max().item<double>();
        MESSAGE("case " << i << " (" << r.width << "x" << r.height << ", " << r.steps << " steps, guidance "
                        << r.arguments.number("guidance_scale") << "): max |uint8 diff| "
                        << diff.max().item<int>() << ", pixels within 1: " << within_one * 100
                        << "%, max |latent diff| " << latent_diff);
        CHECK(within_one >= 0.999);
        CHECK(latent_diff <= 1e-4);
        CHECK(out.warnings.size() == (i == 1 ? 1u : 0u));
    }
}

TEST_CASE("sizes the model cannot make, and broken model folders, are errors that say why") {
    PipelineOptions options;
    options.model_dir = golden_path("sd3_tiny");
    const auto pipeline = Sd3Pipeline::load(options);
    GenerateRequest r;
    r.steps = 1;
    r.width = -32;
    r.height = 32;
    CHECK_THROWS_WITH_AS(pipeline->generate(r), doctest::Contains("positive multiples of 1"), ModelError);
    r.width = 48;  // 48 patches: more than the 40 x 40 position table
    CHECK_THROWS_WITH_AS(pipeline->generate(r), doctest::Contains("position table"), ModelError);
    options.model_dir = golden_path("clip_l");
    CHECK_THROWS_WITH_AS(Sd3Pipeline::load(options), doctest::Contains("model_index.json"), ModelError);
}

namespace {
// A copy of the golden tiny model that a test may break.
std::string copy_model(const std::string& name) {
    const std::string dir = "/tmp/dp_model_" + std::to_string(getpid()) + "_" + name;
    const std::string cmd = "rm -rf '" + dir + "' && cp -r '" + golden_path("sd3_tiny") + "' '" + dir + "'";
    REQUIRE(std::system(cmd.c_str()) == 0);
    return dir;
}

std::string load_error(const std::string& dir) {
    PipelineOptions options;
    options.model_dir = dir;
    try {
        Sd3Pipeline::load(options);
    } catch (const ModelError& e) {
        return e.what();
    }
    return "loaded";
}

void write_file(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}
}  // namespace

TEST_CASE("broken model folders: each error names the file and what is wrong") {
    std::string dir = copy_model("missing");
    std::remove((dir + "/transformer/diffusion_pytorch_model.safetensors").c_str());
    CHECK_MESSAGE(load_error(dir).find(dir + "/transformer: no *.safetensors weights") != std::string::npos,
                  load_error(dir));

    dir = copy_model("truncated");
    const std::string weights = dir + "/vae/diffusion_pytorch_model.safetensors";
    REQUIRE(truncate(weights.c_str(), 4000) == 0);
    CHECK_MESSAGE(load_error(dir).find(weights) != std::string::npos, load_error(dir));

    dir = copy_model("t5");
    std::string index = read_text_file(dir + "/model_index.json");
    const std::string null_t5 = "\"text_encoder_3\": [\n    null,\n    null\n  ]";
    REQUIRE(index.find(null_t5) != std::string::npos);
    index.replace(index.find(null_t5), null_t5.size(),
                  "\"text_encoder_3\": [\"transformers\", \"T5EncoderModel\"]");
    write_file(dir + "/model_index.json", index);
    // Every problem at once: the encoder's folder, and the tokenizer it needs.
    CHECK_MESSAGE(load_error(dir).find(
                      dir + "/text_encoder_3: missing (model_index.json names a T5EncoderModel there)") !=
                      std::string::npos,
                  load_error(dir));
    CHECK_MESSAGE(
        load_error(dir).find("\"tokenizer_3\" is missing, but text_encoder_3 names a T5 encoder, which needs "
                             "a T5TokenizerFast or T5Tokenizer (or run with --no-t5)") != std::string::npos,
        load_error(dir));

    dir = copy_model("shape");
    std::string config = read_text_file(dir + "/transformer/config.json");
    config.replace(config.find("\"num_attention_heads\": 4"), 24, "\"num_attention_heads\": 2");
    config.replace(config.find("\"caption_projection_dim\": 32"), 28, "\"caption_projection_dim\": 16");
    write_file(dir + "/transformer/config.json", config);
    CHECK_MESSAGE(load_error(dir).find("has shape") != std::string::npos, load_error(dir));

    dir = copy_model("class");
    write_file(dir + "/scheduler/scheduler_config.json", R"({"_class_name": "EulerDiscreteScheduler"})");
    CHECK_MESSAGE(load_error(dir).find("'EulerDiscreteScheduler' is not supported") != std::string::npos,
                  load_error(dir));

    dir = copy_model("json");
    write_file(dir + "/vae/config.json", "{\"block_out_channels\": [4,");
    CHECK_MESSAGE(load_error(dir).find(dir + "/vae/config.json: not valid JSON") != std::string::npos,
                  load_error(dir));
    std::system(("rm -rf /tmp/dp_model_" + std::to_string(getpid()) + "_*").c_str());
}

TEST_CASE("random weights from the folder's configs are seeded, and bf16 runs and stays close to fp32") {
    PipelineOptions options;
    options.model_dir = golden_path("sd3_tiny");
    options.random_weights = 1;
    GenerateRequest r;
    r.prompt = "a red circle";
    r.steps = 2;
    r.width = r.height = 16;
    const at::Tensor a = Sd3Pipeline::load(options)->generate(r).image;
    const at::Tensor b = Sd3Pipeline::load(options)->generate(r).image;
    CHECK(at::equal(a, b));
    options.random_weights = 2;
    CHECK_FALSE(at::equal(a, Sd3Pipeline::load(options)->generate(r).image));

    options.random_weights.reset();
    const at::Tensor fp32 = Sd3Pipeline::load(options)->generate(r).image.to(at::kFloat);
    options.dtype = at::kBFloat16;
    const at::Tensor bf16 = Sd3Pipeline::load(options)->generate(r).image.to(at::kFloat);
    const double mean_diff = (fp32 - bf16).abs().mean().item<double>();
    MESSAGE("bf16 vs fp32: mean |uint8 diff| " << mean_diff);
    CHECK(mean_diff < 8.0);
}

TEST_CASE("a batch gives each prompt its own image: identical to one at a time, or within 1 per channel") {
    PipelineOptions options;
    options.model_dir = golden_path("sd3_tiny");
    const auto pipeline = Sd3Pipeline::load(options);
    std::vector<GenerateRequest> batch;
    for (int k = 0; k < 4; ++k) {
        GenerateRequest r;
        r.prompt = "prompt number " + std::to_string(k);
        r.negative_prompt = k % 2 ? "blurry" : "";
        r.seed = 100 + k;
        r.steps = 3;
        r.arguments.set("guidance_scale", 4.0);
        r.width = 24;
        r.height = 16;
        batch.push_back(r);
    }
    const std::vector<GenerateResult> together = pipeline->generate_batch(batch);
    REQUIRE(together.size() == 4);
    int identical = 0;
    int worst = 0;
    for (std::size_t k = 0; k < batch.size(); ++k) {
        const GenerateResult alone = pipeline->generate(batch[k]);
        const int diff = (alone.image.to(at::kInt) - together[k].image.to(at::kInt)).abs().max().item<int>();
        worst = std::max(worst, diff);
        identical += diff == 0;
        CHECK(diff <= 1);
    }
    MESSAGE("batch of 4 vs one at a time: " << identical << " of 4 images identical, max |uint8 diff| "
                                            << worst);
    GenerateRequest odd = batch[0];
    odd.steps = 2;
    CHECK_THROWS_WITH_AS(pipeline->generate_batch({batch[0], odd}), doctest::Contains("must share"),
                         ModelError);
}
