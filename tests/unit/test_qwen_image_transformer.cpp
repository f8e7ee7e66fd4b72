// QwenImageTransformer2DModel against diffusers (fp32, CPU): a batch of two prompts whose texts
// have different real lengths, the same without a mask, and a square grid; then every context and
// tensor-parallel layout (ranks as threads) against one process, on text lengths and patch grids
// the degrees do not divide, and the per-rank bytes tensor parallelism leaves.
#include "unit/doctest_torch.h"

#include <cmath>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/models/qwen_image/qwen_image_transformer.h"
#include "runtime/parallel/communicator.h"
#include "runtime/parallel/device_mapping.h"
#include "runtime/parallel/parallel_context.h"
#include "strategies/mesh.h"
#include "unit/ranks_as_threads.h"

using namespace dp::runtime;
using dp::strategies::Mesh;
using dp::strategies::MeshDegrees;

namespace {

const std::string kName = "qwen_image_transformer";

QwenImageTransformerConfig golden_config() {
    return QwenImageTransformerConfig::from_json_file(golden_path(kName) + "/config.json");
}
WeightStore golden_weights() { return WeightStore::open_folder(golden_path(kName), at::kFloat, at::kCPU); }

// One golden case: its inputs and diffusers' output.
struct Case {
    std::string name;
    at::Tensor latents, text, mask, timestep, out;
    int64_t grid_h = 0, grid_w = 0;
};

std::vector<Case> golden_cases() {
    const auto file = SafetensorsFile::open(golden_path(kName) + ".safetensors");
    auto get = [&](const std::string& key) { return load_tensor(file, key, at::kFloat); };
    Case masked{"masked",
                get("masked.latents"),
                get("masked.text"),
                load_tensor(file, "masked.mask", at::kLong),
                get("masked.timestep"),
                get("masked.out"),
                3,
                5};
    Case unmasked = masked;
    unmasked.name = "unmasked";
    unmasked.mask = at::Tensor();
    unmasked.out = get("unmasked.out");
    Case square{
        "square", get("square.latents"), get("square.text"), {}, get("square.timestep"), get("square.out"), 4,
        4};
    return {masked, unmasked, square};
}

at::Tensor run(const QwenImageTransformer& model, const Case& c) {
    return model.forward(c.latents, c.text, c.mask, c.timestep, c.grid_h, c.grid_w);
}

class Worst {
  public:
    void add(double v) {
        const std::lock_guard<std::mutex> lock(m_);
        worst_ = std::isnan(v) ? v : std::max(worst_, v);  // NaN sticks: it fails every bound
    }
    double value() const { return worst_; }

  private:
    std::mutex m_;
    double worst_ = 0;
};

}  // namespace

TEST_CASE("the Qwen-Image transformer matches diffusers within 1e-4, with a text mask, without, non-square") {
    WeightStore weights = golden_weights();
    const QwenImageTransformer model(golden_config(), weights);
    weights.check_all_taken();
    for (const Case& c : golden_cases()) {
        CAPTURE(c.name);
        const at::Tensor out = run(model, c);
        REQUIRE(out.sizes() == c.out.sizes());
        const double diff = max_diff(out, c.out);
        MESSAGE(c.name << ": max |diff| " << diff << " (output max |value| "
                       << c.out.abs().max().item<double>() << ")");
        CHECK(diff <= 1e-4);
    }
    // The mask matters, and a bool mask is the integer one.
    const std::vector<Case> cases = golden_cases();
    CHECK(max_diff(cases[0].out, cases[1].out) > 1e-2);
    Case as_bool = cases[0];
    as_bool.mask = as_bool.mask.to(at::kBool);
    CHECK(max_diff(run(model, as_bool), cases[0].out) <= 1e-4);
}

