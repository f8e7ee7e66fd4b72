#pragma once
// Starting one rank's process, and naming how processes end.

#include <sys/types.h>

#include <string>
#include <vector>

#include "launcher/unique_fd.h"

namespace dp::launcher {

struct ChildProcess {
    pid_t pid = -1;  // also its process group id
    UniqueFd stdout_read;
    UniqueFd stderr_read;
};

// Forks and execs argv[0] (searched in PATH) with `env`, in a process group of its own, with
// SIGKILL as its parent-death signal, stdin from /dev/null and stdout/stderr on new pipes. Signal
// mask and dispositions are reset to defaults. When the exec fails, the child writes the reason to
// its stderr and exits 127 (not found) or 126 (not executable), as a shell does.
// Throws SystemError when the fork or pipes fail.
// With `status_fd` >= 0, that descriptor is also given to the child as fd 3 (kStatusFd). With
// `ignore_user_signals`, SIGUSR1 and SIGUSR2 start ignored (dp-worker ranks, which ignore them: one
// forwarded while a rank still loads its libraries must not end it).
inline constexpr int kStatusFd = 3;
ChildProcess spawn_child(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                         int status_fd = -1, bool ignore_user_signals = false);

// As spawn_child, with the child's stdout and stderr appended to the files `out_path` and
// `err_path` (created when missing) instead of pipes: a child that outlives any reader of its
// output (a job of `dp-launch serve`). The result's pipes are empty.
ChildProcess spawn_child_to_files(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                                  const std::string& out_path, const std::string& err_path);

// "SIGTERM", or "signal 42" for an unnamed one.
std::string signal_name(int sig);

// Blocks until `pid` has exited and returns its wait status, retrying on EINTR.
int wait_for(pid_t pid);

}  // namespace dp::launcher
