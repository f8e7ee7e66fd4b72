// dp-attach --job FILE: one rank of a job of `dp-launch serve`, run by the server's warm rank of
// the same RANK (Note [warm ranks], protocol/rank_pool.h). The job's dp-launch starts it in place
// of dp-worker (--worker); it hands the job to the warm rank through DP_POOL_DIR, relays the
// rank's status events to its own status channel (DP_STATUS_FD) and exits with the rank's code for
// the job. A stop signal is passed on to the warm rank. std, POSIX and protocol/ only.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "protocol/errors.h"
#include "protocol/rank_pool.h"
#include "protocol/standard_fds.h"
#include "protocol/write_all.h"

namespace {

volatile sig_atomic_t g_stop = 0;
void on_stop(int sig) { g_stop = sig; }

int fail(const std::string& why, int code) {
    std::cerr << "dp-attach: " << why << std::endl;
    return code;
}

// The warm rank's pid, once it waits for jobs; 0 when it has not within `timeout_s`, or has died.
pid_t warm_pid(const std::string& pool, int rank, double timeout_s) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < until && !g_stop) {
        std::ifstream in(dp::protocol::pool_pid_path(pool, rank));
        long pid = 0;
        if (in >> pid && pid > 0)
            return ::kill(static_cast<pid_t>(pid), 0) == 0 ? static_cast<pid_t>(pid) : 0;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return 0;
}

// Relays the FIFO `in` to `out` (when >= 0) until its writer closes it. False when the warm rank
// `pid` died first. A stop signal is passed on to it once.
bool relay(int in, int out, pid_t pid) {
    char buffer[65536];
    bool stopped = false;
    for (;;) {
        if (g_stop && !stopped) {
            ::kill(pid, SIGTERM);  // Note [stopping at a step boundary], runtime/worker.cpp
            stopped = true;
        }
        pollfd p{in, POLLIN, 0};
        const int n = ::poll(&p, 1, 200);
        if (n < 0 && errno == EINTR) continue;
        if (n == 0) {
            if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
            continue;
        }
        const ssize_t got = ::read(in, buffer, sizeof(buffer));
        if (got > 0) {
            if (out >= 0 && !dp::protocol::write_all(out, buffer, static_cast<std::size_t>(got))) out = -1;
            continue;
        }
        if (got == 0 && (p.revents & POLLHUP)) return true;  // the rank closed the job's channel
        if (got < 0 && errno != EAGAIN && errno != EINTR) return false;
    }
}

}  // namespace

int main(int argc, char** argv) {
    dp::protocol::open_missing_standard_fds();
    if (argc != 3 || std::string(argv[1]) != "--job")
        return fail("usage: dp-attach --job FILE (dp-launch serve starts it as a job's rank)",
                    dp::protocol::kExitUsage);
    const char* pool = std::getenv(dp::protocol::kPoolDirVariable);
    const char* rank_text = std::getenv("RANK");
    if (!pool || !*pool || !rank_text)
        return fail(std::string(dp::protocol::kPoolDirVariable) +
                        " and RANK are not set: dp-attach is a rank of dp-launch serve's jobs",
                    dp::protocol::kExitUsage);
    const int rank = std::atoi(rank_text);
    const char* status_text = std::getenv("DP_STATUS_FD");
    const int status_fd = status_text ? std::atoi(status_text) : -1;
    char job[PATH_MAX];
    if (!::realpath(argv[2], job)) return fail(std::string(argv[2]) + ": " + std::strerror(errno), 66);

    struct sigaction sa {};
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    for (const int sig : {SIGTERM, SIGINT, SIGHUP}) sigaction(sig, &sa, nullptr);
    ::signal(SIGPIPE, SIG_IGN);

    const pid_t pid = warm_pid(pool, rank, 600);
    if (pid == 0)
        return fail("no warm rank " + std::to_string(rank) + " waits for jobs in " + pool,
                    g_stop ? 128 + g_stop : 75);
    const std::string dir = dp::protocol::pool_rank_dir(pool, rank);
    const std::string fifo = dir + "/" + std::to_string(::getpid()) + ".status";
    const std::string exit_file = dir + "/" + std::to_string(::getpid()) + ".exit";
    ::unlink(fifo.c_str());
    ::unlink(exit_file.c_str());
    if (::mkfifo(fifo.c_str(), 0600) != 0)
        return fail("cannot make " + fifo + ": " + std::strerror(errno), 71);
    const int in = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (in < 0) return fail("cannot open " + fifo + ": " + std::strerror(errno), 71);
    try {
        dp::protocol::write_pool_request(pool, rank, {job, fifo, exit_file});
    } catch (const std::exception& e) {
        return fail(e.what(), 74);
    }
    const bool finished = relay(in, status_fd, pid);
    ::close(in);
    ::unlink(fifo.c_str());
    int code = 75;
    std::ifstream result(exit_file);
    if (!(result >> code)) {
        code = 75;
        fail("warm rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ") ended " +
                 (finished ? "the job without its exit code" : "before the job did") +
                 "; the server starts the "
                 "warm ranks again for the next job",
             code);
    }
    ::unlink(exit_file.c_str());
    return code;
}
