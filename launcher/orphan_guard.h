#pragma once
// Note [orphan guard]: "dp-launch never leaves a process of the job behind", however it ends.
// - Each rank gets SIGKILL as its parent-death signal, but that reaches only the rank itself, not
//   what it started (a shell's children, a data loader's workers, a daemon that double-forked and
//   called setsid() to leave the rank's process group).
// - Every rank gets DP_JOB_ID, unique to this run, in its environment; whatever it starts inherits
//   it, whatever process group or session it moves to. The launcher is a child subreaper
//   (PR_SET_CHILD_SUBREAPER), so a descendant orphaned while it lives becomes its child.
// - The guard is a small forked copy of the launcher in a session of its own (setsid), so that a
//   signal to the launcher's process group (timeout(1), kill -9 -PGID, a terminal hang-up) does
//   not reach it. It ignores job signals and blocks reading a pipe from the launcher, which tells
//   it each rank's process group. If the launcher dies in any way, even by SIGKILL, the kernel
//   closes the pipe and the guard SIGKILLs those groups, the ranks' descendants, and every process
//   whose environment holds the job's DP_JOB_ID, sweeping until none is left.
// - When the launcher ends normally it kills what the ranks left (kill_job_processes) and says
//   goodbye; the guard just exits.
// What cannot be found: a process that both removed DP_JOB_ID from its environment (env -i, an
// exec with a new environment) and was orphaned after the launcher died. No cgroup is used:
// containers rarely give a writable one.

#include <sys/types.h>

#include <string>
#include <vector>

#include "launcher/unique_fd.h"

namespace dp::launcher {

inline constexpr const char* kJobIdVariable = "DP_JOB_ID";

// A fresh job id: unique on this host for the launcher's lifetime and beyond.
std::string new_job_id();

class OrphanGuard {
  public:
    explicit OrphanGuard(std::string job_id);  // forks the guard; throws SystemError
    OrphanGuard(const OrphanGuard&) = delete;
    OrphanGuard& operator=(const OrphanGuard&) = delete;
    ~OrphanGuard();  // a clean goodbye: the guard exits without killing anything

    void watch(pid_t process_group);
    void forget(pid_t process_group);
    pid_t pid() const { return pid_; }
    const std::string& job_id() const { return job_id_; }

  private:
    void send(char op, pid_t process_group);

    std::string job_id_;
    pid_t pid_ = -1;
    UniqueFd pipe_;
};

// Live processes of job `job_id`: descendants of `roots` (found through /proc's parent links) and
// every process whose environment holds DP_JOB_ID=job_id. Never the caller, never `spare`.
std::vector<pid_t> find_job_processes(const std::string& job_id, const std::vector<pid_t>& roots,
                                      pid_t spare = -1);

// SIGKILLs find_job_processes(...) until a sweep finds none (what is killed may fork in between),
// for at most about a second. Returns how many processes were killed.
int kill_job_processes(const std::string& job_id, const std::vector<pid_t>& roots, pid_t spare = -1);

}  // namespace dp::launcher
