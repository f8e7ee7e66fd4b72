// What the text encoders share, one row per encoder: under tensor parallelism over 2 and 3 ranks
// (as threads of this process) each rank's output equals one process on the golden inputs, each
// rank holds exactly the tensors its family's parallel spec splits and fewer bytes than the whole
// encoder, rank 0 more than rank 1 where the heads do not divide by 3, and a degree that would
// leave a rank without a head is refused by name; a config of a layer more than the weights hold
// is refused naming that layer's first tensor. A new encoder is a row of kEncoders.
#include "unit/doctest_torch.h"

#include <functional>
#include <memory>
#include <mutex>
#include <set>

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/models/common/qwen2_text_encoder.h"
#include "runtime/models/common/t5_encoder.h"
#include "runtime/parallel/communicator.h"
#include "strategies/family.h"
#include "strategies/model_sizes.h"
#include "unit/ranks_as_threads.h"

using namespace dp::runtime;

namespace {

// An encoder as the table drives it, whatever its class: its forward, its bytes and its layers.
struct Loaded {
    std::shared_ptr<const void> model;
    std::function<at::Tensor(const at::Tensor& ids, const at::Tensor& mask)> forward;
    int64_t parameter_bytes = 0;
    int64_t layers = 0;
};

// What differs between the encoders' classes: their layer count, and whether forward takes a mask.
int64_t layers_of(const T5Config& c) { return c.num_layers; }
int64_t layers_of(const Qwen2TextConfig& c) { return c.num_hidden_layers; }
void add_layer(T5Config& c) { ++c.num_layers; }
void add_layer(Qwen2TextConfig& c) { ++c.num_hidden_layers; }
at::Tensor run(const T5Encoder& e, const at::Tensor& ids, const at::Tensor&) { return e.forward(ids); }
at::Tensor run(const Qwen2TextEncoder& e, const at::Tensor& ids, const at::Tensor& mask) {
    return e.forward(ids, mask);
}

// Loads `E` (configured by `C` from the folder's config.json) over `weights` as rank tp.rank.
template <class E, class C>
Loaded load(const std::string& folder, WeightStore& weights, const TensorGroup& tp) {
    const C config = C::from_json_file(folder + "/config.json");
    auto model = std::make_shared<const E>(config, weights, tp);
    Loaded out;
    out.model = model;
    out.forward = [e = model.get()](const at::Tensor& ids, const at::Tensor& mask) {
        return run(*e, ids, mask);
    };
    out.parameter_bytes = model->parameter_bytes();
    out.layers = layers_of(config);
    return out;
}

// `E` with a layer more than the folder's config, over `weights`.
template <class E, class C>
void load_deeper(const std::string& folder, WeightStore& weights) {
    C config = C::from_json_file(folder + "/config.json");
    add_layer(config);
    E encoder(config, weights);
}

struct EncoderRow {
    std::string name;
    std::string folder;           // under tests/data/golden, with its golden inputs in FOLDER.safetensors
    std::string ids, mask;        // the inputs' tensors (no mask: every position is real)
    std::string family;           // whose parallel spec splits it
    std::string component;        // its component in that family (the spec's unloaded tensors of it)
    std::size_t split_per_layer;  // the tensors the spec splits in each layer
    std::string refused_at_5;     // the refusal of a tensor-parallel degree of 5
    Loaded (*load)(const std::string& folder, WeightStore& weights, const TensorGroup& tp);
    void (*load_deeper)(const std::string& folder, WeightStore& weights);
    std::string missing;  // the first tensor of a layer more than the folder holds
};

const std::vector<EncoderRow> kEncoders = {
    // SD3's text_encoder_3: 4 heads and 48 features as 2, 2 and 24 or as 2, 1, 1 and 16 each; q, k,
    // v, o, wi_0, wi_1 and wo of every layer.
    {"T5", "t5_encoder", "input_ids", "", "sd3", "text_encoder_3", 7,
     "4 attention heads over a tensor-parallel degree of 5: a rank would hold none",
     &load<T5Encoder, T5Config>, &load_deeper<T5Encoder, T5Config>,
     "encoder.block.2.layer.0.layer_norm.weight"},
    // Qwen-Image's text_encoder (the vision tower's MLP matches the rules' suffixes, and is not
    // loaded): 4 key-value heads as 2, 2 and as 2, 1, 1; 96 features as 48 or 32 each; q, k, v
    // (weights and biases), o, gate, up and down of every layer. Left padding, under its mask.
    {"Qwen2.5-VL", "qwen2_encoder", "left.input_ids", "left.attention_mask", "qwen-image", "text_encoder", 10,
     "4 key-value heads over a tensor-parallel degree of 5", &load<Qwen2TextEncoder, Qwen2TextConfig>,
     &load_deeper<Qwen2TextEncoder, Qwen2TextConfig>, "model.layers.2.input_layernorm.weight"},
    // Z-Image's Qwen3Model (unprefixed names): q, k, v without biases, o, gate, up and down of every
    // layer; its per-head qk-norms whole. Right padding, under its mask.
    {"Qwen3", "qwen3_encoder", "z_image.input_ids", "z_image.attention_mask", "z-image", "text_encoder", 7,
     "Qwen3 text encoder: 4 key-value heads over a tensor-parallel degree of 5",
     &load<Qwen2TextEncoder, Qwen2TextConfig>, &load_deeper<Qwen2TextEncoder, Qwen2TextConfig>,
     "layers.3.input_layernorm.weight"},
};

// The tensors of `row`'s folder that its family's spec splits, less those the spec does not load.
std::set<std::string> split_by_spec(const EncoderRow& row) {
    const dp::strategies::ParallelSpec& spec = dp::strategies::family_spec(row.family);
    auto unloaded = [&](const std::string& tensor) {
        for (const auto& [component, prefix] : spec.unloaded_tensors)
            if (component == row.component && tensor.rfind(prefix, 0) == 0) return true;
        return false;
    };
    std::set<std::string> split;
    for (const auto& [tensor, count] : dp::strategies::safetensors_element_counts(golden_path(row.folder)))
        if (dp::strategies::tp_splits_tensor(spec, tensor) && !unloaded(tensor)) split.insert(tensor);
    return split;
}

}  // namespace

