// The sizes a model can make, read from its configs by the launcher before anything starts.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "strategies/family.h"
#include "strategies/model_config.h"
#include "strategies/parallel_spec.h"

using dp::strategies::ImageSizeRule;
using dp::strategies::read_image_size_rule;

namespace {
// A model folder with only the configs the rule reads.
std::string model_folder(const std::string& name, const std::string& vae_entry, const std::string& vae_config,
                         const std::string& transformer_config) {
    const std::string dir = "/tmp/dp_sizes_" + std::to_string(getpid()) + "_" + name;
    std::filesystem::create_directories(dir + "/transformer");
    std::ofstream(dir + "/model_index.json")
        << R"({"_class_name": "StableDiffusion3Pipeline", "vae": )" << vae_entry << "}";
    if (!vae_config.empty()) {
        std::filesystem::create_directories(dir + "/vae");
        std::ofstream(dir + "/vae/config.json") << vae_config;
    }
    std::ofstream(dir + "/transformer/config.json") << transformer_config;
    return dir;
}
}  // namespace

TEST_CASE("the size rule: VAE scale x patch, the position table, and the default size") {
    const auto& spec = dp::strategies::family_spec("sd3");
    // SD3's VAE leaves block_out_channels to its default of 4 blocks (scale 8); patch 2, table 96.
    const std::string sd3 =
        model_folder("sd3", R"(["diffusers", "AutoencoderKL"])", "{}", R"({"sample_size": 128})");
    const ImageSizeRule r = read_image_size_rule(sd3, spec);
    CHECK(r.vae_scale == 8);
    CHECK(r.patch_size == 2);
    CHECK(r.multiple() == 16);
    CHECK(r.max_side() == 1536);
    CHECK(r.default_side == 1024);
    CHECK(r.check(1024).empty());
    CHECK(r.check(1536).empty());
    CHECK(r.check(1000) ==
          "this model makes sizes that are multiples of 16 from 16 to 1536 pixels (nearest: 992 or 1008)");
    CHECK(r.check(1537).find("(nearest: 1536)") != std::string::npos);
    CHECK(r.check(8).find("(nearest: 16)") != std::string::npos);

    // Pixel space ([null, null]: no VAE): the patch alone.
    const std::string pixels = model_folder(
        "pixels", "[null, null]", "", R"({"patch_size": 4, "pos_embed_max_size": 8, "sample_size": 32})");
    const ImageSizeRule p = read_image_size_rule(pixels, spec);
    CHECK(p.multiple() == 4);
    CHECK(p.max_side() == 32);
    CHECK(p.default_side == 32);
    CHECK(p.check(33) == "this model makes sizes that are multiples of 4 from 4 to 32 pixels (nearest: 32)");

    const std::string two =
        model_folder("two", R"(["diffusers", "AutoencoderKL"])", R"({"block_out_channels": [4, 8]})",
                     R"({"patch_size": 1, "pos_embed_max_size": 40})");
    CHECK(read_image_size_rule(two, spec).multiple() == 2);
    CHECK(read_image_size_rule(two, spec).max_side() == 80);
    for (const std::string& dir : {sd3, pixels, two}) std::filesystem::remove_all(dir);
}
