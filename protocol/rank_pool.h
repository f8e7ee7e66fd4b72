#pragma once
// Note [warm ranks]: `dp-launch serve` keeps one group of dp-worker ranks running between jobs
// (`dp-worker --pool DIR`), so that the model is loaded once, not once a job. Each job is still
// the batch job: its own dp-launch, monitor, manifest, gallery and exit code. Only its ranks
// differ: in place of dp-worker, the job's dp-launch starts dp-attach (its --worker), which hands
// the job file to the warm rank of its RANK through DIR and relays that rank's status events for
// the job to its own status channel, as dp-worker would have sent them:
//   1. the warm rank writes DIR/rank-R/pid once it waits for jobs;
//   2. dp-attach makes a FIFO, opens it, and writes DIR/rank-R/request.json (atomically): the
//      job file, the FIFO and the file the rank's exit code goes to;
//   3. the warm rank takes the request (renames it away), writes the job's status events to the
//      FIFO, then its exit code to the exit file, and closes the FIFO;
//   4. dp-attach, at the FIFO's end, exits with that code (75 when the rank died first).
// A job that does not end with 0 ends the warm ranks too (their group may be mid-collective);
// the server starts them again for the next job. A stop (SIGTERM to dp-attach) is passed on to
// the warm rank, which stops at its next step boundary, as dp-worker does.
#include <optional>
#include <string>

namespace dp::protocol {

// The environment variable that names DIR for dp-attach.
inline constexpr const char* kPoolDirVariable = "DP_POOL_DIR";

struct PoolRequest {
    std::string job;     // the job file
    std::string status;  // the FIFO the rank writes the job's status events to
    std::string exit;    // where the rank writes its exit code for the job
};

std::string pool_rank_dir(const std::string& pool, int rank);
// DIR/rank-R/pid: the warm rank's process id, written when it waits for its first job.
std::string pool_pid_path(const std::string& pool, int rank);
std::string pool_request_path(const std::string& pool, int rank);

// Writes `request` for warm rank `rank` (its folder made when missing). Throws IoError.
void write_pool_request(const std::string& pool, int rank, const PoolRequest& request);
// The waiting request of warm rank `rank`, taken (no other reader sees it); nullopt when there is
// none. Throws InputDataError for a request that is not one.
std::optional<PoolRequest> take_pool_request(const std::string& pool, int rank);

}  // namespace dp::protocol
