#include "launcher/model_check.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "launcher/errors.h"
#include "launcher/process.h"
#include "launcher/prompt_file.h"
#include "launcher/rank_env.h"
#include "launcher/start_signals.h"

namespace dp::launcher {

void check_model_before_ranks(const std::string& worker, const protocol::JobFile& job_file,
                              const std::string& temp_dir, double timeout_s) {
    const std::string path = temp_dir + "/dp-check-" + std::to_string(getpid()) + ".json";
    struct Remove {
        std::string path;
        ~Remove() { std::remove(path.c_str()); }
    } remove{path};
    {
        protocol::JobFileWriter writer(path, job_file);
        writer.commit();
    }
    ChildProcess child = spawn_child({worker, "--job", path, "--check"}, current_environment());
    child.stdout_read.reset();
    // Its stderr, until it closes or the time is up.
    std::string err;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s > 0 ? timeout_s : 1e9);
    bool timed_out = false;
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
            timed_out = true;
            break;
        }
        // Its stderr, or a stop signal (Note [signals before the ranks start]).
        pollfd p[2] = {{child.stderr_read.get(), POLLIN, 0}, {stop_signal_fd(), POLLIN, 0}};
        const int ready =
            ::poll(p, p[1].fd >= 0 ? 2 : 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
        if (ready < 0 && errno == EINTR) continue;
        if (const int sig = take_stop_signal()) {
            ::kill(-child.pid, SIGKILL);
            wait_for(child.pid);
            throw Error(
                "stopped by " + signal_name(sig) + " before any rank started, while checking the model",
                128 + sig);
        }
        if (ready <= 0 || !(p[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[4096];
        const ssize_t n = ::read(child.stderr_read.get(), buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        if (err.size() < (1 << 16)) err.append(buf, static_cast<std::size_t>(n));
    }
    if (timed_out) ::kill(-child.pid, SIGKILL);
    const int status = wait_for(child.pid);
    if (timed_out)
        throw protocol::ModelError("checking the model took longer than --load-timeout (" +
                                   std::to_string(static_cast<long long>(timeout_s)) +
                                   " s) before any rank started; is its storage reachable?");
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
    // Its last line that says something: "dp-worker: MESSAGE".
    std::string message;
    std::size_t end = err.size();
    while (end > 0 && message.empty()) {
        const std::size_t start = err.rfind('\n', end - 1);
        const std::string line = err.substr(start == std::string::npos ? 0 : start + 1,
                                            end - (start == std::string::npos ? 0 : start + 1));
        if (line.rfind("dp-worker: ", 0) == 0) message = line.substr(11);
        end = start == std::string::npos ? 0 : start;
    }
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (message.empty())
        message = "checking the model before starting the ranks failed (" +
                  (WIFEXITED(status) ? "exit code " + std::to_string(code)
                                     : "killed by " + signal_name(WTERMSIG(status))) +
                  "): " + utf8_for_display(err.substr(err.size() > 400 ? err.size() - 400 : 0));
    throw protocol::Error(utf8_for_display(message), code == 0 ? protocol::kExitInternal : code);
}

}  // namespace dp::launcher
