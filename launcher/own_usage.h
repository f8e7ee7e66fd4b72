#pragma once
// dp-launch's own resources, for benchmarks: when DP_LAUNCH_USAGE_FILE names a file, dp-launch
// writes there as it returns from main one JSON line of what the launcher process itself used
// (getrusage RUSAGE_SELF: peak resident memory and CPU seconds), never its ranks', which the
// kernel counts apart as children.

#include <string>

namespace dp::launcher {

inline constexpr const char* kOwnUsageFileVariable = "DP_LAUNCH_USAGE_FILE";

// {"max_rss_kb": ..., "user_s": ..., "system_s": ...} to `path`; a file that cannot be written is
// passed over in silence (the job's own result comes first).
void write_own_usage(const std::string& path);

}  // namespace dp::launcher
