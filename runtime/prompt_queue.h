#pragma once
// PromptQueue: the work units (batches of requests) a rank's replica makes, one after the other,
// under the job file's schedule.
//
// Note [dynamic schedule]
// Static: the replica's contiguous share of the requests (accelerate's split), in the job's order.
// Dynamic: every rank orders all the requests the same way (strategies::dynamic_order: the
// costliest first, by the cost model over the job file, which every rank agreed on) and cuts them
// into the same units. A replica that is free claims the next unit: its leader (the replica's
// first rank, the one that writes its images) adds 1 to a counter in the job's c10d store, which
// is one atomic step whichever node asks, and publishes the unit it got under a key of its replica
// and turn; the other ranks of the replica read that key, so all of them make the same prompts in
// the same order, as cfg, ring, ulysses and tp need. With prompts of several LoRA adapter sets,
// each set's units have their own counter, and a replica claims from its current set first
// (strategies' Note [claims by adapter set]), so that it switches only when its set runs out. A
// claim when every set is used up ends the replica's work. The keys are under the job's id, so a restarted or
// resumed job (a new store, its own id) starts its queue afresh. Seeds and settings are per prompt in the job
// file, so each image is the one a static run makes; only which rank makes it, and when, differ.

#include <cstddef>
#include <string>
#include <vector>

#include "protocol/job_file.h"
#include "runtime/parallel/communicator.h"
#include "runtime/parallel/parallel_context.h"
#include "strategies/model_config.h"
#include "strategies/work_split.h"

namespace dp::runtime {

class PromptQueue {
  public:
    // `model`: the job's model as this rank read it (the cost model's rules); `world`: the job's
    // whole group, whose store every node shares; `job_id`: the job's (rank 0's launcher's, from
    // the job agreement). Orders and cuts the requests; claims nothing yet.
    PromptQueue(const protocol::JobFile& job, const strategies::ModelInfo& model,
                const ParallelContext& parallel, Communicator& world, const std::string& job_id);

    bool dynamic() const { return dynamic_; }
    // The static share, [0, 0) under the dynamic schedule.
    const strategies::Range& share() const { return share_; }
    // Whether the replica may get any work: a static share that is not empty, or any request.
    bool has_work() const { return !units_.empty(); }

    // The next unit (positions into job.requests), or nullptr when the replica's work is done.
    // Dynamic: a claim on the store, which every rank of the replica makes at the same point;
    // throws CommunicationError when the store does not answer within the group's timeout.
    const std::vector<std::size_t>* next();

  private:
    // The leader's claim: the unit's position in units_, units_.size() when there is none left.
    std::size_t claim();

    bool dynamic_ = false;
    strategies::Range share_;
    std::vector<std::vector<std::size_t>> units_;
    Communicator& world_;
    bool leader_ = false;                      // the replica's first rank: it claims
    bool alone_ = false;                       // a replica of one rank: nobody to hand the claim to
    std::string counter_key_;                  // the job's count of claimed units, a set's: COUNTER_KEY/SET
    std::vector<strategies::Range> set_runs_;  // each adapter set's units
    std::vector<bool> used_up_;                // the sets this replica found used up
    std::size_t claiming_ = 0;                 // the set it claims from
    std::string turn_key_;                     // this replica's claims, by turn: TURN_KEY + turn
    std::size_t next_static_ = 0;
    long long turn_ = 0;
};

}  // namespace dp::runtime
