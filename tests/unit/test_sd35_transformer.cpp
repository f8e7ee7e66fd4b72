// SD3.5's transformer against diffusers (fp32, CPU): MMDiT-X dual-attention blocks with RMS
// qk-norm, skipped blocks (skip-layer guidance), the stored and the computed position tables at
// SD3.5's sizes; and every strategy on the dual-attention model equal to one process, with ranks
// as threads of this process.
#include "unit/doctest_torch.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/models/sd3/sd3_transformer.h"
#include "runtime/parallel/communicator.h"
#include "runtime/parallel/parallel_context.h"
#include "strategies/family.h"
#include "strategies/model_sizes.h"
#include "strategies/parallel_spec.h"
#include "unit/ranks_as_threads.h"

using namespace dp::runtime;
using dp::strategies::Mesh;
using dp::strategies::MeshDegrees;

namespace {

// The golden dual-attention transformer's folder, and the inputs and outputs diffusers gave.
const std::string& sd35_dir() {
    static const std::string dir = golden_path("sd35_transformer");
    return dir;
}

struct Sd35Golden {
    Sd35Golden() : file(SafetensorsFile::open(sd35_dir() + ".safetensors")) {}
    at::Tensor get(const std::string& key) const { return load_tensor(file, key, at::kFloat); }
    std::shared_ptr<SafetensorsFile> file;
};

Sd3TransformerConfig sd35_config() {
    return Sd3TransformerConfig::from_json_file(sd35_dir() + "/config.json");
}

// A copy of a golden transformer folder without its stored position table, so that the model
// builds the sin-cos table as diffusers does for a checkpoint that stores none. Removed at exit.
std::string without_position_table(const std::string& name) {
    static const std::string root = "/tmp/dp_sd35_test_" + std::to_string(getpid());
    static const struct Cleanup {
        ~Cleanup() { (void)std::system(("rm -rf '" + root + "'").c_str()); }
    } cleanup;
    const std::string src = golden_path(name), dst = root + "/" + name;
    (void)std::system(("mkdir -p '" + dst + "'").c_str());
    std::ofstream(dst + "/config.json") << read_text_file(src + "/config.json");
    const auto file = SafetensorsFile::open(src + "/diffusion_pytorch_model.safetensors");
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& [tensor, info] : file->tensors())
        if (tensor != "pos_embed.pos_embed")
            tensors.emplace_back(tensor, load_tensor(file, tensor, at::kFloat));
    save_safetensors(dst + "/diffusion_pytorch_model.safetensors", tensors);
    return dst;
}

}  // namespace

TEST_CASE("the SD3.5 transformer matches diffusers within 1e-4, with and without skipped blocks") {
    const Sd35Golden g;
    WeightStore weights = WeightStore::open_folder(sd35_dir(), at::kFloat, at::kCPU);
    const Sd3TransformerConfig config = sd35_config();
    CHECK(config.dual_attention_layers == std::vector<int64_t>{0, 1});
    const Sd3Transformer model(config, weights);
    weights.check_all_taken();  // attn2 and its qk-norm included
    const at::Tensor latents = g.get("latents"), text = g.get("text"), pooled = g.get("pooled"),
                     t = g.get("timestep");
    for (const auto& run : std::vector<std::pair<std::string, std::vector<int>>>{
             {"out", {}}, {"out_skip_1", {1}}, {"out_skip_0_2", {0, 2}}}) {
        const std::string& key = run.first;
        const std::vector<int>& skip = run.second;
        CAPTURE(key);
        const at::Tensor out = model.forward(latents, text, pooled, t, 1, skip), ref = g.get(key);
        REQUIRE(out.sizes() == ref.sizes());
        const double diff = max_diff(out, ref);
        MESSAGE(key << ": max |diff| " << diff << " (output max |value| " << ref.abs().max().item<double>()
                    << ")");
        CHECK(diff <= 1e-4);
    }
    // Skipping is not a no-op, and a block named twice is skipped once.
    CHECK(max_diff(g.get("out"), g.get("out_skip_1")) > 1e-2);
    CHECK(max_diff(model.forward(latents, text, pooled, t, 1, {1, 1}), g.get("out_skip_1")) <= 1e-4);
    for (int bad : {3, -1, 100}) {
        CAPTURE(bad);
        const std::string message = "skip layer " + std::to_string(bad) +
                                    ": the transformer has 3 blocks; skipped layers are block indices 0 to 2";
        CHECK_THROWS_WITH_AS(model.forward(latents, text, pooled, t, 1, {0, bad}), message.c_str(),
                             ModelError);
    }
}

