// AutoencoderKL's decoder against diffusers (fp32, CPU): the SD3 test VAE (one block), a two-block
// one with upsampling, a shortcut conv and the post-quant conv, and AutoencoderKLFlux2's (FLUX.2),
// with its latents' batch-norm statistics, patchified and packed, both ways.
#include "unit/doctest_torch.h"

#include <tuple>

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/models/common/vae_decoder.h"
#include "runtime/models/flux2/flux2_vae.h"

using namespace dp::runtime;

TEST_CASE("the VAE decoder matches diffusers within 1e-4") {
    // The golden folder, and its file's latents and image (FLUX.2's: AutoencoderKLFlux2's decoder on
    // its unnormalized, unpatchified latents).
    for (const auto& [name, latents, expected] :
         {std::tuple{"vae_tiny", "latents", "image"}, std::tuple{"vae_up", "latents", "image"},
          std::tuple{"flux2_vae", "decode.latents", "decode.image"}}) {
        CAPTURE(name);
        const std::string dir = golden_path(name);
        WeightStore weights = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
        VaeDecoder vae(VaeConfig::from_json_file(dir + "/config.json"), weights);
        weights.check_all_taken();
        auto g = SafetensorsFile::open(dir + ".safetensors");
        const at::Tensor image = vae.decode(load_tensor(g, latents, at::kFloat));
        const at::Tensor ref = load_tensor(g, expected, at::kFloat);
        REQUIRE(image.sizes() == ref.sizes());
        const double diff = (image - ref).abs().max().item<double>();
        MESSAGE(std::string(name) << ": max |diff| " << diff);
        CHECK(diff <= 1e-4);
    }
}

TEST_CASE(
    "AutoencoderKLFlux2's latents: packed tokens to image and image to tokens as FLUX.2's pipelines, within "
    "1e-4") {
    const std::string dir = golden_path("flux2_vae");
    const VaeConfig config = VaeConfig::from_json_file(dir + "/config.json");
    CHECK(config.latent_batch_norm);
    CHECK(config.scaling_factor == 1.0);
    auto g = SafetensorsFile::open(dir + ".safetensors");
    const auto within = [](const std::string& what, const at::Tensor& ours, const at::Tensor& theirs) {
        CAPTURE(what);
        REQUIRE(ours.sizes() == theirs.sizes());
        const double diff = (ours - theirs).abs().max().item<double>();
        MESSAGE(what << ": max |diff| " << diff);
        CHECK(diff <= 1e-4);
    };
    WeightStore decoder_weights = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
    const Flux2VaeDecoder decoder(config, decoder_weights);
    decoder_weights.check_all_taken();
    // decode.packed: [2, 15, 32] tokens of a 3 x 5 grid.
    const at::Tensor tokens = unpack_tokens(load_tensor(g, "decode.packed", at::kFloat), 3, 5);
    const Flux2LatentNorm& norm = Flux2LatentNorm::load(decoder_weights, config);
    within("decode.latents", unpatchify_latents(norm.denormalize(tokens)),
           load_tensor(g, "decode.latents", at::kFloat));
    within("decode.image", decoder.decode(tokens), load_tensor(g, "decode.image", at::kFloat));
    WeightStore encoder_weights = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
    const Flux2VaeEncoder encoder(config, encoder_weights);
    encoder_weights.check_all_taken();
    const at::Tensor image = load_tensor(g, "encode.image", at::kFloat);
    within("encode.mode", encoder.mode(image), load_tensor(g, "encode.mode", at::kFloat));
    within("encode.packed", pack_tokens(encoder.encode(image)), load_tensor(g, "encode.packed", at::kFloat));
    // Patches in and out are inverses, and the statistics matter.
    CHECK(at::equal(patchify_latents(unpatchify_latents(tokens)), tokens));
    CHECK(at::equal(pack_tokens(tokens), load_tensor(g, "decode.packed", at::kFloat)));
    CHECK((norm.std - 1).abs().max().item<double>() > 1e-2);
}

TEST_CASE("VAE configs we cannot decode are refused by name") {
    CHECK_THROWS_WITH_AS(VaeConfig::from_json_text(R"({"_class_name": "AutoencoderTiny"})", "v.json"),
                         doctest::Contains("AutoencoderTiny"), ModelError);
    CHECK_THROWS_WITH_AS(
        VaeConfig::from_json_text(R"({"block_out_channels": [30], "norm_num_groups": 32})", "v.json"),
        doctest::Contains("multiples of norm_num_groups"), ModelError);
    CHECK_THROWS_WITH_AS(
        VaeConfig::from_json_text(
            R"({"block_out_channels": [32], "up_block_types": ["AttnUpDecoderBlock2D"]})", "v.json"),
        doctest::Contains("up_block_types"), ModelError);
    for (const char* flux2 :
         {R"({"_class_name": "AutoencoderKLFlux2", "patch_size": [1, 1]})",
          R"({"_class_name": "AutoencoderKLFlux2", "scaling_factor": 0.3})",
          R"({"_class_name": "AutoencoderKLFlux2", "decoder_block_out_channels": [32]})"}) {
        CAPTURE(flux2);
        CHECK_THROWS_AS(VaeConfig::from_json_text(flux2, "v.json"), ModelError);
    }
    CHECK(VaeConfig::from_json_text(R"({"block_out_channels": [32, 64, 64, 64]})", "v.json").scale_factor() ==
          8);
}
