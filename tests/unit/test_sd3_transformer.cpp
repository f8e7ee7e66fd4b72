// SD3Transformer2DModel against diffusers (fp32, CPU): a plain config and an SD3.5-style one with
// RMS qk-norm, patch 2 and a cropped, non-square patch grid.
#include "unit/doctest_torch.h"

#include "runtime/errors.h"
#include "runtime/models/sd3_transformer.h"
#include "runtime/tensor_io.h"

using namespace dp::runtime;

TEST_CASE("the SD3 transformer matches diffusers within 1e-4, with and without qk-norm") {
    for (const std::string name : {"sd3_transformer", "sd3_transformer_qknorm"}) {
        CAPTURE(name);
        const std::string dir = golden_path(name);
        WeightStore weights = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
        Sd3Transformer model(Sd3TransformerConfig::from_json_file(dir + "/config.json"), weights);
        weights.check_all_taken();
        auto g = SafetensorsFile::open(dir + ".safetensors");
        const at::Tensor out =
            model.forward(load_tensor(g, "latents", at::kFloat), load_tensor(g, "text", at::kFloat),
                          load_tensor(g, "pooled", at::kFloat), load_tensor(g, "timestep", at::kFloat));
        const at::Tensor ref = load_tensor(g, "out", at::kFloat);
        REQUIRE(out.sizes() == ref.sizes());
        const double diff = (out - ref).abs().max().item<double>();
        MESSAGE(name << ": max |diff| " << diff << " (output max |value| " << ref.abs().max().item<double>()
                     << ")");
        CHECK(diff <= 1e-4);
    }
}

TEST_CASE("sizes the model cannot take, and configs it does not support, are refused") {
    const std::string dir = golden_path("sd3_transformer_qknorm");
    WeightStore weights = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
    Sd3Transformer model(Sd3TransformerConfig::from_json_file(dir + "/config.json"), weights);
    const at::Tensor text = at::zeros({1, 3, 24}), pooled = at::zeros({1, 20}), t = at::ones({1});
    CHECK_THROWS_WITH_AS(model.forward(at::zeros({1, 4, 7, 8}), text, pooled, t),
                         doctest::Contains("not a multiple of the patch size 2"), ModelError);
    CHECK_THROWS_WITH_AS(model.forward(at::zeros({1, 4, 26, 8}), text, pooled, t),
                         doctest::Contains("position table has 12x12"), ModelError);
    CHECK_THROWS_WITH_AS(Sd3TransformerConfig::from_json_text(R"({"dual_attention_layers": [0]})", "t.json"),
                         doctest::Contains("dual_attention_layers"), ModelError);
    CHECK_THROWS_WITH_AS(Sd3TransformerConfig::from_json_text(R"({"qk_norm": "layer_norm"})", "t.json"),
                         doctest::Contains("qk_norm"), ModelError);
    CHECK_THROWS_WITH_AS(
        Sd3TransformerConfig::from_json_text(R"({"_class_name": "FluxTransformer2DModel"})", "t.json"),
        doctest::Contains("FluxTransformer2DModel"), ModelError);
}

TEST_CASE("tensor-parallel shards: per-rank parameter bytes at tp 1, 2 and 4 follow the split exactly") {
    const std::string dir = golden_path("sd3_tiny/transformer");
    const Sd3TransformerConfig c = Sd3TransformerConfig::from_json_file(dir + "/config.json");
    // Counted from the config alone: what tensor parallelism splits, and what stays whole.
    const int64_t d = c.inner_dim(), layers = c.num_layers;
    int64_t split = 0, whole = 0;
    for (int64_t i = 0; i < layers; ++i) {
        const bool last = i == layers - 1;
        split += 6 * (d * d + d);                       // q, k, v for both streams: weights and biases
        split += (last ? 1 : 2) * d * d;                // attention-out (and text out): weights
        whole += (last ? 1 : 2) * d;                    // ... whose biases stay whole
        split += (last ? 1 : 2) * (4 * d * d + 4 * d);  // MLP-in: weights and biases
        split += (last ? 1 : 2) * 4 * d * d;            // MLP-out: weights
        whole += (last ? 1 : 2) * d;                    // ... biases
        whole += 6 * d * d + 6 * d + (last ? 2 : 6) * (d * d + d);  // AdaLN linears
    }
    whole +=
        d * c.in_channels * c.patch_size * c.patch_size + d + c.pos_embed_max_size * c.pos_embed_max_size * d;
    whole +=
        256 * d + d + d * d + d + c.pooled_projection_dim * d + d + d * d + d;  // timestep and text embedders
    whole += c.joint_attention_dim * d + d + d * 2 * d + 2 * d;                 // context embedder, norm_out
    whole += d * c.patch_size * c.patch_size * c.out_channels +
             c.patch_size * c.patch_size * c.out_channels;  // proj_out
    for (int tp : {1, 2, 4}) {
        CAPTURE(tp);
        WeightStore weights = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
        const Sd3Transformer shard(c, weights, /*tp_rank=*/tp - 1, tp);
        weights.check_all_taken();
        CHECK(shard.parameter_bytes() == 4 * (whole + split / tp));
        MESSAGE("tp " << tp << ": " << shard.parameter_bytes() << " bytes per rank (" << 4 * whole
                      << " replicated + " << 4 * split / tp << " sharded)");
    }
    WeightStore weights = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
    CHECK_THROWS_WITH_AS(Sd3Transformer(c, weights, 0, 3), doctest::Contains("tp must divide them"),
                         ModelError);
}
