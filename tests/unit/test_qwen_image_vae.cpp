// Qwen-Image's VAE decoder against diffusers' AutoencoderKLQwenImage (fp32 and bf16, CPU): a tiny random
// model with an upsample3d and an upsample2d block, a shortcut conv, perturbed RMS norms and its own
// latent statistics, decoding non-square transformer latents as QwenImagePipeline does.
#include "unit/doctest_torch.h"

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/models/common/qwen_image_vae.h"

using namespace dp::runtime;

TEST_CASE("the Qwen-Image VAE decoder matches diffusers within 1e-4") {
    const std::string dir = golden_path("qwen_image_vae");
    WeightStore weights = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
    const QwenImageVaeConfig config = QwenImageVaeConfig::from_json_file(dir + "/config.json");
    CHECK(config.scale_factor() == 4);
    CHECK(config.latents_std.size() == 16);
    QwenImageVaeDecoder vae(config, weights);
    weights.check_all_taken();  // the encoder, quant_conv and time_conv are skipped, nothing else
    auto g = SafetensorsFile::open(dir + ".safetensors");
    const at::Tensor latents = load_tensor(g, "latents", at::kFloat);
    REQUIRE(latents.sizes() == at::IntArrayRef({2, 16, 5, 7}));
    const at::Tensor image = vae.decode(latents);
    const at::Tensor ref = load_tensor(g, "image", at::kFloat);
    REQUIRE(image.sizes() == at::IntArrayRef({2, 3, 20, 28}));
    const double diff = max_diff(image, ref);
    MESSAGE("max |diff| " << diff);
    CHECK(diff <= 1e-4);
    CHECK(image.abs().max().item<double>() <= 1.0);
    // The golden reaches the clamp, and the latent statistics matter: with mean 0 and std 1 the
    // same latents decode to another image.
    CHECK((ref.abs() == 1).sum().item<int64_t>() > 0);
    QwenImageVaeConfig plain = config;
    plain.latents_mean.assign(16, 0.0);
    plain.latents_std.assign(16, 1.0);
    WeightStore weights2 = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
    CHECK(max_diff(QwenImageVaeDecoder(plain, weights2).decode(latents), ref) > 1e-2);
    CHECK_THROWS_AS(vae.decode(latents.unsqueeze(2)), ModelError);
    // bf16 weights and latents, against diffusers in bf16 (RMS norms normalise in fp32 in both; the
    // latent statistics are cast to bf16 before the reciprocal). This tiny model turns one bf16
    // rounding into ~0.25 of output, so the bound catches any op done in another order or dtype.
    WeightStore weights_bf16 = WeightStore::open_folder(dir, at::kBFloat16, at::kCPU);
    const at::Tensor image_bf16 = QwenImageVaeDecoder(config, weights_bf16).decode(latents.to(at::kBFloat16));
    CHECK((image_bf16.scalar_type() == at::kBFloat16));
    const double diff_bf16 = max_diff(image_bf16, load_tensor(g, "image_bf16", at::kFloat));
    MESSAGE("bf16 max |diff| " << diff_bf16);
    CHECK(diff_bf16 <= 0.05);
}

TEST_CASE("Qwen-Image VAE configs the decoder cannot honour are refused by key") {
    const auto parse = [](const std::string& text) {
        return QwenImageVaeConfig::from_json_text(text, "vae.json");
    };
    CHECK_THROWS_WITH_AS(parse(R"({"_class_name": "AutoencoderKLWan"})"), doctest::Contains("'_class_name'"),
                         ModelError);
    CHECK_THROWS_WITH_AS(parse(R"({"latents_mean": [0.0, 1.0]})"),
                         doctest::Contains("vae.json: 'latents_mean' has 2 values; accepted: z_dim = 16"),
                         ModelError);
    CHECK_THROWS_WITH_AS(parse(R"({"z_dim": 4})"), doctest::Contains("'latents_mean'"), ModelError);
    CHECK_THROWS_WITH_AS(parse(R"({"latents_std": [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]})"),
                         doctest::Contains("'latents_std'"), ModelError);
    CHECK_THROWS_WITH_AS(parse(R"({"latents_mean": "zero"})"), doctest::Contains("'latents_mean'"),
                         ModelError);
    CHECK_THROWS_WITH_AS(parse(R"({"dim_mult": [1, 2], "temperal_downsample": [false, true]})"),
                         doctest::Contains("'temperal_downsample' has 2 entries"), ModelError);
    CHECK_THROWS_WITH_AS(parse(R"({"temperal_downsample": [0, 1, 1]})"),
                         doctest::Contains("'temperal_downsample'"), ModelError);
    CHECK_THROWS_WITH_AS(parse(R"({"dim_mult": []})"), doctest::Contains("'dim_mult'"), ModelError);
    CHECK_THROWS_WITH_AS(parse(R"({"base_dim": 0})"), doctest::Contains("'base_dim'"), ModelError);
    CHECK_THROWS_WITH_AS(parse(R"({"is_residual": true})"), doctest::Contains("'is_residual'"), ModelError);
    CHECK_THROWS_WITH_AS(parse(R"({"patch_size": 2})"), doctest::Contains("'patch_size'"), ModelError);
    CHECK_THROWS_WITH_AS(parse(R"({"decoder_base_dim": 256})"), doctest::Contains("'decoder_base_dim'"),
                         ModelError);

    // Qwen-Image's own config: diffusers' defaults, 8x.
    const QwenImageVaeConfig real = parse(R"({"_class_name": "AutoencoderKLQwenImage", "attn_scales": [],
        "base_dim": 96, "dim_mult": [1, 2, 4, 4], "dropout": 0.0, "num_res_blocks": 2,
        "temperal_downsample": [false, true, true], "z_dim": 16})");
    CHECK(real.scale_factor() == 8);
    CHECK(real.latents_mean.front() == doctest::Approx(-0.7571));
    CHECK(real.latents_std.back() == doctest::Approx(1.9160));
}

TEST_CASE("the Qwen-Image VAE decoder builds with Qwen-Image's four blocks and decodes 8x") {
    QwenImageVaeConfig config = QwenImageVaeConfig::from_json_text(
        R"({"base_dim": 4, "dim_mult": [1, 2, 4, 4], "temperal_downsample": [false, true, true]})",
        "vae.json");
    WeightStore weights = WeightStore::random(3, at::kFloat, at::kCPU);
    QwenImageVaeDecoder vae(config, weights);
    const at::Tensor image = vae.decode(seeded({1, 16, 3, 2}, 4));
    CHECK(image.sizes() == at::IntArrayRef({1, 3, 24, 16}));
    CHECK(image.abs().max().item<double>() <= 1.0);
}
