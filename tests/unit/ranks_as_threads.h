#pragma once
// Ranks as threads of one process, as c10d's own tests run them: each thread joins one Gloo group
// over a shared in-process store (c10d's HashStore) and runs `body` as its rank. Whatever a rank
// throws is rethrown here after every thread has finished, so assertions stay in the test thread.
// With them, what the tests of a layout need: its mesh, a tensor-parallel rank without groups (to
// load a shard), and the largest difference the ranks report.

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/parallel/communicator.h"
#include "runtime/parallel/parallel_context.h"
#include "strategies/mesh.h"

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

}  // namespace dp::test