TEST_CASE("the Qwen-Image rotary tables centre the image and start the text after its largest index") {
    // A 3 x 4 grid: rows at -2, -1, 0, columns at -2, -1, 0, 1; the text from max(1, 2) = 2.
    const QwenRope r = qwen_image_rope({2, 2, 2}, 3, 4, 2);
    REQUIRE(r.image_cos.sizes() == at::IntArrayRef({12, 3}));
    const at::Tensor angles = at::atan2(r.image_sin, r.image_cos);
    CHECK(at::allclose(angles.select(1, 0), at::zeros({12})));
    CHECK(at::allclose(angles.select(1, 1),
                       at::tensor(std::vector<float>{-2, -2, -2, -2, -1, -1, -1, -1, 0, 0, 0, 0})));
    CHECK(at::allclose(angles.select(1, 2),
                       at::tensor(std::vector<float>{-2, -1, 0, 1, -2, -1, 0, 1, -2, -1, 0, 1})));
    CHECK(at::allclose(at::atan2(r.text_sin, r.text_cos),
                       at::tensor(std::vector<float>{2, 3}).unsqueeze(1).expand({2, 3})));
    // A pair (1, 0) rotated by 2 radians.
    const at::Tensor x = at::tensor({1.f, 0.f}).view({1, 1, 1, 2});
    const at::Tensor y = apply_qwen_rope(x, at::full({1, 1}, std::cos(2.0)), at::full({1, 1}, std::sin(2.0)));
    CHECK(at::allclose(y.flatten(), at::tensor({std::cos(2.0), std::sin(2.0)}).to(at::kFloat)));
}

