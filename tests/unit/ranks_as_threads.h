#pragma once
// Ranks as threads of one process, as c10d's own tests run them: each thread joins one Gloo group
// over a shared in-process store (c10d's HashStore) and runs `body` as its rank. Whatever a rank
// throws is rethrown here after every thread has finished, so assertions stay in the test thread.
// With them, what the tests of a layout need: its mesh, a tensor-parallel rank without groups (to
// load a shard), the largest difference the ranks report, and attend() on every rank against
// whole-sequence attention.

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <optional>

#include "runtime/parallel/attention.h"
#include "runtime/parallel/communicator.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/parallel/sequence_shard.h"
#include "strategies/mesh.h"
#include "unit/doctest_torch.h"

namespace dp::test {

inline void run_ranks(int world, const std::function<void(int rank, runtime::Communicator& group)>& body,
                      std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    const runtime::InProcessStore store;
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world));
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
        threads.emplace_back([&, r] {
            try {
                runtime::CommunicatorOptions o;
                o.rank = r;
                o.world_size = world;
                o.timeout = timeout;
                runtime::Communicator group(store, o);
                body(r, group);
            } catch (...) {
                errors[static_cast<std::size_t>(r)] = std::current_exception();
            }
        });
    for (std::thread& t : threads) t.join();
    for (const std::exception_ptr& e : errors)
        if (e) std::rethrow_exception(e);
}

// A mesh of tp x ulysses x ring ranks.
inline strategies::MeshDegrees mesh_of(int tp, int ulysses, int ring) {
    strategies::MeshDegrees d;
    d.tp = tp;
    d.ulysses = ulysses;
    d.ring = ring;
    return d;
}

// Rank `rank` of a tensor-parallel mesh of `size`, without its groups: enough to load a shard.
inline runtime::ParallelContext tensor_parallel_rank(int rank, int size) {
    return runtime::ParallelContext::from_groups(strategies::Mesh(size, mesh_of(size, 1, 1)), rank, nullptr,
                                                 nullptr, nullptr, nullptr);
}

// The largest of the values the ranks report. A NaN sticks: it fails every bound.
class Worst {
  public:
    void add(double v) {
        const std::lock_guard<std::mutex> lock(m_);
        worst_ = std::isnan(v) ? v : std::max(worst_, v);
    }
    double value() const { return worst_; }

  private:
    std::mutex m_;
    double worst_ = 0;
};

// How attend() gets a second stream (the text): none, replicated on every rank, or split like the
// first.
enum class Second { kNone, kReplicated, kSplit };

// An attention's streams: q, k, v [B, H, tokens, d], and with a second stream q2, k2, v2
// [B, H, text, d] and its key bias bias2 [1 or B, text] (undefined: none).
struct AttendStreams {
    at::Tensor q, k, v, q2, k2, v2, bias2;
};

// attend() on every rank of a ring x ulysses mesh, each stream sharded as the layers shard it
// (`second` says how the second one is), each rank's gathered outputs against `expected`
// (whole-sequence attention over [first; second]): the largest difference over ranks and streams.
inline double attend_on_ranks(const AttendStreams& s, Second second, int ulysses, int ring,
                              const at::Tensor& expected) {
    const int world = ulysses * ring;
    const int64_t tokens = s.q.size(2), text = second == Second::kNone ? 0 : s.q2.size(2);
    Worst worst;
    run_ranks(world, [&](int, runtime::Communicator& group) {
        const runtime::ParallelContext parallel(group, strategies::Mesh(world, mesh_of(1, ulysses, ring)));
        const runtime::SequenceShard image(tokens, parallel.sequence());
        std::optional<runtime::SequenceShard> words;
        runtime::AttentionInputs in;
        in.q = image.shard(s.q, 2), in.k = image.shard(s.k, 2), in.v = image.shard(s.v, 2);
        in.shard = &image;
        if (second == Second::kReplicated) {
            in.q2 = s.q2, in.k2 = s.k2, in.v2 = s.v2;
        } else if (second == Second::kSplit) {
            words.emplace(text, parallel.sequence());
            in.q2 = words->shard(s.q2, 2), in.k2 = words->shard(s.k2, 2), in.v2 = words->shard(s.v2, 2);
            in.shard2 = &*words;
        }
        in.bias2 = s.bias2;
        const runtime::AttentionOutputs out = runtime::attend(in);
        double diff = max_diff(image.gather(out.out, 2), expected.narrow(2, 0, tokens));
        if (second == Second::kReplicated)
            diff = std::max(diff, max_diff(out.out2, expected.narrow(2, tokens, text)));
        if (second == Second::kSplit)
            diff = std::max(diff, max_diff(words->gather(out.out2, 2), expected.narrow(2, tokens, text)));
        worst.add(diff);
    });
    return worst.value();
}

}  // namespace dp::test
