// The shared parallel layer (runtime/parallel/) against whole-sequence and whole-weight math, with
// ranks as threads of this process over an in-process c10d store: attend() for Ulysses, Ring and
// both (USP) over 2, 3 and 4 ranks; ParallelLinear's column, row and segmented splits; guidance
// split over a cfg group; and the loader's shards against SD3's parallel spec.
#include "unit/doctest_torch.h"

#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <ATen/Parallel.h>

#include "runtime/io/errors.h"
#include "runtime/io/weights.h"
#include "runtime/models/sd3/sd3_transformer.h"
#include "runtime/parallel/attention.h"
#include "runtime/parallel/communicator.h"
#include "runtime/parallel/cpu_attention.h"
#include "runtime/parallel/dense_linear.h"
#include "runtime/parallel/guidance.h"
#include "runtime/parallel/kernel_time.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/parallel/parallel_linear.h"
#include "runtime/parallel/sequence_shard.h"
#include "strategies/cpu_dtype.h"
#include "strategies/family.h"
#include "strategies/model_sizes.h"
#include "strategies/parallel_spec.h"
#include "unit/map_source.h"
#include "unit/ranks_as_threads.h"

using namespace dp::runtime;
using dp::strategies::Mesh;
using dp::strategies::MeshDegrees;
using dp::test::MapSource;

namespace {

using dp::test::Second;

struct AttendCase {
    int ulysses, ring;
    Second second;
    int64_t head_dim = 8;  // 64: the CPU kernel's size (Note [attention on the CPU]), where it runs
};

// Whole-sequence attention over [first; second] with the second stream's key bias.
at::Tensor reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& q2,
                     const at::Tensor& k2, const at::Tensor& v2, const at::Tensor& bias2) {
    if (!q2.defined()) return at::scaled_dot_product_attention(q, k, v);
    const int64_t b = q.size(0), n = q.size(2);
    at::Tensor bias = at::cat({at::zeros({b, n}), bias2.expand({b, bias2.size(1)})}, 1).view({b, 1, 1, -1});
    return at::scaled_dot_product_attention(at::cat({q, q2}, 2), at::cat({k, k2}, 2), at::cat({v, v2}, 2),
                                            bias);
}

// Runs attend() on every rank of a ring x ulysses mesh and compares each rank's gathered outputs
// with whole-sequence attention. Returns the largest difference over ranks and streams.
double attend_difference(const AttendCase& c, bool drop_bias = false) {
    const int64_t batch = 2, heads = 12, tokens = 13, head_dim = c.head_dim,
                  text = c.second == Second::kSplit ? 7 : 5;
    const at::Tensor q = seeded({batch, heads, tokens, head_dim}, 1),
                     k = seeded({batch, heads, tokens, head_dim}, 2),
                     v = seeded({batch, heads, tokens, head_dim}, 3);
    at::Tensor q2, k2, v2, bias2;
    if (c.second != Second::kNone) {
        q2 = seeded({batch, heads, text, head_dim}, 4);
        k2 = seeded({batch, heads, text, head_dim}, 5);
        v2 = seeded({batch, heads, text, head_dim}, 6);
        if (c.second == Second::kReplicated) {  // a tail standing for 7 copies, and a masked key
            bias2 = at::zeros({1, text});
            bias2[0][text - 1] = std::log(7.0);
            bias2[0][1] = -INFINITY;
        } else {  // a key padding mask per prompt, and one biased key
            bias2 = at::zeros({batch, text});
            bias2[0][text - 1] = -INFINITY;
            bias2[1][0] = -INFINITY;
            bias2[1][3] = 0.5;
        }
    }
    const at::Tensor expected = reference(q, k, v, q2, k2, v2, bias2);
    return dp::test::attend_on_ranks({q, k, v, q2, k2, v2, drop_bias ? at::Tensor() : bias2}, c.second,
                                     c.ulysses, c.ring, expected);
}

}  // namespace

