#include "strategies/mapped_files.h"

#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

namespace dp::strategies {
namespace {

// What says a path still names the file that was mapped.
struct Identity {
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = 0;
    timespec mtime{};
};

Identity identity_of(const struct stat& st) { return {st.st_dev, st.st_ino, st.st_size, st.st_mtim}; }

// One mapping. The signal handler reads begin, end and shown only: shown is written while begin
// is 0, and begin is published last.
struct Slot {
    std::atomic<std::uintptr_t> begin{0};
    std::atomic<std::uintptr_t> end{0};
    char shown[1024] = {};
    // Read and written under g_mutex only.
    std::string path;
    Identity identity;
};

constexpr std::size_t kSlots = 256;
std::array<Slot, kSlots> g_slots;
std::mutex g_mutex;
std::map<std::string, Identity> g_known;  // with the guard on: each path's file when first mapped
bool g_guarded = false;
char g_prefix[64] = {};
std::atomic<int> g_reporting{0};

constexpr const char* kSettle =
    "; a job's model and adapter files must stay as they are until it ends: run it again once they have "
    "settled";

// Why the file `now` at `path` is not `was`, or empty when it is.
std::string difference(const std::string& path, const Identity& was, const Identity& now) {
    if (now.dev != was.dev || now.ino != was.ino)
        return path + " was replaced while the job ran (another file is at its path now)" + kSettle;
    if (now.size != was.size)
        return path + " changed or was truncated while the job ran (" + std::to_string(was.size) +
               " bytes when it was mapped, " + std::to_string(now.size) + " now)" + kSettle;
    if (now.mtime.tv_sec != was.mtime.tv_sec || now.mtime.tv_nsec != was.mtime.tv_nsec)
        return path + " was rewritten while the job ran (modified after it was mapped)" + kSettle;
    return {};
}

// Why the file at `path` is not `was` any more, or empty when it still is.
std::string difference(const std::string& path, const Identity& was) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
        return path + " was removed while the job ran (" + std::strerror(errno) + ")" + kSettle;
    return difference(path, was, identity_of(st));
}

// A line built without allocating, for the signal handler.
class SignalLine {
  public:
    void add(const char* s) {
        while (*s && n_ < sizeof(buf_) - 1) buf_[n_++] = *s++;
    }
    void hex(std::uintptr_t v) {
        char digits[2 + 2 * sizeof(v)];
        std::size_t k = sizeof(digits);
        do {
            digits[--k] = "0123456789abcdef"[v & 15];
            v >>= 4;
        } while (v && k > 2);
        digits[--k] = 'x';
        digits[--k] = '0';
        for (; k < sizeof(digits) && n_ < sizeof(buf_) - 1; ++k) buf_[n_++] = digits[k];
    }
    void write_to(int fd) const {
        std::size_t done = 0;
        while (done < n_) {
            const ssize_t w = ::write(fd, buf_ + done, n_ - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) return;
            done += static_cast<std::size_t>(w);
        }
    }

  private:
    char buf_[2048] = {};
    std::size_t n_ = 0;
};

// The slot whose mapping holds `addr`, or nullptr.
const Slot* slot_at(std::uintptr_t addr) {
    for (const Slot& s : g_slots) {
        const std::uintptr_t b = s.begin.load(std::memory_order_acquire);
        if (b != 0 && addr >= b && addr < s.end.load(std::memory_order_acquire)) return &s;
    }
    return nullptr;
}

void on_sigbus(int sig, siginfo_t* info, void*) {
    // Several threads may fault on the same file at once: the first reports, the others wait for
    // its _exit.
    if (g_reporting.exchange(1) != 0)
        for (;;) ::pause();
    const int saved = errno;
    const auto addr = reinterpret_cast<std::uintptr_t>(info->si_addr);
    const Slot* s = info->si_code > 0 ? slot_at(addr) : nullptr;  // <= 0: sent, not a fault
    if (s) {
        SignalLine line;
        line.add(g_prefix);
        line.add(s->shown);
        line.add(" changed or was truncated while the job ran (mapped at ");
        line.hex(s->begin.load(std::memory_order_acquire));
        line.add("-");
        line.hex(s->end.load(std::memory_order_acquire));
        line.add(", fault at ");
        line.hex(addr);
        line.add(")");
        line.add(kSettle);
        line.add("\n");
        line.write_to(STDERR_FILENO);
        ::_exit(kExitFileChanged);
    }
    // Not ours: the default action, once this handler returns.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(sig, &dfl, nullptr);
    ::raise(sig);
    errno = saved;
}

}  // namespace

void register_mapping(const void* data, std::size_t size, const std::string& path, const struct stat& st) {
    std::lock_guard<std::mutex> lock(g_mutex);
    const Identity id = identity_of(st);
    if (g_guarded) {
        const auto known = g_known.find(path);
        if (known != g_known.end()) {
            const std::string why = difference(path, known->second, id);
            if (!why.empty()) throw protocol::IoError(why);
        }
        g_known.emplace(path, id);
    }
    for (Slot& s : g_slots) {
        if (s.begin.load(std::memory_order_relaxed) != 0) continue;
        const std::size_t n = std::min(path.size(), sizeof(s.shown) - 4);
        std::memcpy(s.shown, path.data(), n);
        std::strcpy(s.shown + n, n < path.size() ? "..." : "");
        s.path = path;
        s.identity = id;
        const auto b = reinterpret_cast<std::uintptr_t>(data);
        s.end.store(b + size, std::memory_order_release);
        s.begin.store(b, std::memory_order_release);
        return;
    }
}

void unregister_mapping(const void* data) {
    std::lock_guard<std::mutex> lock(g_mutex);
    const auto b = reinterpret_cast<std::uintptr_t>(data);
    for (Slot& s : g_slots)
        if (s.begin.load(std::memory_order_relaxed) == b) s.begin.store(0, std::memory_order_release);
}

std::string changed_mapped_file() {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const Slot& s : g_slots) {
        if (s.begin.load(std::memory_order_relaxed) == 0) continue;
        std::string why = difference(s.path, s.identity);
        if (!why.empty()) return why;
    }
    return {};
}

void guard_mapped_files(const char* prefix) {
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        g_guarded = true;
        std::strncpy(g_prefix, prefix, sizeof(g_prefix) - 1);
        for (const Slot& s : g_slots)
            if (s.begin.load(std::memory_order_relaxed) != 0) g_known.emplace(s.path, s.identity);
    }
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sigfillset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO;
    ::sigaction(SIGBUS, &sa, nullptr);
}

}  // namespace dp::strategies
