// Weight variants (diffusers' `variant`) and components stored in another dtype than the run's:
// the store reads the variant's files, single or sharded, and converts each tensor as it is taken.
// Checked by construction: an fp32 run of a component stored in fp16 gives exactly what fp32
// weights rounded through fp16 give, and stays close to transformers' fp32 output.
#include "unit/doctest_torch.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/io/weights.h"
#include "runtime/models/common/clip_text_encoder.h"

using namespace dp::runtime;

namespace {

std::string scratch(const std::string& name) {
    const std::string dir = "/tmp/dp_weight_variants_" + std::to_string(getpid()) + "_" + name;
    REQUIRE(std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()) == 0);
    return dir;
}

// Every tensor of clip_l's golden weights, converted to `dtype`.
std::vector<std::pair<std::string, at::Tensor>> clip_l_tensors(at::ScalarType dtype) {
    auto file = SafetensorsFile::open(golden_path("clip_l/model.safetensors"));
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& [name, info] : file->tensors())
        out.emplace_back(name, load_tensor(file, name, at::kFloat).to(dtype));
    return out;
}

}  // namespace

TEST_CASE(
    "an fp16 variant of a component in an fp32 run: converted on load, the same as fp16-rounded weights") {
    const std::string dir = scratch("clip_fp16");
    REQUIRE(std::system(("cp '" + golden_path("clip_l/config.json") + "' '" + dir + "/'").c_str()) == 0);
    // The plain files: fp32 weights that went through fp16 once. The fp16 variant: the same values,
    // stored as F16. An fp32 run of either must compute with identical weights.
    std::vector<std::pair<std::string, at::Tensor>> rounded;
    for (auto& [name, t] : clip_l_tensors(at::kHalf)) rounded.emplace_back(name, t.to(at::kFloat));
    save_safetensors(dir + "/model.safetensors", rounded);
    save_safetensors(dir + "/model.fp16.safetensors", clip_l_tensors(at::kHalf));
    REQUIRE(
        SafetensorsFile::open(dir + "/model.fp16.safetensors")->info("text_projection.weight").shape.size() ==
        2);

    const ClipTextConfig config = ClipTextConfig::from_json_file(dir + "/config.json");
    WeightStore plain = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
    WeightStore fp16 = WeightStore::open_folder(dir, at::kFloat, at::kCPU, "fp16");
    ClipTextEncoder a(config, plain), b(config, fp16);
    plain.check_all_taken();
    fp16.check_all_taken();
    const at::Tensor w = fp16.take("text_projection.weight", {config.projection_dim, config.hidden_size});
    CHECK((w.scalar_type() == at::kFloat));  // converted to the run's dtype, not kept as F16

    auto golden = SafetensorsFile::open(golden_path("clip_l.safetensors"));
    const at::Tensor ids = load_tensor(golden, "input_ids", at::kLong);
    const ClipTextOutput from_plain = a.forward(ids, 0), from_fp16 = b.forward(ids, 0);
    CHECK(max_diff(from_fp16.hidden, from_plain.hidden) == 0);
    CHECK(max_diff(from_fp16.pooled, from_plain.pooled) == 0);
    // And close to transformers' fp32 output: fp16 storage costs only rounding.
    const double d = max_diff(from_fp16.pooled, load_tensor(golden, "pooled", at::kFloat));
    MESSAGE("fp16-stored CLIP-L in an fp32 run: max |diff| to fp32 transformers " << d);
    CHECK(d < 2e-2);
    CHECK(d > 0);  // the rounding is there: the test would notice a store that ignored the variant
    std::system(("rm -rf '" + dir + "'").c_str());
}

TEST_CASE("a sharded variant is read through its index, and bf16 storage in an fp32 run is converted") {
    const std::string dir = scratch("sharded_bf16");
    const auto tensors = clip_l_tensors(at::kBFloat16);
    std::vector<std::pair<std::string, at::Tensor>> first, second;
    nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const bool one = i % 2 == 0;
        (one ? first : second).push_back(tensors[i]);
        index["weight_map"][tensors[i].first] =
            one ? "model.bf16-00001-of-00002.safetensors" : "model.bf16-00002-of-00002.safetensors";
    }
    save_safetensors(dir + "/model.bf16-00001-of-00002.safetensors", first);
    save_safetensors(dir + "/model.bf16-00002-of-00002.safetensors", second);
    std::ofstream(dir + "/model.safetensors.index.bf16.json") << index.dump();
    WeightStore store = WeightStore::open_folder(dir, at::kFloat, at::kCPU, "bf16");
    for (const auto& [name, t] : tensors) {
        CAPTURE(name);
        const at::Tensor got = store.take(name, t.sizes().vec());
        CHECK((got.scalar_type() == at::kFloat));
        CHECK(max_diff(got, t.to(at::kFloat)) == 0);
    }
    store.check_all_taken();
    // Only the variant is there: a plain run is refused, naming it and the flag.
    CHECK_THROWS_WITH_AS(
        WeightStore::open_folder(dir, at::kFloat, at::kCPU),
        doctest::Contains("only variant weights (bf16, e.g. NAME.bf16.safetensors), no plain ones; "
                          "pass --variant bf16"),
        ModelError);
    CHECK_THROWS_WITH_AS(WeightStore::open_folder(dir, at::kFloat, at::kCPU, "fp16"),
                         doctest::Contains(("--variant fp16: " + dir + " has no fp16 weights").c_str()),
                         ModelError);
    std::system(("rm -rf '" + dir + "'").c_str());
}
