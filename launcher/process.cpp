#include "launcher/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>

#include "launcher/errors.h"

namespace dp::launcher {

namespace {

// Only async-signal-safe calls between fork and exec.
[[noreturn]] void exec_child(pid_t parent, char* const* argv, char* const* envp, int out_fd, int err_fd,
                             int status_fd, bool ignore_user_signals) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(128 + SIGKILL);  // the launcher died before prctl took effect

    // Dispositions before the mask: a signal the launcher sent meanwhile waits, blocked, and is
    // then discarded if it is one to ignore.
    for (int sig = 1; sig < NSIG; ++sig) signal(sig, SIG_DFL);
    if (ignore_user_signals) {
        signal(SIGUSR1, SIG_IGN);
        signal(SIGUSR2, SIG_IGN);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);

    int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    if (status_fd >= 0) {
        if (status_fd == kStatusFd)
            fcntl(kStatusFd, F_SETFD, 0);  // keep it open across exec
        else
            dup2(status_fd, kStatusFd);
    }

    execvpe(argv[0], argv, envp);
    const int err = errno;
    const char* prefix = "dp-launch: cannot run '";
    write_all(STDERR_FILENO, prefix, strlen(prefix));
    write_all(STDERR_FILENO, argv[0], strlen(argv[0]));
    write_all(STDERR_FILENO, "': ", 3);
    const char* reason = err == ENOENT ? "command not found" : strerror(err);
    write_all(STDERR_FILENO, reason, strlen(reason));
    write_all(STDERR_FILENO, "\n", 1);
    _exit(err == ENOENT ? protocol::kExitNotFound : protocol::kExitNotExecutable);
}

std::vector<char*> c_strings(const std::vector<std::string>& items) {
    std::vector<char*> out;
    out.reserve(items.size() + 1);
    for (const std::string& s : items) out.push_back(const_cast<char*>(s.c_str()));
    out.push_back(nullptr);
    return out;
}

}  // namespace

ChildProcess spawn_child(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                         int status_fd, bool ignore_user_signals) {
    if (argv.empty()) throw UsageError("no command to run");
    int out_pipe[2], err_pipe[2];
    if (pipe2(out_pipe, O_CLOEXEC) != 0) throw SystemError(errno_message("cannot create a pipe"));
    UniqueFd out_read(out_pipe[0]), out_write(out_pipe[1]);
    if (pipe2(err_pipe, O_CLOEXEC) != 0) throw SystemError(errno_message("cannot create a pipe"));
    UniqueFd err_read(err_pipe[0]), err_write(err_pipe[1]);

    std::vector<char*> c_argv = c_strings(argv);
    std::vector<char*> c_env = c_strings(env);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) throw SystemError(errno_message("cannot fork"));
    if (pid == 0)
        exec_child(parent, c_argv.data(), c_env.data(), out_write.get(), err_write.get(), status_fd,
                   ignore_user_signals);

    // Also set the group from this side, so a signal sent right after we return reaches it.
    setpgid(pid, pid);
    fcntl(out_read.get(), F_SETFL, O_NONBLOCK);
    fcntl(err_read.get(), F_SETFL, O_NONBLOCK);
    ChildProcess child;
    child.pid = pid;
    child.stdout_read = std::move(out_read);
    child.stderr_read = std::move(err_read);
    return child;
}

ChildProcess spawn_child_to_files(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                                  const std::string& out_path, const std::string& err_path) {
    if (argv.empty()) throw UsageError("no command to run");
    const auto open_log = [](const std::string& path) {
        UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
        if (!fd) throw IoError(errno_message("cannot open " + path));
        return fd;
    };
    UniqueFd out = open_log(out_path), err = open_log(err_path);
    std::vector<char*> c_argv = c_strings(argv);
    std::vector<char*> c_env = c_strings(env);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) throw SystemError(errno_message("cannot fork"));
    if (pid == 0) exec_child(parent, c_argv.data(), c_env.data(), out.get(), err.get(), -1, false);
    setpgid(pid, pid);
    ChildProcess child;
    child.pid = pid;
    return child;
}

std::string signal_name(int sig) {
    if (const char* abbrev = sigabbrev_np(sig)) return std::string("SIG") + abbrev;
    return "signal " + std::to_string(sig);
}

int wait_for(pid_t pid) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) return 0;
    }
    return status;
}

}  // namespace dp::launcher
