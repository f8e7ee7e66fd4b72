#include "runtime/rank_failure.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <system_error>

#include <c10/util/Logging.h>

#include "protocol/errors.h"
#include "protocol/status_events.h"

namespace dp::runtime {
namespace {

int g_rank = 0;
int g_status_fd = -1;

int open_fds() {
    int n = 0;
    if (DIR* d = opendir("/proc/self/fd")) {
        while (readdir(d)) ++n;
        closedir(d);
        n -= 3;  // ".", ".." and the directory's own descriptor
    }
    return std::max(n, 0);
}

void write_all(int fd, const std::string& text) {
    const char* p = text.data();
    std::size_t n = text.size();
    while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w <= 0) return;
        p += w;
        n -= static_cast<std::size_t>(w);
    }
}

[[noreturn]] void on_terminate() {
    RankFailure f{protocol::kExitInternal,
                  "internal error: std::terminate without an exception (a thread left running)"};
    if (const std::exception_ptr current = std::current_exception()) {
        try {
            std::rethrow_exception(current);
        } catch (const protocol::Error& e) {
            f = classify_rank_failure(e, e.exit_code(), e.what());
        } catch (const std::exception& e) {
            f = classify_rank_failure(e, protocol::kExitInternal, std::string("internal error: ") + e.what());
        } catch (...) {
            f.message = "internal error: an exception of unknown type escaped a thread";
        }
    }
    try {
        const std::string message = "rank " + std::to_string(g_rank) + ": " + f.message;
        write_all(STDERR_FILENO, "dp-worker: " + message + "\n");
        if (g_status_fd >= 0)
            write_all(g_status_fd, protocol::status_line(protocol::RankErrorEvent{g_rank, f.code, message}));
    } catch (...) {
        write_all(STDERR_FILENO, "dp-worker: a thread failed and the failure could not be described\n");
    }
    std::_Exit(f.code);
}

}  // namespace

std::string exhausted_resource(const std::string& what) {
    static const struct {
        const char* text;
        const char* resource;
    } kWords[] = {
        {"Too many open files", "file descriptors (ulimit -n)"},
        {"EMFILE", "file descriptors (ulimit -n)"},
        {"ENFILE", "file descriptors (the system's file table)"},
        {"Cannot allocate memory", "memory (RAM, or the address-space limit ulimit -v)"},
        {"ENOMEM", "memory (RAM, or the address-space limit ulimit -v)"},
        {"std::bad_alloc", "memory (RAM, or the address-space limit ulimit -v)"},
        {"out of memory", "memory (RAM, or the address-space limit ulimit -v)"},
        {"failed to map segment", "memory (RAM, or the address-space limit ulimit -v)"},
        {"Resource temporarily unavailable",
         "threads or processes (ulimit -u), or memory for a thread's stack"},
        {"EAGAIN", "threads or processes (ulimit -u), or memory for a thread's stack"},
        {"No buffer space available", "socket buffers (the kernel's network memory)"},
    };
    for (const auto& w : kWords)
        if (what.find(w.text) != std::string::npos) return w.resource;
    return {};
}

RankFailure classify_rank_failure(const std::exception& e, int code, const std::string& what) {
    std::string resource;
    if (dynamic_cast<const std::bad_alloc*>(&e)) {
        resource = "memory (RAM, or the address-space limit ulimit -v)";
    } else if (const auto* s = dynamic_cast<const std::system_error*>(&e)) {
        resource = exhausted_resource(s->code().message());
        if (resource.empty()) resource = exhausted_resource(what);
        if (resource.empty()) resource = "a system resource (" + s->code().message() + ")";
    } else {
        resource = exhausted_resource(what);
    }
    if (resource.empty()) return {code, what};
    // The error's own first line, for the detail.
    std::string detail = what.substr(0, std::min(what.find('\n'), std::size_t{400}));
    if (detail.rfind("internal error: ", 0) == 0) detail = detail.substr(16);
    return {protocol::kExitSystem, "the system refused " + resource + ": " + detail};
}

void ensure_open_file_headroom(int world, bool gloo) {
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
    // Gloo connects every pair of ranks in each group (the world and the strategy's sub-groups:
    // about two sockets a peer); NCCL's store needs one. Model files are opened one at a time.
    const rlim_t needed = static_cast<rlim_t>(open_fds()) + 32 + (gloo ? 2 * static_cast<rlim_t>(world) : 4);
    if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur >= needed) return;
    if (limit.rlim_cur == RLIM_INFINITY) return;
    if (limit.rlim_max == RLIM_INFINITY || limit.rlim_max >= needed) {
        limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? std::max<rlim_t>(needed, 65536) : limit.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &limit) == 0) return;
    }
    throw protocol::SystemError("the system refused file descriptors: the open-file limit (ulimit -n) is " +
                                std::to_string(limit.rlim_max) + ", and this rank of " +
                                std::to_string(world) + " needs about " + std::to_string(needed) +
                                " (its connections to the other ranks); raise it, e.g. ulimit -n " +
                                std::to_string(std::max<rlim_t>(needed * 2, 1024)) + ", before dp-launch");
}

void install_rank_terminate_handler(int rank, int status_fd) {
    g_rank = rank;
    g_status_fd = status_fd;
    std::set_terminate(on_terminate);
    keep_library_errors_thrown();
}

void keep_library_errors_thrown() {
    // LibTorch's failed checks (its allocator's "can't allocate memory" among them) throw unless
    // this flag asks them to abort, and in a rank it was found set: under an address-space limit
    // the allocator then aborted (134) where it should have thrown.
    FLAGS_caffe2_use_fatal_for_enforce = false;
}

}  // namespace dp::runtime
