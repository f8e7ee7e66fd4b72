#include "launcher/output_folder.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <string>

#include "launcher/errors.h"
#include "launcher/system_info.h"

namespace dp::launcher {
namespace {

std::string utc_now() {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

std::string read_all(int fd) {
    std::string text;
    char buf[512];
    for (off_t at = 0;;) {
        const ssize_t n = pread(fd, buf, sizeof(buf), at);
        if (n <= 0) break;
        text.append(buf, static_cast<std::size_t>(n));
        at += n;
        if (text.size() > 4096) break;
    }
    while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
    return text;
}

bool is_number(const std::string& s) {
    return !s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos;
}

bool process_alive(pid_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

}  // namespace

OutputLock OutputLock::acquire(const std::string& dir) {
    const std::string path = dir + "/.dp-lock";
    UniqueFd fd(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd) throw IoError(errno_message("--output-dir " + dir + ": cannot open its lock file " + path));
    if (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK)
            throw IoError(errno_message("--output-dir " + dir + ": cannot lock " + path));
        // The owner writes its name right after locking; give it a moment to do so.
        std::string owner;
        for (int i = 0; i < 20 && (owner = read_all(fd.get())).empty(); ++i) usleep(5000);
        throw UsageError("--output-dir " + dir + ": another job is writing there (" +
                         (owner.empty() ? std::string("its owner has not written its name yet") : owner) +
                         "); wait for it to end, or choose another --output-dir");
    }
    const std::string owner =
        "dp-launch pid " + std::to_string(getpid()) + " on " + host_name() + ", started " + utc_now() + "\n";
    if (ftruncate(fd.get(), 0) != 0 || pwrite(fd.get(), owner.data(), owner.size(), 0) < 0) {
        // The lock is held either way; the owner's name is only for the message of a refused job.
    }
    OutputLock lock;
    lock.fd_ = std::move(fd);
    return lock;
}

std::vector<std::string> remove_leftovers(const std::string& dir) {
    std::vector<std::string> removed;
    DIR* d = opendir(dir.c_str());
    if (!d) return removed;
    while (const dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        const std::size_t tmp = name.rfind(".tmp.");
        bool stale = tmp != std::string::npos && is_number(name.substr(tmp + 5));
        const std::string job_prefix = ".dp-job-", job_suffix = ".json";
        if (!stale && name.size() > job_prefix.size() + job_suffix.size() &&
            name.compare(0, job_prefix.size(), job_prefix) == 0 &&
            name.compare(name.size() - job_suffix.size(), job_suffix.size(), job_suffix) == 0) {
            const std::string pid =
                name.substr(job_prefix.size(), name.size() - job_prefix.size() - job_suffix.size());
            stale = is_number(pid) && !process_alive(static_cast<pid_t>(std::stol(pid)));
        }
        if (stale && std::remove((dir + "/" + name).c_str()) == 0) removed.push_back(name);
    }
    closedir(d);
    return removed;
}

}  // namespace dp::launcher