TEST_CASE(
    "attend() over 2, 3 and 4 ranks equals whole-sequence attention: Ulysses, Ring and USP, head sizes 8 and "
    "64") {
    for (const int64_t head_dim : {8, 64})
        for (Second second : {Second::kNone, Second::kReplicated, Second::kSplit})
            for (const auto& [u, r] :
                 std::vector<std::pair<int, int>>{{2, 1}, {3, 1}, {4, 1}, {1, 2}, {1, 3}, {1, 4}, {2, 2}}) {
                CAPTURE(u);
                CAPTURE(r);
                CAPTURE(head_dim);
                CAPTURE(static_cast<int>(second));
                // 13 image tokens never divide by the ranks, so the padding is always exercised.
                CHECK(attend_difference({u, r, second, head_dim}) < 1e-5);
            }
}

TEST_CASE("attend() applies the second stream's key bias: without it the result differs") {
    for (Second second : {Second::kReplicated, Second::kSplit}) {
        CAPTURE(static_cast<int>(second));
        CHECK(attend_difference({2, 1, second}, /*drop_bias=*/true) > 1e-3);
        CHECK(attend_difference({1, 2, second}, /*drop_bias=*/true) > 1e-3);
    }
}

namespace {

// A ring segment whose keys are all masked for one prompt: 2 image tokens over the ranks leave the
// last ring segment's image block all padding, and the bias masks that segment's text keys (text
// tokens 4 and 5, the last segment at ring 3 and at ring 2 x Ulysses 2) for prompt 0. Runs attend()
// in `dtype` and returns the largest difference from whole-sequence attention in fp32 (infinite
// when any output is not finite).
double masked_segment_difference(int ulysses, int ring, at::ScalarType dtype) {
    const int64_t batch = 2, heads = 4, tokens = 2, text = 6, head_dim = 8;
    const at::Tensor q = seeded({batch, heads, tokens, head_dim}, 21),
                     k = seeded({batch, heads, tokens, head_dim}, 22),
                     v = seeded({batch, heads, tokens, head_dim}, 23),
                     q2 = seeded({batch, heads, text, head_dim}, 24),
                     k2 = seeded({batch, heads, text, head_dim}, 25),
                     v2 = seeded({batch, heads, text, head_dim}, 26);
    at::Tensor bias2 = at::zeros({batch, text});
    bias2[0][4] = -INFINITY;
    bias2[0][5] = -INFINITY;
    bias2[1][1] = -INFINITY;
    const at::Tensor expected = reference(q, k, v, q2, k2, v2, bias2);
    MeshDegrees degrees;
    degrees.ring = ring;
    degrees.ulysses = ulysses;
    const int world = ring * ulysses;
    std::mutex m;
    double worst = 0;
    dp::test::run_ranks(world, [&](int, Communicator& group) {
        const ParallelContext parallel(group, Mesh(world, degrees));
        const SequenceShard image(tokens, parallel.sequence()), words(text, parallel.sequence());
        AttentionInputs in;
        in.q = image.shard(q, 2).to(dtype), in.k = image.shard(k, 2).to(dtype),
        in.v = image.shard(v, 2).to(dtype);
        in.shard = &image;
        in.q2 = words.shard(q2, 2).to(dtype), in.k2 = words.shard(k2, 2).to(dtype),
        in.v2 = words.shard(v2, 2).to(dtype);
        in.shard2 = &words;
        in.bias2 = bias2;
        const AttentionOutputs out = attend(in);
        const at::Tensor got =
            at::cat({image.gather(out.out, 2), words.gather(out.out2, 2)}, 2).to(at::kFloat);
        const double diff = at::isfinite(got).all().item<bool>() ? max_diff(got, expected) : INFINITY;
        const std::lock_guard<std::mutex> lock(m);
        worst = std::max(worst, diff);
    });
    return worst;
}

}  // namespace

TEST_CASE(
    "attend() with a ring segment whose keys are all masked for a prompt: finite, and equal to one rank") {
    for (const auto& [u, r] : std::vector<std::pair<int, int>>{{1, 3}, {2, 2}, {3, 1}, {1, 1}}) {
        CAPTURE(u);
        CAPTURE(r);
        CHECK(masked_segment_difference(u, r, at::kFloat) < 1e-5);
        CHECK(masked_segment_difference(u, r, at::kBFloat16) < 5e-2);
    }
}