TEST_CASE("the position table: the checkpoint's when it stores one, else diffusers' sin-cos table") {
    // The golden SD3.5 model stores a perturbed table: without it the output differs.
    const Sd35Golden g;
    const std::string bare = without_position_table("sd35_transformer");
    WeightStore weights = WeightStore::open_folder(bare, at::kFloat, at::kCPU);
    const Sd3Transformer rebuilt(sd35_config(), weights);
    weights.check_all_taken();
    const at::Tensor out =
        rebuilt.forward(g.get("latents"), g.get("text"), g.get("pooled"), g.get("timestep"));
    CHECK(max_diff(out, g.get("out")) > 1e-3);
    // An SD3 golden model stores diffusers' own table: built here instead, the output is diffusers'.
    const std::string name = "sd3_transformer_qknorm";
    const auto ref = SafetensorsFile::open(golden_path(name) + ".safetensors");
    auto get = [&](const std::string& key) { return load_tensor(ref, key, at::kFloat); };
    const std::string dir = without_position_table(name);
    WeightStore plain = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
    const Sd3Transformer model(Sd3TransformerConfig::from_json_file(dir + "/config.json"), plain);
    const at::Tensor computed = model.forward(get("latents"), get("text"), get("pooled"), get("timestep"));
    MESSAGE("computed table: max |diff| " << max_diff(computed, get("out")));
    CHECK(max_diff(computed, get("out")) <= 1e-4);
}

TEST_CASE("sin-cos position tables and their centre crops equal diffusers' at SD3.5's sizes") {
    const auto file = SafetensorsFile::open(golden_path("sd35_pos_embed.safetensors"));
    struct Case {
        std::string name;
        int64_t dim, grid, base, height, width;
    };
    for (const Case& c : {Case{"medium", 1536, 384, 64, 5, 3}, Case{"large", 2432, 192, 64, 3, 2},
                          Case{"column", 64, 384, 64, 384, 1}}) {
        CAPTURE(c.name);
        const at::Tensor ref = load_tensor(file, c.name, at::kFloat);
        const at::Tensor crop = sincos_pos_embed_crop(c.dim, c.grid, c.base, c.height, c.width);
        REQUIRE(crop.sizes() == ref.sizes());
        CHECK(max_diff(crop, ref) <= 1e-6);
    }
    const at::Tensor whole = sincos_pos_embed_2d(24, 12, 8), small = load_tensor(file, "small", at::kFloat);
    REQUIRE(whole.sizes() == small.sizes());
    CHECK(max_diff(whole, small) <= 1e-6);
    // An off-centre crop (an odd margin) is a different table: the test would see a shifted crop.
    CHECK(max_diff(sincos_pos_embed_crop(24, 12, 8, 5, 3),
                   whole.view({12, 12, 24}).narrow(0, 3, 5).narrow(1, 4, 3).reshape({15, 24})) <= 1e-7);
    CHECK_THROWS_AS(sincos_pos_embed_crop(24, 12, 8, 13, 3), ModelError);
}

TEST_CASE("dual_attention_layers: block indices, in any order, or a clear error naming the key") {
    auto parse = [](const std::string& layers) {
        return Sd3TransformerConfig::from_json_text(
            R"({"num_layers": 4, "dual_attention_layers": )" + layers + "}", "t.json");
    };
    CHECK(parse("[2, 0, 2]").dual_attention_layers == std::vector<int64_t>{0, 2});
    CHECK(parse("[]").dual_attention_layers.empty());
    CHECK(parse("null").dual_attention_layers.empty());
    CHECK(parse("[3]").dual_attention(3));
    CHECK_FALSE(parse("[3]").dual_attention(2));
    for (const std::string bad : {"[4]", "[-1]", "[0.5]", R"(["0"])", "3", R"({"0": 1})"}) {
        CAPTURE(bad);
        CHECK_THROWS_WITH_AS(parse(bad), doctest::Contains("dual_attention_layers"), ModelError);
        CHECK_THROWS_WITH_AS(parse(bad), doctest::Contains("block indices from 0 to num_layers - 1 (3)"),
                             ModelError);
    }
}

