// SD3Transformer2DModel against diffusers (fp32, CPU): a plain config and an SD3.5-style one with
// RMS qk-norm, patch 2 and a cropped, non-square patch grid.
#include "unit/doctest_torch.h"

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/models/sd3/sd3_transformer.h"

using namespace dp::runtime;

namespace {
// A golden transformer (diffusers' weights) and the inputs diffusers ran it on.
struct GoldenCase {
    explicit GoldenCase(const std::string& name)
        : dir(golden_path(name)),
          weights(WeightStore::open_folder(dir, at::kFloat, at::kCPU)),
          model(Sd3TransformerConfig::from_json_file(dir + "/config.json"), weights),
          file(SafetensorsFile::open(dir + ".safetensors")) {}
    at::Tensor get(const std::string& key) const { return load_tensor(file, key, at::kFloat); }

    std::string dir;
    WeightStore weights;
    Sd3Transformer model;
    std::shared_ptr<SafetensorsFile> file;
};

// Rank `rank` of a tensor-parallel mesh of `size`, without its group: enough to load a shard.
ParallelContext tensor_parallel_rank(int rank, int size) {
    dp::strategies::MeshDegrees degrees;
    degrees.tp = size;
    return ParallelContext::from_groups(dp::strategies::Mesh(size, degrees), rank, nullptr, nullptr, nullptr,
                                        nullptr);
}
}  // namespace

TEST_CASE("the SD3 transformer matches diffusers within 1e-4, with and without qk-norm") {
    for (const std::string name : {"sd3_transformer", "sd3_transformer_qknorm"}) {
        CAPTURE(name);
        GoldenCase g(name);
        g.weights.check_all_taken();
        const at::Tensor out =
            g.model.forward(g.get("latents"), g.get("text"), g.get("pooled"), g.get("timestep"));
        const at::Tensor ref = g.get("out");
        REQUIRE(out.sizes() == ref.sizes());
        const double diff = (out - ref).abs().max().item<double>();
        MESSAGE(name << ": max |diff| " << diff << " (output max |value| " << ref.abs().max().item<double>()
                     << ")");
        CHECK(diff <= 1e-4);
    }
}

TEST_CASE("a run of identical text tokens passed once with its repeat count gives the same output") {
    // Note [constant text tail]: the pipeline passes one of T5's 256 zero positions and the count.
    // Checked here with a non-zero repeated row, both configs, so it holds for any constant tail.
    for (const std::string name : {"sd3_transformer", "sd3_transformer_qknorm"}) {
        CAPTURE(name);
        GoldenCase g(name);
        const at::Tensor latents = g.get("latents"), text = g.get("text"), pooled = g.get("pooled"),
                         t = g.get("timestep");
        const at::Tensor row = text.narrow(1, 0, 1) * -0.5 + 0.25;  // any row, repeated
        const int64_t repeats = 37;
        const at::Tensor full =
            g.model.forward(latents, at::cat({text, row.expand({-1, repeats, -1})}, 1), pooled, t);
        const at::Tensor once = g.model.forward(latents, at::cat({text, row}, 1), pooled, t, repeats);
        const at::Tensor ignored = g.model.forward(latents, at::cat({text, row}, 1), pooled, t);
        const double diff = (once - full).abs().max().item<double>();
        MESSAGE(name << ": max |diff| " << diff);
        CHECK(diff <= 1e-5);
        // The repeat count matters: the same tokens counted once give another output.
        CHECK((ignored - full).abs().max().item<double>() > 1e-3);
        CHECK_THROWS_WITH_AS(g.model.forward(latents, text, pooled, t, 0), doctest::Contains("repeat"),
                             ModelError);
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
    CHECK_THROWS_WITH_AS(Sd3TransformerConfig::from_json_text(R"({"dual_attention_layers": [18]})", "t.json"),
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
        split += 6 * d * d + 6 * d + (last ? 2 : 6) * (d * d + d);  // AdaLN linears, gathered after
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
        const auto parallel = tensor_parallel_rank(tp - 1, tp);
        const Sd3Transformer shard(c, weights, parallel);
        weights.check_all_taken();
        CHECK(shard.parameter_bytes() == 4 * (whole + split / tp));
        MESSAGE("tp " << tp << ": " << shard.parameter_bytes() << " bytes per rank (" << 4 * whole
                      << " replicated + " << 4 * split / tp << " sharded)");
    }
    WeightStore weights = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
    const auto tp5 = tensor_parallel_rank(0, 5);  // 4 heads: a rank would hold none
    CHECK_THROWS_WITH_AS(Sd3Transformer(c, weights, tp5), doctest::Contains("so a rank would hold none"),
                         ModelError);
}
