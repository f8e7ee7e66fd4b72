#include "integration/launch_harness.h"

#include <doctest/doctest.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace dp::test {

namespace {

// The test's environment with `extra_env` replacing or adding variables, and DP_TEST_MARKER.
std::vector<std::string> child_environment(const std::map<std::string, std::string>& extra_env,
                                           const std::string& marker) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
        const std::string kv = *e;
        if (extra_env.count(kv.substr(0, kv.find('='))) == 0) env.push_back(kv);
    }
    for (const auto& [k, v] : extra_env) env.push_back(k + "=" + v);
    env.push_back("DP_TEST_MARKER=" + marker);
    return env;
}

std::string next_marker() {
    static std::atomic<int> counter{0};
    return "dptest-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
    std::vector<char*> out;
    for (auto& s : strings) out.push_back(s.data());
    out.push_back(nullptr);
    return out;
}

}  // namespace

double monotonic_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

Launch::Launch(const std::vector<std::string>& args, const std::map<std::string, std::string>& extra_env,
               bool stdin_closed) {
    marker_ = next_marker();
    std::vector<std::string> env_strings = child_environment(extra_env, marker_);
    std::vector<std::string> argv_strings = {launcher_bin()};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv = c_strings(argv_strings), envp = c_strings(env_strings);

    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) std::abort();
    started_ = monotonic_seconds();
    pid_ = fork();
    if (pid_ == 0) {
        dup2(out[1], 1);
        dup2(err[1], 2);
        if (stdin_closed) close(0);
        // dp-launch as a shell starts it in the foreground: the test's own signal settings (a
        // runner in the background ignores SIGINT and SIGQUIT) would hide what dp-launch does.
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, nullptr);
        for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) ::signal(sig, SIG_DFL);
        execve(argv[0], argv.data(), envp.data());
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
}

Launch::~Launch() {
    if (pid_ > 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) close(out_fd_);
    if (err_fd_ >= 0) close(err_fd_);
}

void Launch::signal(int sig) const { kill(pid_, sig); }

bool Launch::wait_for_main(double timeout_s) const {
    // First the exec (its exe is dp-launch: the fd 0 it had before was closed), then its fd 0 on
    // /dev/null; before main the dynamic loader opens each library there for a moment.
    char wanted[4096] = {}, target[4096] = {};
    if (!realpath(launcher_bin(), wanted)) return false;
    const std::string proc = "/proc/" + std::to_string(pid_);
    const auto is = [&](const std::string& link, const std::string& value) {
        const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
        return n > 0 && std::string(target, static_cast<std::size_t>(n)) == value;
    };
    const double deadline = monotonic_seconds() + timeout_s;
    bool execd = false;
    while (monotonic_seconds() < deadline) {
        execd = execd || is(proc + "/exe", wanted);
        if (execd && is(proc + "/fd/0", "/dev/null")) return true;
        usleep(20);
    }
    return false;
}

LaunchResult Launch::wait(double timeout_s) {
    LaunchResult result;
    const double deadline = monotonic_seconds() + timeout_s;
    bool timed_out = false;
    while (out_fd_ >= 0 || err_fd_ >= 0) {
        pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
        const int remaining_ms = static_cast<int>((deadline - monotonic_seconds()) * 1000);
        if (remaining_ms <= 0) {
            timed_out = true;
            break;
        }
        if (poll(fds, 2, remaining_ms) <= 0) continue;
        for (int i = 0; i < 2; ++i) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            char buf[65536];
            ssize_t n = read(fds[i].fd, buf, sizeof(buf));
            if (n > 0) {
                (i == 0 ? result.out : result.err).append(buf, static_cast<size_t>(n));
            } else {
                close(fds[i].fd);
                (i == 0 ? out_fd_ : err_fd_) = -1;
            }
        }
    }
    if (timed_out) kill(pid_, SIGKILL);
    int status = 0;
    rusage usage{};
    wait4(pid_, &status, 0, &usage);  // its usage and its reaped children's
    pid_ = -1;
    result.seconds = monotonic_seconds() - started_;
    result.cpu_seconds = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
    if (timed_out) {
        result.exit_code = -1;
    } else if (WIFEXITED(status)) {
        result.exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
        result.exit_code = 128 + WTERMSIG(status);
        result.killed_by = WTERMSIG(status);
    }
    return result;
}

