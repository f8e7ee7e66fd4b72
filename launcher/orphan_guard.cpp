#include "launcher/orphan_guard.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "launcher/errors.h"
#include "launcher/process.h"

namespace dp::launcher {
namespace {

struct Message {
    char op;  // 'w' watch, 'f' forget, 'q' clean goodbye
    pid_t group;
};

[[noreturn]] void guard_main(int read_fd) {
    prctl(PR_SET_NAME, "dp-launch-guard");
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU})
        signal(sig, SIG_IGN);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    // Hold nothing of the launcher's open: a reader of its stdout must see EOF when it exits.
    int null_fd = open("/dev/null", O_RDWR);
    for (int fd = 0; fd <= 2; ++fd)
        if (null_fd >= 0) dup2(null_fd, fd);
    dup2(read_fd, 3);
    close_range(4, ~0U, 0);

    std::set<pid_t> groups;
    Message m{};
    while (true) {
        ssize_t n = read(3, &m, sizeof(m));
        if (n < 0 && errno == EINTR) continue;
        if (n != static_cast<ssize_t>(sizeof(m))) break;  // EOF: the launcher is gone
        if (m.op == 'q') _exit(0);
        if (m.op == 'w') groups.insert(m.group);
        if (m.op == 'f') groups.erase(m.group);
    }
    for (pid_t group : groups) kill(-group, SIGKILL);
    _exit(0);
}

}  // namespace

OrphanGuard::OrphanGuard() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw SystemError(errno_message("cannot create the orphan guard's pipe"));
    UniqueFd read_end(fds[0]), write_end(fds[1]);
    pid_ = fork();
    if (pid_ < 0) throw SystemError(errno_message("cannot fork the orphan guard"));
    if (pid_ == 0) {
        write_end.release();  // closed by close_range in guard_main
        guard_main(read_end.get());
    }
    pipe_ = std::move(write_end);
}

OrphanGuard::~OrphanGuard() {
    if (pid_ <= 0) return;
    send('q', 0);
    pipe_.reset();
    wait_for(pid_);
}

void OrphanGuard::watch(pid_t process_group) { send('w', process_group); }
void OrphanGuard::forget(pid_t process_group) { send('f', process_group); }

void OrphanGuard::send(char op, pid_t process_group) {
    Message m{op, process_group};
    write_all(pipe_.get(), reinterpret_cast<const char*>(&m), sizeof(m));  // < PIPE_BUF: atomic
}

}  // namespace dp::launcher
