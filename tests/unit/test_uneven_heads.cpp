// Tensor and Ulysses parallelism over head counts the degree does not divide (Note [uneven
// heads]: SD3.5-large's 38 heads over 4 or 8 ranks), with ranks as threads of this process: the
// communicator's unequal all-to-all and gather, attend() with uneven Ulysses heads, ParallelLinear
// split in blocks of a head's features, and the SD3 transformer with 5 heads under tp, Ulysses,
// both, and USP, each against one process.
#include "unit/doctest_torch.h"

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/io/weights.h"
#include "runtime/models/sd3/sd3_transformer.h"
#include "runtime/parallel/attention.h"
#include "runtime/parallel/communicator.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/parallel/parallel_linear.h"
#include "runtime/parallel/sequence_shard.h"
#include "strategies/mesh.h"
#include "unit/map_source.h"
#include "unit/ranks_as_threads.h"

using namespace dp::runtime;
using dp::strategies::Mesh;
using dp::strategies::MeshDegrees;
using dp::strategies::TpSplit;
using dp::test::MapSource;
using dp::test::mesh_of;
using dp::test::Worst;

TEST_CASE(
    "all_to_all with unequal splits and all_gather of unequal blocks deliver every row, counting bytes") {
    // Rank r holds rows valued 100 r + i and sends r + 1 rows to each rank (rank j's block:
    // 100 r + j (r + 1) ...); so rank j receives r + 1 rows from each r.
    const int world = 3;
    dp::test::run_ranks(world, [&](int rank, Communicator& group) {
        const int64_t per = rank + 1;
        const at::Tensor mine =
            (at::arange(per * world, at::kFloat) + 100 * rank).view({per * world, 1}).expand({-1, 2});
        std::vector<int64_t> send(world, per), receive;
        for (int r = 0; r < world; ++r) receive.push_back(r + 1);
        const at::Tensor got = group.all_to_all(mine, send, receive);
        std::vector<at::Tensor> want;
        for (int r = 0; r < world; ++r)
            want.push_back(
                (at::arange(r + 1, at::kFloat) + rank * (r + 1) + 100 * r).view({r + 1, 1}).expand({-1, 2}));
        if (!at::equal(got, at::cat(want, 0)))
            throw std::runtime_error("rank " + std::to_string(rank) + ": wrong rows");
        if (group.bytes().at("all_to_all") != static_cast<uint64_t>(per * world * 2 * 4))
            throw std::runtime_error("all_to_all bytes are not the rows this rank sent");
        // Uneven gather: rank r holds r + 1 rows; on the wire each is padded to 3.
        const at::Tensor block = at::full({per, 2}, static_cast<double>(rank), at::kFloat);
        const std::vector<at::Tensor> blocks = group.all_gather(block, {1, 2, 3});
        for (int r = 0; r < world; ++r)
            if (!at::equal(blocks[static_cast<std::size_t>(r)],
                           at::full({r + 1, 2}, static_cast<double>(r), at::kFloat)))
                throw std::runtime_error("rank " + std::to_string(rank) + ": wrong block from rank " +
                                         std::to_string(r));
        if (group.bytes().at("all_gather") != 3 * 2 * 4)
            throw std::runtime_error("all_gather bytes are not the padded block");
        bool refused = false;
        try {
            group.all_to_all(mine, {1, 1}, {1, 1});
        } catch (const InternalError&) {
            refused = true;
        }
        if (!refused) throw std::runtime_error("split sizes for the wrong number of ranks were accepted");
    });
}

namespace {

using dp::test::Second;

// attend() over ring x ulysses ranks with `heads` heads against whole-sequence attention.
double uneven_attend_difference(int64_t heads, int ulysses, int ring, Second second) {
    const int64_t batch = 2, tokens = 11, head_dim = 4, text = 6;
    const at::Tensor q = seeded({batch, heads, tokens, head_dim}, 21),
                     k = seeded({batch, heads, tokens, head_dim}, 22),
                     v = seeded({batch, heads, tokens, head_dim}, 23);
    const at::Tensor q2 = seeded({batch, heads, text, head_dim}, 24),
                     k2 = seeded({batch, heads, text, head_dim}, 25),
                     v2 = seeded({batch, heads, text, head_dim}, 26);
    at::Tensor bias2 = at::zeros({1, text});
    bias2[0][text - 1] = std::log(5.0);  // a tail standing for 5 copies
    at::Tensor expected;
    if (second == Second::kNone) {
        expected = at::scaled_dot_product_attention(q, k, v);
    } else {
        const at::Tensor bias = at::cat({at::zeros({1, tokens}), bias2}, 1).view({1, 1, 1, -1});
        expected = at::scaled_dot_product_attention(at::cat({q, q2}, 2), at::cat({k, k2}, 2),
                                                    at::cat({v, v2}, 2), bias);
    }
    const at::Tensor none;
    return dp::test::attend_on_ranks({q, k, v, q2, k2, v2, second == Second::kNone ? none : bias2}, second,
                                     ulysses, ring, expected);
}

}  // namespace