TEST_CASE("SequenceShard pads, splits and gathers any length, and splits rotary ids like tokens") {
    const auto rank_body = [](int rank, Communicator& group) {
        MeshDegrees degrees;
        degrees.ring = 3;
        const ParallelContext parallel(group, Mesh(3, degrees));
        const SequenceShard shard(7, parallel.sequence());  // 7 tokens over 3 ranks: padded to 9
        if (shard.padded() != 9 || shard.local() != 3) throw std::runtime_error("wrong padding");
        const at::Tensor x = at::arange(14, at::kFloat).view({1, 7, 2});
        const at::Tensor mine = shard.shard(x);
        if (!at::equal(mine, at::constant_pad_nd(x, {0, 0, 0, 2}).narrow(1, 3 * rank, 3)))
            throw std::runtime_error("rank " + std::to_string(rank) + " holds the wrong block");
        if (!at::equal(shard.gather(mine), x))
            throw std::runtime_error("gather does not give the whole back");
        const at::Tensor ids = at::arange(21, at::kLong).view({7, 3});  // [tokens, axes]
        if (!at::equal(shard.shard(ids, 0), at::constant_pad_nd(ids, {0, 0, 0, 2}).narrow(0, 3 * rank, 3)))
            throw std::runtime_error("rotary ids are not split like the tokens");
        const at::Tensor real = shard.real_tokens(6, 3, at::kCPU);
        if (!at::equal(real, at::tensor({1, 0, 0}, at::kLong).to(at::kBool)))
            throw std::runtime_error("wrong real-token mask");
    };
    CHECK_NOTHROW(dp::test::run_ranks(3, rank_body));
}

namespace {

// Rank `rank`'s slice of each of `segments` (relative widths) of `x`'s last dimension, in order.
at::Tensor segment_slices(const at::Tensor& x, const std::vector<int64_t>& segments, int rank, int tp) {
    std::vector<at::Tensor> parts;
    int64_t begin = 0, units = 0;
    for (int64_t s : segments) units += s;
    for (int64_t s : segments) {
        const int64_t width = x.size(-1) / units * s;
        parts.push_back(x.narrow(-1, begin + rank * width / tp, width / tp));
        begin += width;
    }
    return at::cat(parts, -1);
}

// Each rank's output of `layer` over `tp` ranks against at::linear on the whole weight.
// `naive_input`: a segmented layer fed one contiguous slice of the input, as a plain row split would.
double linear_difference(dp::strategies::TpSplit split, std::vector<int64_t> segments, int tp,
                         bool naive_input = false) {
    const int64_t in = 18, out = 12;
    MapSource source;
    source.tensors["l.weight"] = seeded({out, in}, 7);
    source.tensors["l.bias"] = seeded({out}, 8);
    const at::Tensor x = seeded({3, 4, in}, 9);
    const at::Tensor expected = at::linear(x, source.tensors["l.weight"], source.tensors["l.bias"]);
    const dp::strategies::TpRule rule{".l", split, segments};
    std::mutex m;
    double worst = 0;
    dp::test::run_ranks(tp, [&](int rank, Communicator& group) {
        MapSource mine = source;
        const ParallelLinear layer = ParallelLinear::load(mine, "l", in, out, rule, {&group, rank, tp});
        at::Tensor input = x, want = expected;
        if (split == dp::strategies::TpSplit::kColumn) want = expected.narrow(-1, rank * out / tp, out / tp);
        if (split == dp::strategies::TpSplit::kColumnSegments)
            want = segment_slices(expected, segments, rank, tp);
        if (split == dp::strategies::TpSplit::kRow || naive_input)
            input = x.narrow(-1, rank * in / tp, in / tp);
        if (split == dp::strategies::TpSplit::kRowSegments && !naive_input)
            input = segment_slices(x, segments, rank, tp);
        const double diff = max_diff(layer(input), want);
        const std::lock_guard<std::mutex> lock(m);
        worst = std::max(worst, diff);
    });
    return worst;
}

}  // namespace

