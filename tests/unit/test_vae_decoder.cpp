// AutoencoderKL's decoder against diffusers (fp32, CPU): the SD3 test VAE (one block) and a
// two-block one with upsampling, a shortcut conv and the post-quant conv.
#include "unit/doctest_torch.h"

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/models/common/vae_decoder.h"

using namespace dp::runtime;

TEST_CASE("the VAE decoder matches diffusers within 1e-4") {
    for (const std::string name : {"vae_tiny", "vae_up"}) {
        CAPTURE(name);
        const std::string dir = golden_path(name);
        WeightStore weights = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
        VaeDecoder vae(VaeConfig::from_json_file(dir + "/config.json"), weights);
        weights.check_all_taken();
        auto g = SafetensorsFile::open(dir + ".safetensors");
        const at::Tensor image = vae.decode(load_tensor(g, "latents", at::kFloat));
        const at::Tensor ref = load_tensor(g, "image", at::kFloat);
        REQUIRE(image.sizes() == ref.sizes());
        const double diff = (image - ref).abs().max().item<double>();
        MESSAGE(name << ": max |diff| " << diff);
        CHECK(diff <= 1e-4);
    }
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
    CHECK(VaeConfig::from_json_text(R"({"block_out_channels": [32, 64, 64, 64]})", "v.json").scale_factor() ==
          8);
}