TEST_CASE(
    "attend() with Ulysses heads that do not divide (5 over 2 and 3, 3 over 2, USP) equals one attention") {
    struct Case {
        int64_t heads;
        int ulysses, ring;
    };
    for (const Case& c : std::vector<Case>{{5, 2, 1}, {5, 3, 1}, {3, 2, 1}, {5, 4, 1}, {5, 2, 2}, {3, 2, 2}})
        for (Second second : {Second::kNone, Second::kReplicated, Second::kSplit}) {
            CAPTURE(c.heads);
            CAPTURE(c.ulysses);
            CAPTURE(c.ring);
            CAPTURE(static_cast<int>(second));
            CHECK(uneven_attend_difference(c.heads, c.ulysses, c.ring, second) < 1e-5);
        }
    // More Ulysses ranks than heads would leave a rank with none.
    CHECK_THROWS_WITH_AS(uneven_attend_difference(2, 3, 1, Second::kNone),
                         doctest::Contains("--ulysses may be at most 2"), ModelError);
}

namespace {

// A column-parallel layer followed by a row-parallel one over the same blocks of `unit` features
// (q then attention-out, MLP-in then MLP-out) on `tp` ranks, against both whole. Also checks
// that each rank's column shard holds its even share of the blocks.
double column_row_difference(int64_t blocks, int64_t unit, int tp,
                             const std::vector<int64_t>& segments = {}) {
    const int64_t width = blocks * unit, outer = 7;
    MapSource source;
    source.tensors["a.weight"] = seeded({width, outer}, 31);
    source.tensors["a.bias"] = seeded({width}, 32);
    const int64_t row_in = segments.empty() ? width : width * static_cast<int64_t>(segments.size());
    source.tensors["b.weight"] = seeded({outer, row_in}, 33);
    source.tensors["b.bias"] = seeded({outer}, 34);
    const at::Tensor x = seeded({2, 3, outer}, 35);
    const at::Tensor hidden = at::linear(x, source.tensors["a.weight"], source.tensors["a.bias"]);
    const at::Tensor row_input =
        segments.empty() ? hidden : at::cat(std::vector<at::Tensor>(segments.size(), hidden), -1);
    const at::Tensor expected = at::linear(row_input, source.tensors["b.weight"], source.tensors["b.bias"]);
    const std::vector<int64_t> shares = dp::strategies::even_shares(blocks, tp);
    const dp::strategies::TpRule column{".a", TpSplit::kColumn, {}};
    const dp::strategies::TpRule row{".b", segments.empty() ? TpSplit::kRow : TpSplit::kRowSegments,
                                     segments};
    Worst worst;
    dp::test::run_ranks(tp, [&](int rank, Communicator& group) {
        MapSource mine = source;
        const TensorGroup g{&group, rank, tp};
        const ParallelLinear a = ParallelLinear::load(mine, "a", outer, width, column, g, true, unit);
        const ParallelLinear b = ParallelLinear::load(mine, "b", row_in, outer, row, g, true, unit);
        if (a.weight().size(0) != shares[static_cast<std::size_t>(rank)] * unit)
            throw std::runtime_error("rank " + std::to_string(rank) + " holds " +
                                     std::to_string(a.weight().size(0)) + " features, not its share");
        const at::Tensor part = a(x);
        const at::Tensor in =
            segments.empty() ? part : at::cat(std::vector<at::Tensor>(segments.size(), part), -1);
        worst.add(
            std::max(max_diff(part, hidden.narrow(-1, g.share_start(blocks) * unit, g.share(blocks) * unit)),
                     max_diff(b(in), expected)));
    });
    return worst.value();
}

}  // namespace

