#pragma once
// Runs the real dp-launch binary as a child of the test, with a unique marker in its environment
// so that every process of the job (ranks, their children) can be found in /proc afterwards.

#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <vector>
#include "support/test_paths.h"

namespace dp::test {

struct LaunchResult {
    int exit_code = -1;  // 128 + signal if dp-launch itself was killed
    int killed_by = 0;   // the signal that killed dp-launch itself; 0 when it exited
    std::string out;
    std::string err;
    double seconds = 0;
    // CPU time (user and system) of dp-launch and the processes it waited for: what a bound on the
    // work a command does checks, unlike `seconds`, whatever else the machine runs meanwhile.
    double cpu_seconds = 0;
};

class Launch {
  public:
    // Starts `dp-launch args...`. extra_env is added to the test's own environment. With
    // `stdin_closed`, dp-launch starts with fd 0 closed, which its main opens on /dev/null first
    // thing (Note [closed standard descriptors]): wait_for_main() sees that.
    explicit Launch(const std::vector<std::string>& args,
                    const std::map<std::string, std::string>& extra_env = {}, bool stdin_closed = false);
    ~Launch();
    Launch(const Launch&) = delete;
    Launch& operator=(const Launch&) = delete;

    pid_t pid() const { return pid_; }
    const std::string& marker() const { return marker_; }
    void signal(int sig) const;
    // Started with `stdin_closed`: waits until dp-launch's main has begun (its fd 0 is /dev/null).
    // False when it has not within `timeout_s`.
    bool wait_for_main(double timeout_s = 10) const;
    // Collects all output until dp-launch exits. Past the timeout it is SIGKILLed and the result
    // has exit_code -1.
    LaunchResult wait(double timeout_s = 60);

  private:
    pid_t pid_ = -1;
    int out_fd_ = -1, err_fd_ = -1;
    std::string marker_;
    double started_ = 0;
};

// A program started by the test itself, not through dp-launch (as a rank whose launcher does not
// stop it): `extra_env` is added to the test's environment with DP_TEST_MARKER, and its stdout,
// stderr and fd 3 (its status channel, when DP_STATUS_FD=3 is set) go to the files
// PREFIX.stdout, PREFIX.stderr and PREFIX.status. SIGKILLed and reaped when destroyed.
class DirectProcess {
  public:
    DirectProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& extra_env,
                  const std::string& prefix);
    ~DirectProcess();
    DirectProcess(const DirectProcess&) = delete;
    DirectProcess& operator=(const DirectProcess&) = delete;

    pid_t pid() const { return pid_; }
    const std::string& marker() const { return marker_; }
    // Waits until it exits and returns its exit code, or 128 + the signal that killed it; -1 when
    // it is still running after `timeout_s` (it is then SIGKILLed). Also sets exited_at().
    int wait(double timeout_s);
    double exited_at() const { return exited_at_; }  // monotonic_seconds() when wait() saw it exit
    std::string stderr_text() const;
    std::string status_text() const;

  private:
    pid_t pid_ = -1;
    std::string marker_;
    std::string prefix_;
    double exited_at_ = 0;
};

// Runs dp-launch to completion.
LaunchResult run_launch(const std::vector<std::string>& args,
                        const std::map<std::string, std::string>& extra_env = {}, double timeout_s = 60);
// run_launch, and a doctest CHECK that no process of the job is left 5 s after dp-launch exits.
LaunchResult run_leaving_nothing(const std::vector<std::string>& args,
                                 const std::map<std::string, std::string>& extra_env = {},
                                 double timeout_s = 120);

// Live (non-zombie) processes whose environment contains DP_TEST_MARKER=marker.
std::vector<pid_t> processes_with_marker(const std::string& marker);

// A process of the job marked `marker` that is stopped (SIGSTOP), polled for until `timeout_s`
// passes; -1 when none is.
pid_t stopped_process(const std::string& marker, double timeout_s);

// Polls pred every 5 ms until it holds or the timeout passes.
bool wait_until(const std::function<bool()>& pred, double timeout_s);

std::string make_temp_dir();
// dir/prompts.txt of `n` prompt lines, "a red circle number 0" onwards; its path.
std::string red_circle_prompts(const std::string& dir, int n);
std::string read_file(const std::string& path);
bool file_exists(const std::string& path);
double monotonic_seconds();

inline const char* launcher_bin() { return DP_LAUNCH_BIN; }
inline const char* worker_bin() { return DP_TEST_WORKER_BIN; }

}  // namespace dp::test