TEST_CASE(
    "ParallelLinear column, row and segmented splits (of the input and of the output) equal at::linear on "
    "the whole weight") {
    using dp::strategies::TpSplit;
    for (int tp : {2, 3}) {
        CAPTURE(tp);
        CHECK(linear_difference(TpSplit::kColumn, {}, tp) < 1e-5);
        CHECK(linear_difference(TpSplit::kRow, {}, tp) < 1e-5);
        CHECK(linear_difference(TpSplit::kRowSegments, {1, 2}, tp) < 1e-5);
        CHECK(linear_difference(TpSplit::kColumnSegments, {1, 1}, tp) < 1e-5);  // a fused q and k by heads
    }
    // Splitting a segmented input as if it were one segment gives another answer.
    CHECK(linear_difference(TpSplit::kRowSegments, {1, 2}, 2, /*naive_input=*/true) > 1e-3);
    MapSource source = dp::test::seeded_layer_l();
    CHECK_THROWS_WITH_AS(
        ParallelLinear::load(source, "l", 10, 12, {".l", TpSplit::kRow, {}}, {nullptr, 0, 3}),
        doctest::Contains("do not divide by the tensor-parallel degree 3"), ModelError);
}

// Note [int8 compute]: the integer products are exact, so int8 is what its definition says to
// float rounding; a token split changes nothing; tp reduces the scales and gives one process's.
TEST_CASE(
    "int8 products: per-token and per-channel int8 by definition, equal under a token split and under "
    "tp's column and row splits") {
    using dp::strategies::TpSplit;
    const int64_t in = 64, out = 48;
    MapSource source;
    source.int8 = true;
    source.tensors["l.weight"] = seeded({out, in}, 11);
    source.tensors["l.bias"] = seeded({out}, 12);
    const at::Tensor x = seeded({2, 9, in}, 13) * 3;
    MapSource mine = source;
    const ParallelLinear whole =
        ParallelLinear::load(mine, "l", in, out, {".l", TpSplit::kWhole, {}}, {nullptr, 0, 1});
    REQUIRE(whole.int8());
    const at::Tensor y = whole(x);
    // The definition: each token's absolute maximum over 127 and each channel's over 63 (the CPU's
    // 7-bit weights), rounded to even: the integer sums exact, so equal to float rounding.
    const at::Tensor w = source.tensors["l.weight"];
    const at::Tensor ws = w.abs().amax(1) / 63, xs = x.abs().amax(-1, true) / 127;
    const at::Tensor wq = at::round(w / ws.unsqueeze(1)), xq = at::round(x / xs);
    const at::Tensor expected =
        at::matmul(xq.to(at::kDouble), wq.to(at::kDouble).t()) * xs.to(at::kDouble) * ws.to(at::kDouble) +
        source.tensors["l.bias"].to(at::kDouble);
    CHECK(max_diff(y.to(at::kDouble), expected) < 1e-4);
    // The same bits from a slice of a wider buffer (ATen's quantization, not the one-pass kernel),
    // and the definition for tokens at their maximum everywhere (every int8 value +-127).
    CHECK(at::equal(whole(at::cat({x, seeded({2, 9, 5}, 14)}, -1).narrow(-1, 0, in)), y));
    const at::Tensor flat = at::cat({at::full({1, 1, in}, 2.5), at::full({1, 1, in}, -0.5)}, 1);
    const at::Tensor flat_expected =
        at::matmul(at::full({1, 2, in}, 127.0, at::kDouble), wq.to(at::kDouble).t()) *
            at::tensor({2.5 / 127, -0.5 / 127}, at::kDouble).view({1, 2, 1}) * ws.to(at::kDouble) +
        source.tensors["l.bias"].to(at::kDouble);
    CHECK(max_diff(whole(flat).to(at::kDouble), flat_expected) < 1e-4);
    // Near the float product, far from equal to it (int8's cost), and its weight dequantized.
    const at::Tensor fp32 = at::linear(x, w, source.tensors["l.bias"]);
    CHECK(max_diff(y, fp32) < 0.05 * fp32.abs().max().item<double>());
    CHECK(max_diff(y, fp32) > 1e-5);
    CHECK(max_diff(whole.weight(), w) <= ws.max().item<double>() / 2 + 1e-6);
    // A token split (Ulysses, Ring): each token's output is the same bits.
    CHECK(at::equal(whole(x.narrow(1, 0, 4)), y.narrow(1, 0, 4)));
    CHECK(at::equal(whole(x.narrow(1, 4, 5)), y.narrow(1, 4, 5)));
    // tp 2 and 3: column-parallel ranks give their slice exactly; row-parallel ranks reduce the token
    // and channel maxima, so they sum one process's integers (only the float sum's order differs).
    for (int tp : {2, 3}) {
        for (TpSplit split : {TpSplit::kColumn, TpSplit::kRow}) {
            CAPTURE(tp);
            const int64_t per_in = split == TpSplit::kRow ? in / tp : in;
            if (split == TpSplit::kRow && in % tp != 0) continue;
            if (split == TpSplit::kColumn && out % tp != 0) continue;
            std::mutex m;
            double worst = 0;
            dp::test::run_ranks(tp, [&](int rank, Communicator& group) {
                MapSource shard = source;
                const ParallelLinear layer =
                    ParallelLinear::load(shard, "l", in, out, {".l", split, {}}, {&group, rank, tp});
                const at::Tensor got =
                    layer(split == TpSplit::kRow ? x.narrow(-1, rank * per_in, per_in).contiguous() : x);
                const at::Tensor want =
                    split == TpSplit::kColumn ? y.narrow(-1, rank * out / tp, out / tp) : y;
                const std::lock_guard<std::mutex> lock(m);
                worst = std::max(worst, max_diff(got, want));
            });
            CHECK(worst <= 2e-6 * y.abs().max().item<double>());
        }
    }
}