TEST_CASE("configs the Qwen-Image transformer does not support, and inputs it cannot take, are refused") {
    for (const char* key : {"guidance_embeds", "zero_cond_t", "use_additional_t_cond", "use_layer3d_rope"}) {
        CAPTURE(key);
        const std::string json = std::string(R"({"axes_dims_rope": [16, 56, 56], ")") + key + R"(": true})";
        CHECK_THROWS_WITH_AS(QwenImageTransformerConfig::from_json_text(json, "t.json"),
                             doctest::Contains((std::string("'") + key + "'").c_str()), ModelError);
    }
    CHECK_THROWS_WITH_AS(
        QwenImageTransformerConfig::from_json_text(R"({"axes_dims_rope": [16, 56, 54]})", "t.json"),
        doctest::Contains("sums to 126; it must sum to attention_head_dim (128)"), ModelError);
    CHECK_THROWS_WITH_AS(
        QwenImageTransformerConfig::from_json_text(R"({"axes_dims_rope": [15, 57, 56]})", "t.json"),
        doctest::Contains("3 even integers"), ModelError);
    CHECK_THROWS_WITH_AS(
        QwenImageTransformerConfig::from_json_text(R"({"_class_name": "FluxTransformer2DModel"})", "t.json"),
        doctest::Contains("FluxTransformer2DModel"), ModelError);
    // Qwen-Image's defaults, and diffusers' out_channels rule: absent 16, null in_channels.
    const QwenImageTransformerConfig d = QwenImageTransformerConfig::from_json_text("{}", "t.json");
    CHECK(d.inner_dim() == 3072);
    CHECK(d.num_layers == 60);
    CHECK(d.out_channels == 16);
    CHECK(QwenImageTransformerConfig::from_json_text(R"({"out_channels": null})", "t.json").out_channels ==
          64);

    WeightStore weights = golden_weights();
    const QwenImageTransformer model(golden_config(), weights);
    const Case c = golden_cases()[0];
    CHECK_THROWS_WITH_AS(model.forward(c.latents, c.text, c.mask, c.timestep, 5, 3 + 1),
                         doctest::Contains("5 x 4 patch grid"), ModelError);
    CHECK_THROWS_WITH_AS(model.forward(c.latents, c.text, c.mask.narrow(1, 0, 6), c.timestep, 3, 5),
                         doctest::Contains("the text mask must be [2, 7]"), ModelError);
    CHECK_THROWS_WITH_AS(model.forward(c.latents, c.text.narrow(2, 0, 16), c.mask, c.timestep, 3, 5),
                         doctest::Contains("text [2, tokens >= 1, 32]"), ModelError);
}

namespace {

MeshDegrees mesh_of(int tp, int ulysses, int ring) {
    MeshDegrees d;
    d.tp = tp;
    d.ulysses = ulysses;
    d.ring = ring;
    return d;
}

// The golden cases under `degrees` on ranks as threads, against one process; the largest
// difference over ranks and cases.
double layout_difference(const MeshDegrees& degrees, const std::vector<Case>& cases,
                         const std::vector<at::Tensor>& expected) {
    const int world = degrees.product();
    Worst worst;
    dp::test::run_ranks(world, [&](int, Communicator& group) {
        const ParallelContext parallel(group, Mesh(world, degrees));
        WeightStore mine = golden_weights();
        const QwenImageTransformer model(golden_config(), mine, parallel);
        mine.check_all_taken();
        for (std::size_t i = 0; i < cases.size(); ++i) worst.add(max_diff(run(model, cases[i]), expected[i]));
    });
    return worst.value();
}

}  // namespace

TEST_CASE(
    "the Qwen-Image transformer under ulysses2, ring2, ring3, USP, tp2 and tp2 x ring2 equals one process") {
    // 15 and 16 image tokens, 7 and 5 text tokens: none divides by 3 or 4, most not by 2.
    std::vector<Case> cases = golden_cases();
    cases.erase(cases.begin() + 1);  // masked and square
    WeightStore weights = golden_weights();
    const QwenImageTransformer alone(golden_config(), weights);
    std::vector<at::Tensor> expected;
    for (const Case& c : cases) expected.push_back(run(alone, c));
    for (const auto& [tp, ulysses, ring] : std::vector<std::tuple<int, int, int>>{
             {1, 2, 1}, {1, 1, 2}, {1, 1, 3}, {1, 2, 2}, {2, 1, 1}, {2, 1, 2}}) {
        CAPTURE(tp);
        CAPTURE(ulysses);
        CAPTURE(ring);
        const double diff = layout_difference(mesh_of(tp, ulysses, ring), cases, expected);
        MESSAGE("tp " << tp << " x ulysses " << ulysses << " x ring " << ring << ": max |diff| " << diff);
        CHECK(diff < 1e-5);
    }
}

TEST_CASE(
    "Qwen-Image's tp shards split attention, MLPs and both modulations, and device_map places the blocks") {
    const QwenImageTransformerConfig c = golden_config();
    const int64_t d = c.inner_dim(), layers = c.num_layers, p = c.patch_size;
    // Counted from the config alone: what tensor parallelism splits, and what stays whole.
    int64_t split = 0, whole = 0;
    for (int64_t i = 0; i < layers; ++i) {
        split += 6 * (d * d + d);                // q, k, v of both streams: weights and biases
        split += 2 * d * d, whole += 2 * d;      // to_out, to_add_out: weights split, biases whole
        split += 2 * (4 * d * d + 4 * d);        // both MLP-ins
        split += 2 * 4 * d * d, whole += 2 * d;  // both MLP-outs
        split += 2 * (6 * d * d + 6 * d);        // img_mod, txt_mod: split and gathered
        whole += 4 * c.attention_head_dim;       // qk-norms
    }
    whole += c.in_channels * d + d + c.joint_attention_dim + c.joint_attention_dim * d + d;  // img_in, txt
    whole += 256 * d + d + d * d + d;                                                  // timestep embedder
    whole += d * 2 * d + 2 * d + d * p * p * c.out_channels + p * p * c.out_channels;  // norm_out, proj_out
    for (int tp : {1, 2}) {
        for (int rank = 0; rank < tp; ++rank) {
            CAPTURE(tp);
            CAPTURE(rank);
            WeightStore weights = golden_weights();
            const ParallelContext parallel = ParallelContext::from_groups(Mesh(tp, mesh_of(tp, 1, 1)), rank,
                                                                          nullptr, nullptr, nullptr, nullptr);
            const QwenImageTransformer shard(c, weights, parallel);
            weights.check_all_taken();
            CHECK(shard.parameter_bytes() == 4 * (whole + split / tp));
        }
    }
    WeightStore weights = golden_weights();
    const ParallelContext tp3 =
        ParallelContext::from_groups(Mesh(3, mesh_of(3, 1, 1)), 0, nullptr, nullptr, nullptr, nullptr);
    CHECK_THROWS_WITH_AS(QwenImageTransformer(c, weights, tp3),
                         doctest::Contains("so a rank would hold none"), ModelError);

    // Two CPU "devices", one block on each: the same output, the activations moved between them.
    auto mapping = std::make_shared<DeviceMapping>();
    mapping->labels = {"cpu:0", "cpu:1"};
    mapping->devices = {at::Device(at::kCPU), at::Device(at::kCPU)};
    mapping->transformer_blocks = {0, 1};
    WeightStore placed = golden_weights();
    const QwenImageTransformer model(c, placed, ParallelContext::single(), mapping);
    const Case g = golden_cases()[0];
    CHECK(max_diff(run(model, g), g.out) <= 1e-4);
    CHECK(mapping->moves() > 0);
}
