#include "launcher/orphan_guard.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "launcher/errors.h"
#include "launcher/process.h"

namespace dp::launcher {
namespace {

struct Message {
    char op;  // 'w' watch, 'f' forget, 'q' clean goodbye
    pid_t group;
};

// A whole small file of /proc, or "" when it cannot be read (the process is gone, or not ours).
std::string read_small(const std::string& path, std::size_t limit) {
    std::string text;
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return text;
    char buf[16384];
    while (text.size() < limit) {
        const ssize_t n = read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        text.append(buf, static_cast<std::size_t>(n));
    }
    close(fd);
    return text;
}

struct ProcEntry {
    pid_t pid = 0;
    pid_t ppid = 0;
    bool zombie = false;
};

// /proc/PID/stat's state and parent; false when the process is gone.
bool read_stat(pid_t pid, ProcEntry& e) {
    const std::string stat = read_small("/proc/" + std::to_string(pid) + "/stat", 4096);
    const std::size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 4 >= stat.size()) return false;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(stat.c_str() + paren + 2, "%c %d", &state, &ppid) != 2) return false;
    e.pid = pid;
    e.ppid = ppid;
    e.zombie = state == 'Z' || state == 'X';
    return true;
}

bool has_environment_entry(pid_t pid, const std::string& entry) {
    const std::string env = read_small("/proc/" + std::to_string(pid) + "/environ", 1u << 20);
    for (std::size_t start = 0; start < env.size();) {
        std::size_t end = env.find('\0', start);
        if (end == std::string::npos) end = env.size();
        if (env.compare(start, end - start, entry) == 0) return true;
        start = end + 1;
    }
    return false;
}

void sleep_ms(int ms) {
    timespec ts{ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

[[noreturn]] void guard_main(int read_fd, const std::string& job_id) {
    // Out of the launcher's session and process group: a signal to that group must not reach us.
    setsid();
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
    kill_job_processes(job_id, std::vector<pid_t>(groups.begin(), groups.end()));
    _exit(0);
}

}  // namespace

std::string new_job_id() {
    std::random_device random;
    char text[64];
    std::snprintf(text, sizeof(text), "%ld-%08x%08x", static_cast<long>(getpid()), random(), random());
    return text;
}

std::vector<pid_t> find_job_processes(const std::string& job_id, const std::vector<pid_t>& roots,
                                      pid_t spare) {
    const std::string entry = std::string(kJobIdVariable) + "=" + job_id;
    const pid_t self = getpid();
    std::vector<ProcEntry> all;
    if (DIR* proc = opendir("/proc")) {
        while (dirent* d = readdir(proc)) {
            char* end = nullptr;
            const long pid = std::strtol(d->d_name, &end, 10);
            ProcEntry e;
            if (*end == '\0' && pid > 0 && read_stat(static_cast<pid_t>(pid), e)) all.push_back(e);
        }
        closedir(proc);
    }
    std::multimap<pid_t, pid_t> children;
    for (const ProcEntry& e : all) children.emplace(e.ppid, e.pid);
    std::set<pid_t> found;
    std::vector<pid_t> todo(roots.begin(), roots.end());
    while (!todo.empty()) {
        const pid_t p = todo.back();
        todo.pop_back();
        const auto [first, last] = children.equal_range(p);
        for (auto it = first; it != last; ++it)
            if (found.insert(it->second).second) todo.push_back(it->second);
    }
    for (const ProcEntry& e : all)
        if (!found.count(e.pid) && !e.zombie && has_environment_entry(e.pid, entry)) found.insert(e.pid);
    std::vector<pid_t> out;
    for (const ProcEntry& e : all)
        if (found.count(e.pid) && !e.zombie && e.pid != self && e.pid != spare) out.push_back(e.pid);
    return out;
}

int kill_job_processes(const std::string& job_id, const std::vector<pid_t>& roots, pid_t spare) {
    int killed = 0;
    std::set<pid_t> signalled;
    for (int sweep = 0; sweep < 100; ++sweep) {
        bool fresh = false;
        for (pid_t p : find_job_processes(job_id, roots, spare)) {
            kill(p, SIGKILL);
            if (signalled.insert(p).second) ++killed, fresh = true;
        }
        // A process SIGKILLed a moment ago may still be listed; only new ones mean another sweep
        // (what was killed may have forked in between).
        if (!fresh) break;
        sleep_ms(10);
    }
    return killed;
}

OrphanGuard::OrphanGuard(std::string job_id) : job_id_(std::move(job_id)) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw SystemError(errno_message("cannot create the orphan guard's pipe"));
    UniqueFd read_end(fds[0]), write_end(fds[1]);
    pid_ = fork();
    if (pid_ < 0) throw SystemError(errno_message("cannot fork the orphan guard"));
    if (pid_ == 0) {
        write_end.release();  // closed by close_range in guard_main
        guard_main(read_end.get(), job_id_);
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