TEST_CASE("a tensor-parallel shard is narrowed before it is converted: only the shard is resident") {
    const std::string dir = golden_path("sd3_transformer");
    WeightStore weights = WeightStore::open_folder(dir, at::kBFloat16, at::kCPU);
    WeightStore whole = WeightStore::open_folder(dir, at::kBFloat16, at::kCPU);
    const std::string name = "transformer_blocks.0.attn.to_q.weight";
    const at::Tensor full = whole.take(name, {32, 32});
    for (int64_t dim : {0, 1}) {
        CAPTURE(dim);
        const at::Tensor shard = weights.take_shard(name, {32, 32}, dim, 8, 8);
        CHECK(shard.dtype() == at::kBFloat16);
        CHECK(at::equal(shard, full.narrow(dim, 8, 8)));
        CHECK(shard.storage().nbytes() == static_cast<std::size_t>(8 * 32 * 2));
    }
    CHECK_THROWS_AS(weights.take_shard(name, {32, 32}, 0, 30, 8), InternalError);
    CHECK(weights.sharded() == std::set<std::string>{name});
}

TEST_CASE("SD3's parallel spec names exactly the tensors its loader shards") {
    const dp::strategies::ParallelSpec& spec = dp::strategies::family_spec("sd3");
    for (const std::string name : {"sd3_transformer", "sd3_transformer_qknorm"}) {
        CAPTURE(name);
        const std::string dir = golden_path(name);
        std::set<std::string> expected;
        for (const auto& [tensor, count] : dp::strategies::safetensors_element_counts(dir))
            if (dp::strategies::tp_splits_tensor(spec, tensor)) expected.insert(tensor);
        MeshDegrees degrees;
        degrees.tp = 2;
        const ParallelContext parallel =
            ParallelContext::from_groups(Mesh(2, degrees), 1, nullptr, nullptr, nullptr, nullptr);
        WeightStore weights = WeightStore::open_folder(dir, at::kFloat, at::kCPU);
        const Sd3Transformer shard(Sd3TransformerConfig::from_json_file(dir + "/config.json"), weights,
                                   parallel);
        weights.check_all_taken();
        CHECK(!expected.empty());
        CHECK(weights.sharded() == expected);
    }
}