TEST_CASE(
    "ParallelLinear splits in blocks of a head's features as evenly as possible, equal to whole layers") {
    for (int tp : {2, 3, 4}) {
        CAPTURE(tp);
        CHECK(column_row_difference(5, 4, tp) < 1e-4);          // 5 heads of 4 features
        CHECK(column_row_difference(38, 2, tp) < 1e-4);         // SD3.5-large's 38 heads
        CHECK(column_row_difference(10, 1, tp) < 1e-4);         // an MLP width that does not divide
        CHECK(column_row_difference(5, 4, tp, {1, 1}) < 1e-4);  // row over segments, each split the same
    }
    MapSource source = dp::test::seeded_layer_l();
    // Without a unit the features must still divide; with one they must be whole blocks, and
    // every rank must keep at least one.
    CHECK_THROWS_WITH_AS(
        ParallelLinear::load(source, "l", 10, 12, {".l", TpSplit::kRow, {}}, {nullptr, 0, 3}),
        doctest::Contains("do not divide by the tensor-parallel degree 3"), ModelError);
    CHECK_THROWS_WITH_AS(
        ParallelLinear::load(source, "l", 10, 12, {".l", TpSplit::kRow, {}}, {nullptr, 0, 3}, true, 4),
        doctest::Contains("l: 10 input features are not whole blocks of 4"), ModelError);
    CHECK_THROWS_WITH_AS(
        ParallelLinear::load(source, "l", 10, 12, {".l", TpSplit::kColumn, {}}, {nullptr, 0, 4}, true, 4),
        doctest::Contains(
            "l: 3 blocks of 4 output features over the tensor-parallel degree 4 would leave a rank with "
            "none (--tp may be at most 3)"),
        ModelError);
    // 10 input features over 3 in blocks of 1: 4, 3, 3.
    const ParallelLinear last =
        ParallelLinear::load(source, "l", 10, 12, {".l", TpSplit::kRow, {}}, {nullptr, 2, 3}, true, 1);
    CHECK(at::equal(last.weight(), source.tensors["l.weight"].narrow(1, 7, 3)));
}

namespace {

// A small SD3.5-style transformer with 5 heads of 12 (width 60; MLP 240, which tp 2 and 3
// divide), RMS qk-norm, and a dual-attention first block.
Sd3TransformerConfig five_heads() {
    return Sd3TransformerConfig::from_json_text(R"({
        "num_attention_heads": 5, "attention_head_dim": 12, "caption_projection_dim": 60,
        "num_layers": 3, "dual_attention_layers": [0], "qk_norm": "rms_norm",
        "in_channels": 4, "out_channels": 4, "patch_size": 2, "sample_size": 8, "pos_embed_max_size": 8,
        "joint_attention_dim": 24, "pooled_projection_dim": 16})",
                                                "five_heads.json");
}

// The five-head model's weights, matrices drawn at 4 x the random store's N(0, 0.02): at that
// scale the attention logits are far from 0, so a head attended with another head's queries or
// keys changes the output (near uniform attention would hide it). In a folder every rank opens.
class FiveHeadWeights {
  public:
    FiveHeadWeights() {
        char name[] = "/tmp/dp_uneven_heads_XXXXXX";
        if (mkdtemp(name) == nullptr) throw std::runtime_error("mkdtemp failed");
        dir_ = name;
        WeightStore random = WeightStore::random(5, at::kFloat, at::kCPU);
        random.keep_as_parameters();
        const Sd3Transformer model(five_heads(), random);
        std::vector<std::pair<std::string, at::Tensor>> tensors;
        for (const auto& [tensor, values] : random.parameters())
            tensors.emplace_back(tensor, values.detach() * (values.dim() >= 2 ? 4.0 : 1.0));
        save_safetensors(dir_ + "/diffusion_pytorch_model.safetensors", tensors);
    }
    ~FiveHeadWeights() { std::filesystem::remove_all(dir_); }
    FiveHeadWeights(const FiveHeadWeights&) = delete;
    FiveHeadWeights& operator=(const FiveHeadWeights&) = delete;
    WeightStore open() const { return WeightStore::open_folder(dir_, at::kFloat, at::kCPU); }

  private:
    std::string dir_;
};

struct TransformerInputs {
    at::Tensor latents = seeded({2, 4, 6, 10}, 41), text = seeded({2, 7, 24}, 42),
               pooled = seeded({2, 16}, 43), t = at::tensor({700.0, 250.0}, at::kFloat);
    int64_t tail = 3;  // the last text token stands for 3
};

