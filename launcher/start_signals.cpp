#include "launcher/start_signals.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <time.h>

#include <cerrno>
#include <cstddef>

#include "launcher/errors.h"
#include "launcher/process.h"
#include "launcher/unique_fd.h"

namespace dp::launcher {
namespace {

template <std::size_t N>
sigset_t set_of(const int (&signals)[N]) {
    sigset_t set;
    sigemptyset(&set);
    for (const int sig : signals) sigaddset(&set, sig);
    return set;
}

}  // namespace

void hold_job_signals() {
    const sigset_t set = set_of(kJobSignals);
    sigprocmask(SIG_BLOCK, &set, nullptr);
}

void release_job_signals() {
    const sigset_t set = set_of(kJobSignals);
    sigprocmask(SIG_UNBLOCK, &set, nullptr);
}

int take_stop_signal() {
    sigset_t pending;
    sigemptyset(&pending);
    if (sigpending(&pending) != 0) return 0;
    for (const int sig : kStopSignals) {
        if (!sigismember(&pending, sig)) continue;
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        const timespec now{0, 0};
        if (sigtimedwait(&one, nullptr, &now) == sig) return sig;
    }
    return 0;
}

void stop_if_signalled() {
    if (const int sig = take_stop_signal())
        throw Error("stopped by " + signal_name(sig) + " before any rank started", 128 + sig);
}

int stop_signal_fd() {
    static const UniqueFd fd = [] {
        const sigset_t stops = set_of(kStopSignals);
        return UniqueFd(signalfd(-1, &stops, SFD_CLOEXEC | SFD_NONBLOCK));
    }();
    return fd.get();
}

void wait_readable_or_stopped(int fd) {
    struct stat st {};
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) return;
    pollfd fds[2] = {{fd, POLLIN, 0}, {stop_signal_fd(), POLLIN, 0}};
    const nfds_t count = fds[1].fd >= 0 ? 2 : 1;
    while (poll(fds, count, -1) < 0 && errno == EINTR) {
    }
    if (count == 2 && (fds[1].revents & POLLIN)) stop_if_signalled();
}

}  // namespace dp::launcher