TEST_CASE(
    "guidance's prediction: one call per branch on the CPU, one batched call elsewhere, the same rows") {
    const at::Tensor rows = seeded({4, 3}, 13);  // [negative; positive], two prompts each
    std::vector<std::pair<int64_t, int64_t>> calls;
    const Guidance::Model model = [&](int64_t first, int64_t count) {
        calls.emplace_back(first, count);
        return rows.narrow(0, first, count) * 2;
    };
    const at::Tensor on_cpu = Guidance(true, nullptr).predict(4, true, model);
    CHECK(calls == std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 2}});
    CHECK(at::equal(on_cpu, rows * 2));
    calls.clear();
    CHECK(at::equal(Guidance(true, nullptr).predict(4, false, model), rows * 2));  // a GPU: batched
    CHECK(calls == std::vector<std::pair<int64_t, int64_t>>{{0, 4}});
    calls.clear();
    Guidance(false, nullptr).predict(2, true, model);  // no negative branch: one call
    CHECK(calls == std::vector<std::pair<int64_t, int64_t>>{{0, 2}});
}

TEST_CASE("guidance split over a cfg group equals both branches as one batch") {
    const at::Tensor negative = seeded({2, 4, 3, 3}, 11), positive = seeded({2, 4, 3, 3}, 12);
    const Guidance::Combine rule = [](const at::Tensor& n, const at::Tensor& p) {
        return linear_guidance(n, p, 4.5);
    };
    const at::Tensor batched = Guidance(true, nullptr).combine(at::cat({negative, positive}, 0), rule);
    CHECK(max_diff(batched, negative + 4.5 * (positive - negative)) < 1e-6);
    std::mutex m;
    std::vector<at::Tensor> got(2);
    dp::test::run_ranks(2, [&](int rank, Communicator& group) {
        const Guidance g(true, &group);
        if (!g.split() || g.runs_negative_only() != (rank == 0)) throw std::runtime_error("wrong branch");
        if (g.model_input(negative).size(0) != 2)
            throw std::runtime_error("a split branch doubles its input");
        const at::Tensor r = g.combine(rank == 0 ? negative : positive, rule);
        const std::lock_guard<std::mutex> lock(m);
        got[static_cast<std::size_t>(rank)] = r;
    });
    CHECK(at::equal(got[0], got[1]));
    CHECK(max_diff(got[0], batched) < 1e-6);
    CHECK(Guidance(true, nullptr).model_input(negative).size(0) == 4);  // both branches, one batch
    CHECK(Guidance(false, nullptr).model_input(negative).size(0) == 2);
    CHECK(at::equal(Guidance(false, nullptr).combine(negative, rule), negative));
}

// Note [kernel time in the steps]: a window counts its own thread's timed calls, a call inside
// another once, and nothing when it is closed. (Lower bounds and zeros only: the sleeps may last
// longer on a loaded machine, never shorter.)
TEST_CASE("a kernel window counts its thread's timed calls, a nested call once, and nothing when closed") {
    using namespace std::chrono_literals;
    const auto nap = [] { std::this_thread::sleep_for(20ms); };
    {
        KernelWindow window(true);
        {
            const KernelTimer gemm(KernelKind::kGemm);
            nap();
            const KernelTimer inner(KernelKind::kAttention);  // inside the product: counted there
            nap();
        }
        CHECK(window.elapsed().gemm >= 40);
        CHECK(window.elapsed().attention == 0);
    }
    {
        KernelWindow window(true);
        std::thread([&] {  // another thread's call: not this window's
            const KernelTimer other(KernelKind::kGemm);
            nap();
        })
            .join();
        {
            KernelWindow closed(false);  // a closed window leaves this one counting
            const KernelTimer attention(KernelKind::kAttention);
            nap();
        }
        CHECK(window.elapsed().gemm == 0);
        CHECK(window.elapsed().attention >= 20);
    }
    {
        KernelWindow window(true);
        {
            KernelWindow inner(true);  // the innermost open window counts
            {
                const KernelTimer gemm(KernelKind::kGemm);
                nap();
            }
            CHECK(inner.elapsed().gemm >= 20);
        }
        CHECK(window.elapsed().gemm == 0);
    }
    KernelWindow closed(false);
    {
        const KernelTimer gemm(KernelKind::kGemm);  // no window open: nothing to count, no fault
        nap();
    }
    CHECK(closed.elapsed().gemm == 0);
}