TEST_CASE(
    "text encoders over 2 and 3 tensor-parallel ranks (uneven heads) equal one process and keep their share "
    "of the split layers: T5, Qwen2.5-VL, Qwen3") {
    for (const EncoderRow& row : kEncoders) {
        CAPTURE(row.name);
        const std::string folder = golden_path(row.folder);
        const auto golden = SafetensorsFile::open(folder + ".safetensors");
        const at::Tensor ids = load_tensor(golden, row.ids, at::kLong);
        const at::Tensor mask = row.mask.empty() ? at::Tensor() : load_tensor(golden, row.mask, at::kLong);
        WeightStore whole_weights = WeightStore::open_folder(folder, at::kFloat, at::kCPU);
        const Loaded whole = row.load(folder, whole_weights, {});
        const at::Tensor expected = whole.forward(ids, mask);
        const std::set<std::string> split = split_by_spec(row);
        CHECK(split.size() == row.split_per_layer * static_cast<std::size_t>(whole.layers));
        for (const int tp : {2, 3}) {
            CAPTURE(tp);
            std::mutex m;
            std::vector<at::Tensor> got(static_cast<std::size_t>(tp));
            std::vector<int64_t> bytes(static_cast<std::size_t>(tp));
            std::vector<std::set<std::string>> sharded(static_cast<std::size_t>(tp));
            dp::test::run_ranks(tp, [&](int rank, Communicator& group) {
                WeightStore weights = WeightStore::open_folder(folder, at::kFloat, at::kCPU);
                const Loaded encoder = row.load(folder, weights, TensorGroup{&group, rank, tp});
                weights.check_all_taken();
                const at::Tensor out = encoder.forward(ids, mask);
                const std::lock_guard<std::mutex> lock(m);
                got[static_cast<std::size_t>(rank)] = out;
                bytes[static_cast<std::size_t>(rank)] = encoder.parameter_bytes;
                sharded[static_cast<std::size_t>(rank)] = weights.sharded();
            });
            for (int r = 0; r < tp; ++r) {
                CAPTURE(r);
                CHECK(masked_diff(got[static_cast<std::size_t>(r)], expected, mask) < 1e-5);
                CHECK(sharded[static_cast<std::size_t>(r)] == split);
                CHECK(bytes[static_cast<std::size_t>(r)] < whole.parameter_bytes);
            }
            if (tp == 3)
                CHECK(bytes[0] > bytes[1]);  // rank 0 keeps two heads (or GQA groups), the others one
        }
        WeightStore weights = WeightStore::open_folder(folder, at::kFloat, at::kCPU);
        CHECK_THROWS_WITH_AS(row.load(folder, weights, TensorGroup{nullptr, 0, 5}),
                             doctest::Contains(row.refused_at_5.c_str()), ModelError);
    }
}

TEST_CASE(
    "a text encoder's config of a layer more than its weights hold is refused naming that layer's first "
    "tensor") {
    for (const EncoderRow& row : kEncoders) {
        CAPTURE(row.name);
        WeightStore weights = WeightStore::open_folder(golden_path(row.folder), at::kFloat, at::kCPU);
        CHECK_THROWS_WITH_AS(row.load_deeper(golden_path(row.folder), weights),
                             doctest::Contains(row.missing.c_str()), ModelError);
    }
}
