// The VAE encoders (AutoencoderKL's and AutoencoderKLQwenImage's) against diffusers' vae.encode
// latent_dist (fp32, CPU): the shipped tiny models' VAEs and two golden test VAEs with what those lack
// (quant_conv, a shortcut conv, perturbed norms; a downsample2d before a downsample3d), each on a
// square and a non-square seeded image batch (scripts/golden/golden_vae_encoder.py).
#include "unit/doctest_torch.h"

#include <memory>

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/models/common/qwen_image_vae.h"
#include "runtime/models/common/vae_encoder.h"
#include "runtime/pipeline/pipeline_common.h"

using namespace dp::runtime;

namespace {

struct EncoderRow {
    std::string name;    // the golden tensors' prefix
    std::string folder;  // the VAE's folder
    bool qwen = false;   // AutoencoderKLQwenImage, else AutoencoderKL
    int64_t scale = 1;   // pixels per latent
};

std::vector<EncoderRow> encoder_rows() {
    const std::string models(DP_MODELS_DIR);
    return {{"sd3", models + "/tiny-random-sd3/vae", false, 1},
            {"flux_dev", models + "/tiny-random-flux-dev/vae", false, 8},
            {"qwen_image", models + "/tiny-random-qwen-image/vae", true, 2},
            {"vae_up", golden_path("vae_up"), false, 2},
            {"qwen_image_vae", golden_path("qwen_image_vae"), true, 4}};
}

// The row's encoder from its folder, as [B, C, h, w] mean and std; every tensor of the folder taken
// or skipped.
LatentDistribution encode_with(const EncoderRow& row, const at::Tensor& images) {
    WeightStore weights = WeightStore::open_folder(row.folder, at::kFloat, at::kCPU);
    const std::string config = row.folder + "/config.json";
    if (row.qwen) {
        QwenImageVaeEncoder vae(QwenImageVaeConfig::from_json_file(config), weights);
        CHECK(vae.config().scale_factor() == row.scale);
        weights.check_all_taken();
        return vae.encode(images);
    }
    VaeEncoder vae(VaeConfig::from_json_file(config), weights);
    CHECK(vae.config().scale_factor() == row.scale);
    weights.check_all_taken();
    return vae.encode(images);
}

}  // namespace

TEST_CASE("the VAE encoders match diffusers' latent_dist within 2e-5") {
    auto g = SafetensorsFile::open(golden_path("vae_encoder.safetensors"));
    for (const EncoderRow& row : encoder_rows()) {
        for (const std::string size : {"h32_w32", "h32_w48"}) {
            CAPTURE(row.name);
            CAPTURE(size);
            const at::Tensor images = load_tensor(g, "image." + size, at::kFloat);
            const LatentDistribution got = encode_with(row, images);
            at::Tensor mean = load_tensor(g, row.name + "." + size + ".mean", at::kFloat);
            at::Tensor std = load_tensor(g, row.name + "." + size + ".std", at::kFloat);
            if (row.qwen) {  // diffusers' [B, z, 1, h, w], one frame
                REQUIRE(mean.size(2) == 1);
                mean = mean.squeeze(2);
                std = std.squeeze(2);
            }
            REQUIRE(got.mean.sizes() == at::IntArrayRef({2, mean.size(1), images.size(2) / row.scale,
                                                         images.size(3) / row.scale}));
            const double mean_diff = max_diff(got.mean, mean), std_diff = max_diff(got.std, std);
            MESSAGE(row.name << " " << size << ": max |diff| mean " << mean_diff << ", std " << std_diff);
            CHECK(mean_diff <= 2e-5);
            CHECK(std_diff <= 2e-5);
        }
    }
}