// Note [fp32 products through oneDNN]: dense_linear is at::linear to float rounding, on 2-D and 3-D
// inputs, with and without a bias, sliced or not, and gives the same bits at any thread count.
TEST_CASE("dense_linear equals at::linear to rounding and gives the same bits at 1, 2 and 3 threads") {
    struct Case {
        std::vector<int64_t> x;
        int64_t out;
        bool bias;
    };
    const int threads = at::get_num_threads();
    for (const Case& c : {Case{{1, 64}, 48, true}, Case{{7, 130}, 33, false}, Case{{2, 65, 96}, 160, true},
                          Case{{130, 512}, 9, true}, Case{{3, 1, 40}, 1, false}}) {
        CAPTURE(c.x);
        const at::Tensor x = seeded(c.x, 21), w = seeded({c.out, c.x.back()}, 22);
        const at::Tensor b = c.bias ? seeded({c.out}, 23) : at::Tensor();
        const at::Tensor want =
            at::linear(x.to(at::kDouble), w.to(at::kDouble), c.bias ? b.to(at::kDouble) : b);
        at::set_num_threads(1);
        const at::Tensor one = dense_linear(x, w, b);
        CHECK(one.sizes() == want.sizes());
        CHECK(max_diff(one.to(at::kDouble), want) <= 1e-5 * (1 + want.abs().max().item<double>()));
        for (int n : {2, 3}) {
            at::set_num_threads(n);
            CHECK(at::equal(dense_linear(x, w, b), one));
        }
        // A slice of a wider buffer gives the same product.
        const at::Tensor wide = at::cat({x, seeded(c.x, 24)}, -1).narrow(-1, 0, c.x.back());
        CHECK(at::equal(dense_linear(wide, w, b), one));
    }
    at::set_num_threads(threads);
    // No output features, or no tokens: at::linear's empty products.
    CHECK(dense_linear(seeded({3, 8}, 27), at::zeros({0, 8}), at::Tensor()).sizes() ==
          at::IntArrayRef({3, 0}));
    CHECK(dense_linear(at::zeros({0, 8}), seeded({5, 8}, 28), at::Tensor()).sizes() ==
          at::IntArrayRef({0, 5}));
    // Another dtype is at::linear's.
    const at::Tensor x = seeded({4, 16}, 25).to(at::kDouble), w = seeded({8, 16}, 26).to(at::kDouble);
    CHECK(at::equal(dense_linear(x, w, at::Tensor()), at::linear(x, w)));
}

