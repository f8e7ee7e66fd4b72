#pragma once
// Ranks as threads of one process, as c10d's own tests run them: each thread joins one Gloo group
// over a shared in-process store (c10d's HashStore) and runs `body` as its rank. Whatever a rank
// throws is rethrown here after every thread has finished, so assertions stay in the test thread.

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/parallel/communicator.h"

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

}  // namespace dp::test