TEST_CASE("a VAE encoder loads from the vae folder beside its decoder") {
    const std::string models(DP_MODELS_DIR);
    // One store for both halves: each takes its own, and nothing is left over.
    for (const EncoderRow& row : encoder_rows()) {
        CAPTURE(row.name);
        WeightStore weights = WeightStore::open_folder(row.folder, at::kFloat, at::kCPU);
        const std::string config = row.folder + "/config.json";
        if (row.qwen) {
            const QwenImageVaeConfig c = QwenImageVaeConfig::from_json_file(config);
            QwenImageVaeDecoder decoder(c, weights);
            QwenImageVaeEncoder encoder(c, weights);
        } else {
            const VaeConfig c = VaeConfig::from_json_file(config);
            VaeDecoder decoder(c, weights);
            VaeEncoder encoder(c, weights);
        }
        weights.check_all_taken();
    }
    // Through a family's component loading (its own store, from the options' model folder), beside
    // the decoder; with random weights too.
    for (const bool random : {false, true}) {
        CAPTURE(random);
        PipelineOptions o;
        o.model_dir = models + "/tiny-random-flux-dev";
        if (random) o.random_weights = 5;
        const VaeConfig config = VaeConfig::from_json_file(o.model_dir + "/vae/config.json");
        const auto build_encoder = [&config](WeightStore& w) {
            return std::make_unique<VaeEncoder>(config, w);
        };
        const auto build_decoder = [&config](WeightStore& w) {
            return std::make_unique<VaeDecoder>(config, w);
        };
        const Component<VaeEncoder> encoder =
            component_of<VaeEncoder>(&o, "vae", 24, at::kCPU, build_encoder);
        const Component<VaeDecoder> decoder =
            component_of<VaeDecoder>(&o, "vae", 24, at::kCPU, build_decoder);
        REQUIRE(encoder.kept());
        REQUIRE(decoder.kept());
        const LatentDistribution d = encoder.use()->encode(seeded({1, 3, 16, 24}, 1).clamp(-1, 1));
        CHECK(d.mean.sizes() == at::IntArrayRef({1, 16, 2, 3}));
        CHECK(decoder.use()->decode(d.mean).sizes() == at::IntArrayRef({1, 3, 16, 24}));
    }
}

TEST_CASE("the VAE encoders build with the real models' shapes and encode 8x") {
    // FLUX.1's and SD3's block types and quant convs at a quarter of their width.
    const VaeConfig config = VaeConfig::from_json_text(
        R"({"block_out_channels": [32, 64, 128, 128], "latent_channels": 16, "use_quant_conv": false,
            "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D",
                                 "DownEncoderBlock2D"]})",
        "vae.json");
    CHECK_FALSE(config.use_quant_conv);
    WeightStore weights = WeightStore::random(3, at::kFloat, at::kCPU);
    const LatentDistribution d = VaeEncoder(config, weights).encode(seeded({1, 3, 24, 16}, 4).clamp(-1, 1));
    CHECK(d.mean.sizes() == at::IntArrayRef({1, 16, 3, 2}));
    CHECK(d.std.sizes() == d.mean.sizes());
    CHECK(d.std.min().item<double>() > 0);
    // Qwen-Image's four blocks (a downsample2d, then two downsample3d).
    const QwenImageVaeConfig qwen = QwenImageVaeConfig::from_json_text(
        R"({"base_dim": 4, "dim_mult": [1, 2, 4, 4], "temperal_downsample": [false, true, true]})",
        "vae.json");
    WeightStore qwen_weights = WeightStore::random(3, at::kFloat, at::kCPU);
    const LatentDistribution q = QwenImageVaeEncoder(qwen, qwen_weights).encode(seeded({1, 3, 16, 24}, 4));
    CHECK(q.mean.sizes() == at::IntArrayRef({1, 16, 2, 3}));
    CHECK(q.std.sizes() == q.mean.sizes());
}

