// End to end against diffusers' StableDiffusion3Pipeline: a tiny random SD3 (two CLIP encoders, no
// T5, transformer, VAE), same seeds and settings; the uint8 images may differ by at most 1 per
// channel on at least 99.9% of pixels, and the final latents by at most 1e-4.
#include "unit/doctest_torch.h"

#include <nlohmann/json.hpp>

#include "runtime/errors.h"
#include "runtime/pipeline.h"
#include "runtime/tensor_io.h"

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
        r.guidance_scale = c[4].get<double>();
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
                        << r.guidance_scale << "): max |uint8 diff| " << diff.max().item<int>()
                        << ", pixels within 1: " << within_one * 100 << "%, max |latent diff| "
                        << latent_diff);
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
