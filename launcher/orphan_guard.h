#pragma once
// Note [orphan guard]: each rank gets SIGKILL as its parent-death signal, but that reaches only the
// rank's own process, not what it started (a shell's children, a data loader's workers). The guard
// is a small forked copy of the launcher that ignores job signals and blocks reading a pipe from
// the launcher. The launcher tells it each rank's process group; if the launcher dies in any way,
// even by SIGKILL, the kernel closes the pipe and the guard SIGKILLs every group it was told of.
// When the launcher ends normally it says so first and the guard just exits.

#include <sys/types.h>

#include "launcher/unique_fd.h"

namespace dp::launcher {

class OrphanGuard {
  public:
    OrphanGuard();  // forks the guard; throws SystemError
    OrphanGuard(const OrphanGuard&) = delete;
    OrphanGuard& operator=(const OrphanGuard&) = delete;
    ~OrphanGuard();  // a clean goodbye: the guard exits without killing anything

    void watch(pid_t process_group);
    void forget(pid_t process_group);
    pid_t pid() const { return pid_; }

  private:
    void send(char op, pid_t process_group);

    pid_t pid_ = -1;
    UniqueFd pipe_;
};

}  // namespace dp::launcher
