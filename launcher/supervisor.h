#pragma once
// Running a job: spawn every local rank, multiplex their output, supervise them, and report.

#include <string>
#include <string_view>
#include <vector>

#include "launcher/launch_spec.h"

namespace dp::launcher {

// Receives the lines ranks write on their status channel (fd 3, named by DP_STATUS_FD), one call
// per whole line, from the launcher's single thread.
class StatusListener {
  public:
    virtual ~StatusListener() = default;
    virtual void on_status(int rank, std::string_view line) = 0;
    // Called before the ranks restart after a failure (--max-restarts), when none is running.
    virtual void on_restart() {}
    // While ranks run, on_tick is called at least every tick_ms() milliseconds (-1: never), from
    // the same thread, and may be called more often.
    virtual int tick_ms() const { return -1; }
    virtual void on_tick() {}
};

// Runs spec.command once per local rank and returns dp-launch's exit code: 0 when every rank
// exited 0; else the first failing rank's exit code, or 128 + its signal; or 128 + the signal that
// stopped the launcher. On the first failure every other rank's process group gets SIGTERM, then
// SIGKILL after the grace period, and a report names the rank, its code and its last stderr lines.
// Throws Error for what prevents starting (an unwritable log folder, a failed fork).
// With a listener, each rank also gets a status channel.
int run_launch(const LaunchSpec& spec, StatusListener* listener = nullptr);

// With --log-dir DIR: from now on dp-launch's own lines (what it prints of its own: the mesh, the
// schedule, progress, failure reports, the summary) also go to DIR/launcher.log, appended after a
// header naming the run and the time, as each rank's output goes to DIR/rank_N.*. Throws IoError
// when DIR cannot be made or the file opened.
void open_launcher_log(const LaunchSpec& spec);

}  // namespace dp::launcher
