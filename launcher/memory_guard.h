#pragma once
// Note [memory guard]: started ranks that together need more memory than the machine has bring
// in the host's out-of-memory killer minutes later (137), often on another job's processes. So
// before any rank starts, the launcher adds up what its ranks will hold in host memory: each
// rank's weights (the transformer and the components the family splits over tp at their tp
// share, every other component whole, in the run's dtype, without what the pipeline never loads:
// the sizes plan reports; with --random-weights what the configs build, config-only folders
// included, Note [sizes from configs]) plus LibTorch's own base (kRankBaseBytes, measured), for each rank
// this launcher starts on CPU devices, and the libraries they share once (kSharedLibraryBytes), and compares
// it with the memory available (MemAvailable, and the cgroup's limit less its usage when one is set). Over it
// is a usage error (2) naming the figures and how many ranks fit; --force runs anyway. Ranks on GPUs hold
// their weights there: not checked.

#include <cstdint>
#include <string>

#include "launcher/launch_spec.h"
#include "launcher/resolved_job.h"

namespace dp::launcher {

// LibTorch's own memory in a rank beside its weights, measured on a rank of the 1.5 MB tiny SD3
// model on the CPU (/proc/PID/smaps_rollup while it generates): 191 MiB private to each rank
// (Private_Dirty, its heap) and 198 MiB of library pages (Shared_Clean) that every rank of the
// machine shares, counted once.
inline constexpr int64_t kRankBaseBytes = 191LL << 20;
inline constexpr int64_t kSharedLibraryBytes = 198LL << 20;

// The memory available to new processes here: MemAvailable, or the cgroup's limit less its usage
// when smaller; 0 when neither can be read.
int64_t available_memory_bytes();

// Throws UsageError when the ranks `launch` starts here on CPU devices would need more than
// `available` bytes (available_memory_bytes() when negative), in `job`'s dtype at its tp degree.
// Does nothing with --force, with a device map, on GPUs, or when the sizes cannot be read (the
// model's own checks report that).
void check_memory_fits(const LaunchSpec& launch, const ResolvedJob& job, int64_t available = -1);

}  // namespace dp::launcher