DirectProcess::DirectProcess(const std::vector<std::string>& args,
                             const std::map<std::string, std::string>& extra_env, const std::string& prefix)
    : marker_(next_marker()), prefix_(prefix) {
    std::vector<std::string> env_strings = child_environment(extra_env, marker_);
    std::vector<std::string> argv_strings = args;
    std::vector<char*> argv = c_strings(argv_strings), envp = c_strings(env_strings);
    const std::string out = prefix + ".stdout", err = prefix + ".stderr", status = prefix + ".status";
    pid_ = fork();
    if (pid_ == 0) {
        const int flags = O_WRONLY | O_CREAT | O_TRUNC;
        if (dup2(open(out.c_str(), flags, 0644), 1) < 0 || dup2(open(err.c_str(), flags, 0644), 2) < 0 ||
            dup2(open(status.c_str(), flags, 0644), 3) < 0)
            _exit(126);
        execve(argv[0], argv.data(), envp.data());
        _exit(127);
    }
}

DirectProcess::~DirectProcess() {
    if (pid_ > 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
    }
}

int DirectProcess::wait(double timeout_s) {
    int status = 0;
    const bool exited = wait_until([&] { return waitpid(pid_, &status, WNOHANG) == pid_; }, timeout_s);
    if (!exited) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        pid_ = -1;
        return -1;
    }
    exited_at_ = monotonic_seconds();
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string DirectProcess::stderr_text() const { return read_file(prefix_ + ".stderr"); }
std::string DirectProcess::status_text() const { return read_file(prefix_ + ".status"); }

LaunchResult run_launch(const std::vector<std::string>& args,
                        const std::map<std::string, std::string>& extra_env, double timeout_s) {
    Launch launch(args, extra_env);
    return launch.wait(timeout_s);
}

LaunchResult run_leaving_nothing(const std::vector<std::string>& args,
                                 const std::map<std::string, std::string>& extra_env, double timeout_s) {
    Launch launch(args, extra_env);
    LaunchResult r = launch.wait(timeout_s);
    CHECK(wait_until([&] { return processes_with_marker(launch.marker()).empty(); }, 5));
    return r;
}

std::vector<pid_t> processes_with_marker(const std::string& marker) {
    const std::string needle = "DP_TEST_MARKER=" + marker;
    std::vector<pid_t> found;
    DIR* proc = opendir("/proc");
    if (!proc) return found;
    while (dirent* entry = readdir(proc)) {
        char* end = nullptr;
        const long pid = std::strtol(entry->d_name, &end, 10);
        if (*end != '\0' || pid <= 0) continue;
        const std::string base = std::string("/proc/") + entry->d_name;
        std::ifstream stat(base + "/stat");
        std::string stat_line;
        std::getline(stat, stat_line);
        const auto paren = stat_line.rfind(')');
        if (paren == std::string::npos || paren + 2 >= stat_line.size() || stat_line[paren + 2] == 'Z')
            continue;
        std::ifstream env_file(base + "/environ", std::ios::binary);
        std::stringstream env;
        env << env_file.rdbuf();
        const std::string text = env.str();
        std::size_t start = 0;
        while (start < text.size()) {
            std::size_t end_of = text.find('\0', start);
            if (end_of == std::string::npos) end_of = text.size();
            if (text.compare(start, end_of - start, needle) == 0) {
                found.push_back(static_cast<pid_t>(pid));
                break;
            }
            start = end_of + 1;
        }
    }
    closedir(proc);
    return found;
}

pid_t stopped_process(const std::string& marker, double timeout_s) {
    pid_t stopped = -1;
    wait_until(
        [&] {
            for (const pid_t pid : processes_with_marker(marker)) {
                std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
                std::string line;
                std::getline(stat, line);
                const auto paren = line.rfind(')');
                if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'T') {
                    stopped = pid;
                    return true;
                }
            }
            return false;
        },
        timeout_s);
    return stopped;
}

bool wait_until(const std::function<bool()>& pred, double timeout_s) {
    const double deadline = monotonic_seconds() + timeout_s;
    while (monotonic_seconds() < deadline) {
        if (pred()) return true;
        usleep(5000);
    }
    return pred();
}

std::string make_temp_dir() {
    char templ[] = "/tmp/dp-launch-test-XXXXXX";
    if (!mkdtemp(templ)) std::abort();
    return templ;
}

std::string red_circle_prompts(const std::string& dir, int n) {
    std::string text;
    for (int i = 0; i < n; ++i) text += "a red circle number " + std::to_string(i) + "\n";
    const std::string path = dir + "/prompts.txt";
    std::ofstream(path) << text;
    return path;
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

bool file_exists(const std::string& path) {
    struct stat st {};
    return stat(path.c_str(), &st) == 0;
}

}  // namespace dp::test
