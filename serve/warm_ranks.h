#pragma once
// The server's warm ranks (Note [warm ranks], protocol/rank_pool.h): one `dp-launch warm-ranks
// DIR [flags]` child, whose dp-worker ranks wait in DIR for jobs and keep the model loaded
// between them. Started again when it has ended (a job that failed ends it).
#include <sys/types.h>

#include <string>
#include <vector>

#include "serve/serve_options.h"

namespace dp::serve {

class WarmRanks {
  public:
    explicit WarmRanks(const ServeOptions& options);
    ~WarmRanks();  // stops them
    WarmRanks(const WarmRanks&) = delete;
    WarmRanks& operator=(const WarmRanks&) = delete;

    // Starts the ranks when they are not running. Throws SystemError or IoError.
    void ensure();
    // Stops them (SIGTERM, then SIGKILL after the grace) and waits.
    void stop();
    // The folder a job's dp-attach finds them in (DP_POOL_DIR).
    const std::string& dir() const { return dir_; }
    // How many times they were started.
    int starts() const { return starts_; }

  private:
    bool ranks_alive() const;  // no rank that wrote its pid has died

    const ServeOptions& options_;
    std::string dir_;
    pid_t pid_ = -1;
    int starts_ = 0;
};

}  // namespace dp::serve