TEST_CASE("the VAE encoders refuse images and configs they cannot encode") {
    const std::string models(DP_MODELS_DIR);
    WeightStore weights =
        WeightStore::open_folder(models + "/tiny-random-flux-dev/vae", at::kFloat, at::kCPU);
    const VaeEncoder flux(VaeConfig::from_json_file(models + "/tiny-random-flux-dev/vae/config.json"),
                          weights);
    WeightStore qwen_weights =
        WeightStore::open_folder(models + "/tiny-random-qwen-image/vae", at::kFloat, at::kCPU);
    const QwenImageVaeEncoder qwen(
        QwenImageVaeConfig::from_json_file(models + "/tiny-random-qwen-image/vae/config.json"), qwen_weights);
    struct Bad {
        std::vector<int64_t> shape;
        std::string says;
    };
    const std::vector<Bad> bad = {
        {{2, 3, 32, 36},
         "VAE encode: expected images [B, 3, H, W] with H and W multiples of 8, got [2, 3, 32, 36]"},
        {{2, 3, 12, 32}, "multiples of 8, got [2, 3, 12, 32]"},
        {{2, 4, 32, 32}, "got [2, 4, 32, 32]"},
        {{3, 32, 32}, "got [3, 32, 32]"},
        {{2, 3, 1, 32, 32}, "got [2, 3, 1, 32, 32]"},
        {{0, 3, 32, 32}, "got [0, 3, 32, 32]"},
    };
    for (const Bad& b : bad) {
        CAPTURE(b.says);
        CHECK_THROWS_WITH_AS(flux.encode(at::zeros(b.shape)), doctest::Contains(b.says.c_str()), ModelError);
    }
    CHECK_THROWS_WITH_AS(qwen.encode(at::zeros({1, 3, 31, 32})),
                         doctest::Contains("VAE encode: expected images [B, 3, H, W] with H and W "
                                           "multiples of 2, got [1, 3, 31, 32]"),
                         ModelError);
    CHECK_THROWS_AS(flux.encode(at::Tensor()), ModelError);

    CHECK_THROWS_WITH_AS(
        VaeConfig::from_json_text(
            R"({"block_out_channels": [32], "down_block_types": ["AttnDownEncoderBlock2D"]})", "v.json"),
        doctest::Contains("'down_block_types' supports DownEncoderBlock2D only"), ModelError);
    CHECK_THROWS_WITH_AS(
        VaeConfig::from_json_text(
            R"({"block_out_channels": [32, 32], "down_block_types": ["DownEncoderBlock2D"]})", "v.json"),
        doctest::Contains("'down_block_types' must have one entry per block_out_channels entry"), ModelError);
    // Attention in an encoder down block (attn_scales) is refused by the encoder, ignored by the decoder.
    const QwenImageVaeConfig attn = QwenImageVaeConfig::from_json_text(
        R"({"base_dim": 4, "dim_mult": [1, 2], "temperal_downsample": [true], "attn_scales": [0.5]})",
        "vae.json");
    WeightStore random = WeightStore::random(3, at::kFloat, at::kCPU);
    CHECK_THROWS_WITH_AS(QwenImageVaeEncoder(attn, random), doctest::Contains("attn_scales lists 0.5"),
                         ModelError);
    CHECK_NOTHROW(QwenImageVaeDecoder(attn, random));
    CHECK_THROWS_WITH_AS(QwenImageVaeConfig::from_json_text(R"({"attn_scales": ["half"]})", "vae.json"),
                         doctest::Contains("'attn_scales' must hold numbers only"), ModelError);
}

TEST_CASE("the latent distribution clamps the log variance to [-30, 20] as diffusers does") {
    // moments [1, 2, 1, 3]: the mean channel, then the log variance channel.
    const at::Tensor moments = at::tensor({0.5f, -1.0f, 2.0f, -100.0f, 4.0f, 100.0f}).view({1, 2, 1, 3});
    const LatentDistribution d = latent_distribution(moments);
    CHECK(d.mean.sizes() == at::IntArrayRef({1, 1, 1, 3}));
    CHECK(max_diff(d.mean, at::tensor({0.5f, -1.0f, 2.0f}).view({1, 1, 1, 3})) == 0);
    const at::Tensor want = at::exp(at::tensor({-15.0f, 2.0f, 10.0f})).view({1, 1, 1, 3});
    CHECK(max_diff(d.std / want, at::ones_like(want)) <= 1e-6);
}