TEST_CASE("SD3's parallel spec splits attn2 like attn and names exactly what the loader shards") {
    const dp::strategies::ParallelSpec& spec = dp::strategies::family_spec("sd3");
    std::set<std::string> expected;
    for (const auto& [tensor, count] : dp::strategies::safetensors_element_counts(sd35_dir()))
        if (dp::strategies::tp_splits_tensor(spec, tensor)) expected.insert(tensor);
    for (const char* name : {"transformer_blocks.1.attn2.to_q.weight", "transformer_blocks.1.attn2.to_q.bias",
                             "transformer_blocks.1.attn2.to_k.weight", "transformer_blocks.1.attn2.to_v.bias",
                             "transformer_blocks.1.attn2.to_out.0.weight"}) {
        CAPTURE(name);
        CHECK(expected.count(name) == 1);
    }
    CHECK_FALSE(dp::strategies::tp_splits_tensor(spec, "transformer_blocks.1.attn2.to_out.0.bias"));
    CHECK_FALSE(dp::strategies::tp_splits_tensor(spec, "transformer_blocks.1.attn2.norm_q.weight"));
    MeshDegrees degrees;
    degrees.tp = 2;
    const ParallelContext parallel =
        ParallelContext::from_groups(Mesh(2, degrees), 1, nullptr, nullptr, nullptr, nullptr);
    WeightStore weights = WeightStore::open_folder(sd35_dir(), at::kFloat, at::kCPU);
    const Sd3Transformer shard(sd35_config(), weights, parallel);
    weights.check_all_taken();
    CHECK(weights.sharded() == expected);
}

namespace {

// Every rank of a `degrees` mesh runs the golden SD3.5 transformer on the golden inputs (all
// blocks, and with block 1 skipped); returns the largest difference from one process over ranks.
double strategy_difference(const MeshDegrees& degrees) {
    const Sd35Golden g;
    const at::Tensor latents = g.get("latents"), text = g.get("text"), pooled = g.get("pooled"),
                     t = g.get("timestep");
    WeightStore whole = WeightStore::open_folder(sd35_dir(), at::kFloat, at::kCPU);
    const Sd3Transformer alone(sd35_config(), whole);
    const at::Tensor expected = alone.forward(latents, text, pooled, t);
    const at::Tensor expected_skip = alone.forward(latents, text, pooled, t, 1, {1});
    const int world = degrees.product();
    std::mutex m;
    double worst = 0;
    dp::test::run_ranks(world, [&](int rank, Communicator& group) {
        const ParallelContext parallel(group, Mesh(world, degrees));
        WeightStore weights = WeightStore::open_folder(sd35_dir(), at::kFloat, at::kCPU);
        const Sd3Transformer model(sd35_config(), weights, parallel);
        const double diff =
            std::max(max_diff(model.forward(latents, text, pooled, t), expected),
                     max_diff(model.forward(latents, text, pooled, t, 1, {1}), expected_skip));
        (void)rank;
        const std::lock_guard<std::mutex> lock(m);
        worst = std::max(worst, diff);
    });
    return worst;
}

}  // namespace

TEST_CASE("every strategy on the dual-attention model equals one process: tp, Ulysses, Ring, USP") {
    struct Case {
        std::string name;
        int tp, ulysses, ring;
    };
    // 35 image tokens (a 7 x 5 patch grid) never divide by the sequence ranks: padding always runs.
    for (const Case& c :
         {Case{"tp2", 2, 1, 1}, Case{"ulysses2", 1, 2, 1}, Case{"ring2", 1, 1, 2}, Case{"ring3", 1, 1, 3},
          Case{"usp ulysses2 x ring2", 1, 2, 2}, Case{"tp2 x ulysses2", 2, 2, 1}}) {
        CAPTURE(c.name);
        MeshDegrees degrees;
        degrees.tp = c.tp;
        degrees.ulysses = c.ulysses;
        degrees.ring = c.ring;
        const double diff = strategy_difference(degrees);
        MESSAGE(c.name << ": max |diff| from one process " << diff);
        CHECK(diff <= 2e-5);
    }
}