// Note [attention on the CPU]: cpu_attention is softmax(q k^T * scale + bias) v, computed in fp64
// from the same inputs, to fp32's (bf16's) rounding: any query and key count, head sizes 32 to 256,
// no bias, one bias row or one per batch (with masked keys), q, k and v in merge_heads' [B, S, H, d]
// storage. The same bits at 1, 2 and 3 threads. Where the CPU lacks the instructions, it refuses.
TEST_CASE(
    "cpu_attention equals attention in fp64 to rounding and gives the same bits at 1, 2 and 3 threads") {
    using dp::strategies::cpu_has;
    struct Case {
        int64_t batch, heads, queries, keys, dim, bias_rows;  // bias_rows 0: no bias
    };
    const bool avx512 =
        cpu_has("avx512f") && cpu_has("avx512bw") && cpu_has("avx512dq") && cpu_has("avx512vl");
    const bool bf16 = avx512 && cpu_has("avx512_bf16");
    const int threads = at::get_num_threads();
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16})
        for (const Case& c :
             {Case{1, 2, 1, 1, 32, 0}, Case{2, 3, 37, 33, 64, 1}, Case{1, 2, 130, 300, 128, 1},
              Case{2, 1, 5, 129, 96, 2}, Case{1, 1, 70, 64, 256, 0}, Case{2, 2, 33, 161, 64, 2}}) {
            CAPTURE(c10::toString(dtype));
            CAPTURE(c.queries);
            CAPTURE(c.keys);
            CAPTURE(c.dim);
            auto heads_view = [&](int64_t tokens, uint64_t seed) {  // [B, H, S, d] over [B, S, H, d]
                return (seeded({c.batch, tokens, c.heads, c.dim}, seed) * 1.5)
                    .to(dtype)
                    .permute({0, 2, 1, 3});
            };
            const at::Tensor q = heads_view(c.queries, 31), k = heads_view(c.keys, 32),
                             v = heads_view(c.keys, 33);
            at::Tensor bias;
            if (c.bias_rows > 0) {  // every third key masked, the rest shifted
                bias = seeded({c.bias_rows, c.keys}, 34);
                bias.index_put_({at::indexing::Slice(), at::indexing::Slice(1, at::indexing::None, 3)},
                                -INFINITY);
            }
            const bool fits = cpu_attention_fits(q, k, v, bias);
            CHECK(fits == (dtype == at::kFloat ? avx512 : bf16));
            if (!fits) {
                MESSAGE("cpu_attention in " << dtype
                                            << " not computed: this CPU lacks the AVX-512 instructions");
                continue;
            }
            const double scale = 1.0 / std::sqrt(static_cast<double>(c.dim));
            at::Tensor logits = at::matmul(q.to(at::kDouble), k.to(at::kDouble).transpose(2, 3)) * scale;
            if (bias.defined()) logits = logits + bias.to(at::kDouble).view({c.bias_rows, 1, 1, c.keys});
            const at::Tensor want = at::matmul(at::softmax(logits, -1), v.to(at::kDouble));
            at::set_num_threads(1);
            const at::Tensor one = cpu_attention(q, k, v, bias, scale);
            CHECK((one.scalar_type() == dtype));
            CHECK(one.sizes() == want.sizes());
            CHECK(one.permute({0, 2, 1, 3}).is_contiguous());
            const double tolerance = dtype == at::kFloat ? 1e-5 : 2e-2;
            CHECK(max_diff(one.to(at::kDouble), want) <= tolerance * (1 + want.abs().max().item<double>()));
            for (int n : {2, 3}) {
                at::set_num_threads(n);
                CHECK(at::equal(cpu_attention(q, k, v, bias, scale), one));
            }
            at::set_num_threads(threads);
        }
    if (!avx512) return;
    const at::Tensor q = seeded({1, 2, 5, 64}, 35), kv = seeded({1, 2, 7, 64}, 36);
    // A row whose every key is masked is 0, not NaN.
    const at::Tensor all_masked = at::full({1, 7}, -INFINITY);
    CHECK(at::equal(cpu_attention(q, kv, kv, all_masked, 0.125), at::zeros_like(q)));
    // Everything else goes to ATen's kernel.
    CHECK_FALSE(cpu_attention_fits(seeded({1, 2, 5, 48}, 37), seeded({1, 2, 7, 48}, 38),
                                   seeded({1, 2, 7, 48}, 38), {}));
    CHECK_FALSE(cpu_attention_fits(q.to(at::kHalf), kv.to(at::kHalf), kv.to(at::kHalf), {}));
    CHECK_FALSE(cpu_attention_fits(q, kv, kv, at::zeros({1, 2, 5, 7})));  // a bias per query
    CHECK_FALSE(cpu_attention_fits(q, kv, kv, at::zeros({3, 7})));        // a bias for 3 batches
    CHECK_FALSE(cpu_attention_fits(q, seeded({1, 3, 7, 64}, 39), seeded({1, 3, 7, 64}, 39), {}));
    CHECK_FALSE(cpu_attention_fits(q, kv.to(at::kDouble), kv, {}));
    CHECK_THROWS_AS(cpu_attention(q, kv.narrow(3, 0, 32), kv, {}, 0.125), dp::runtime::InternalError);
}
