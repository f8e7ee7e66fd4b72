#pragma once
// Note [resource failures in a rank]: a rank refused a resource by the system (file descriptors,
// memory or address space, threads or processes) exits 71 (kExitSystem, README "Exit codes") with
// a message naming the rank and the resource, wherever the refusal surfaces:
// - before it joins the job, its open-file limit is raised to the hard limit when it is short of
//   what its connections need, and refused by name when even that is short (a store whose rank 0
//   cannot accept connections would otherwise keep the others retrying for the whole timeout);
// - std::bad_alloc and std::system_error, and any error whose text is the system's word for an
//   exhausted resource (c10d's, gloo's, a loader's), are resource failures, not internal errors,
//   collective failures or corrupt models;
// - an exception that escapes on another thread (std::terminate) is reported the same way and the
//   rank exits with its code instead of aborting (134).
// Light header: std only (the .cpp includes c10's Logging.h).

#include <exception>
#include <string>

namespace dp::runtime {

// The exhausted resource an error's text names ("file descriptors", "memory", "threads or
// processes"), or "" when it names none.
std::string exhausted_resource(const std::string& what);

// The exit code and message for `e` escaping rank `rank`'s work: 71 and the resource for a
// resource failure; else `code` and `what` unchanged.
struct RankFailure {
    int code;
    std::string message;
};
RankFailure classify_rank_failure(const std::exception& e, int code, const std::string& what);

// Raises the soft open-file limit towards the hard one when the rank has fewer than its
// connections to `world` ranks need (gloo: a socket to every other rank per group); throws
// SystemError (71) naming both figures and `ulimit -n` when the hard limit is short too.
void ensure_open_file_headroom(int world, bool gloo);

// std::terminate in this process (an exception that escaped a thread, a joinable thread
// destroyed) reports rank `rank`'s failure on stderr and on status channel `status_fd` (-1: none)
// and exits with its code (71 for a resource, else 70) instead of aborting.
void install_rank_terminate_handler(int rank, int status_fd);

// LibTorch's failed checks throw (c10::Error) rather than abort: called at the rank's start and
// again once its groups are formed.
void keep_library_errors_thrown();

}  // namespace dp::runtime
