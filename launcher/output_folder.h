#pragma once
// The main job's output folder: one job owns it at a time (Note [output folder lock]), files in it
// are replaced whole, and what killed runs left behind is cleared away.

#include <string>
#include <vector>

#include "launcher/unique_fd.h"

namespace dp::launcher {

// Note [output folder lock]
// Two jobs started together into one --output-dir both passed the check for existing outputs
// before either wrote anything, and then replaced each other's images. A job now holds an
// exclusive flock on DIR/.dp-lock from before that check until it ends. flock belongs to the open
// file, so the kernel drops it when the job dies, even by SIGKILL: a stale lock cannot outlive
// its owner, and the file itself is never removed (removing it would let two jobs lock two
// different files of one name). The file holds the owner's pid, host and start time, so that the
// job refused can name it.
class OutputLock {
  public:
    // Locks DIR/.dp-lock (DIR exists) without waiting. Throws UsageError naming the folder and
    // the job that holds it (pid, host, start time), IoError when the file cannot be opened.
    static OutputLock acquire(const std::string& dir);

    OutputLock() = default;
    OutputLock(OutputLock&&) = default;
    OutputLock& operator=(OutputLock&&) = default;
    bool held() const { return static_cast<bool>(fd_); }

  private:
    UniqueFd fd_;
};

// Removes what killed runs left in `dir`: temporary files (NAME.tmp.PID, Note [atomic file]) and job
// files (.dp-job-PID.json) whose pid is not alive. Only while holding its OutputLock. Returns the
// names removed.
std::vector<std::string> remove_leftovers(const std::string& dir);

}  // namespace dp::launcher