// The transformer under `degrees` (tp, ulysses, ring) on ranks as threads, against `expected`
// (one process on the same weights). Returns the largest difference over ranks.
double transformer_difference(const FiveHeadWeights& weights, const MeshDegrees& degrees,
                              const at::Tensor& expected) {
    const Sd3TransformerConfig config = five_heads();
    const TransformerInputs in;
    const int world = degrees.product();
    Worst worst;
    dp::test::run_ranks(world, [&](int, Communicator& group) {
        const ParallelContext parallel(group, Mesh(world, degrees));
        WeightStore mine = weights.open();
        const Sd3Transformer model(config, mine, parallel);
        mine.check_all_taken();
        worst.add(max_diff(model.forward(in.latents, in.text, in.pooled, in.t, in.tail), expected));
    });
    return worst.value();
}

}  // namespace

TEST_CASE(
    "the SD3 transformer with 5 heads under tp2, tp3, ulysses2, ulysses3, tp2 x ulysses2 and USP equals one "
    "process") {
    const FiveHeadWeights weights;
    const TransformerInputs in;
    WeightStore whole = weights.open();
    const Sd3Transformer alone(five_heads(), whole);
    whole.check_all_taken();
    const at::Tensor expected = alone.forward(in.latents, in.text, in.pooled, in.t, in.tail);
    // Attention matters at this scale: counting the text tail once instead of 3 times moves the
    // output by far more than the tolerance.
    const double tolerance = 1e-4;
    const double attention_signal =
        max_diff(expected, alone.forward(in.latents, in.text, in.pooled, in.t, 1));
    MESSAGE("one process: max |output| " << expected.abs().max().item<double>()
                                         << ", the tail counted once moves it by " << attention_signal);
    CHECK(attention_signal > 100 * tolerance);
    for (const auto& [tp, ulysses, ring] : std::vector<std::tuple<int, int, int>>{
             {2, 1, 1}, {3, 1, 1}, {1, 2, 1}, {1, 3, 1}, {2, 2, 1}, {1, 2, 2}}) {
        CAPTURE(tp);
        CAPTURE(ulysses);
        CAPTURE(ring);
        const double diff = transformer_difference(weights, mesh_of(tp, ulysses, ring), expected);
        MESSAGE("tp " << tp << " x ulysses " << ulysses << " x ring " << ring << ": max |diff| " << diff);
        CHECK(diff < tolerance);
    }
}

TEST_CASE(
    "the SD3 transformer's tp shards hold each rank's share of the heads, and refuse a rank without any") {
    const Sd3TransformerConfig config = five_heads();
    const int64_t hd = config.attention_head_dim, d = config.inner_dim();
    // Bytes of one head's attention parameters over the blocks, from the config alone: q, k, v of
    // both streams (weights and biases) column-parallel, the outputs' weights row-parallel (no
    // text output in the last block), attn2's q, k, v and output in the dual-attention block.
    const int64_t column = hd * d + hd, row = d * hd;
    const int64_t per_head = 4 * ((6 * column + 2 * row) + (3 * column + row) +  // block 0, with attn2
                                  (6 * column + 2 * row) +                       // block 1
                                  (6 * column + row));                           // block 2, context-pre-only
    for (int tp : {2, 3, 4, 5}) {
        CAPTURE(tp);
        const std::vector<int64_t> shares = dp::strategies::even_shares(config.num_attention_heads, tp);
        std::vector<int64_t> bytes;
        for (int rank = 0; rank < tp; ++rank) {
            const ParallelContext parallel = dp::test::tensor_parallel_rank(rank, tp);
            WeightStore weights = WeightStore::random(5, at::kFloat, at::kCPU);
            bytes.push_back(Sd3Transformer(config, weights, parallel).parameter_bytes());
        }
        // The MLPs split evenly (240 features divide by 2 to 5), so ranks differ by their heads alone.
        for (int rank = 1; rank < tp; ++rank)
            CHECK(bytes[0] - bytes[static_cast<std::size_t>(rank)] ==
                  (shares[0] - shares[static_cast<std::size_t>(rank)]) * per_head);
        if (tp < 5)
            CHECK(shares.front() > shares.back());  // 5 heads do not divide by 2 to 4
        else
            CHECK(shares.front() == shares.back());
    }
    const ParallelContext parallel = dp::test::tensor_parallel_rank(5, 6);
    WeightStore weights = WeightStore::random(5, at::kFloat, at::kCPU);
    CHECK_THROWS_WITH_AS(Sd3Transformer(config, weights, parallel), doctest::Contains("5 attention heads"),
                         ModelError);
}
