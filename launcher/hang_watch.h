#pragma once
// Hang detection for the supervisor (Note [hang detection]): when each rank is due to have said
// something, and which rank a hang names. Pure logic over what the supervisor knows of its ranks
// and a clock reading, so that it is tested without processes; the supervisor polls until
// next_deadline() and then asks check().

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/status_events.h"

namespace dp::launcher {

// Note [hang detection]: a rank is alive while its status channel speaks; each heartbeat says
// what it is doing. Before its first heartbeat and while it loads it may be silent for
// --load-timeout, while it generates for --rank-timeout. While it waits for the others
// (RankPhase::kWaiting) its silence is the others' consequence, not a hang, with two exceptions:
// - a stopped or traced process (SIGSTOP, a debugger, a frozen node) is a hang in any phase once
//   it has been silent for --rank-timeout (a loading one too, before --load-timeout): nothing
//   else moves it;
// - when this launcher watches every rank of the job (one node), every one still runs and every
//   one has been waiting for --rank-timeout, nobody is working: a hang, naming the rank waiting
//   longest. (A dp-worker leaves only after every rank has finished waiting: ranks that wait on
//   after another has exited are its failure's consequence, which the supervisor reports.)
// Ranks silent past --rank-timeout that are not a hang yet are looked at again every
// kRecheckInterval. The job as a whole may run for --timeout. A timeout of 0 is none. The rank
// silent longest is named first, a stopped process before all: that is the cause, the others are
// waiting for it.

using HangClock = std::chrono::steady_clock;

// What the supervisor knows of one rank's liveness (its Rank extends it).
struct RankLiveness {
    int rank = 0;
    pid_t pid = -1;
    bool running = false;
    HangClock::time_point heard;                   // the last line on its status channel
    std::optional<protocol::HeartbeatEvent> beat;  // the last heartbeat
};

// A line arrived on `r`'s status channel at `now`: it is alive, and a heartbeat says what it is
// doing. A malformed line only counts as a sign of life (the listener reports it).
void on_status_line(RankLiveness& r, std::string_view line, HangClock::time_point now);

// Why the watch would stop the job.
enum class HangKind { kHang, kJobTimeout };

struct HangVerdict {
    HangKind kind = HangKind::kHang;
    std::size_t index = 0;  // into the ranks given: the rank a hang names (0 for a job timeout)
    std::string message;    // "rank 3 hung while ...: no heartbeat for 12.00 s (--rank-timeout 10.00 s); ..."
};

struct HangTimeouts {
    double load_s = 0;  // --load-timeout
    double rank_s = 0;  // --rank-timeout
    double job_s = 0;   // --timeout
    // Whether the ranks have status channels at all (the main job); without them only the job's
    // --timeout applies.
    bool heartbeats = true;
    // Whether these are all of the job's ranks (one node): then every rank waiting is a hang.
    bool whole_job = true;
};

// How often ranks silent past --rank-timeout that are not a hang yet (waiting, or loading within
// --load-timeout) are looked at again.
constexpr std::chrono::milliseconds kRecheckInterval{500};

// What /proc says of a process that has gone quiet ("its process is stopped (...)"), or "" when
// it cannot be read.
std::string process_state(pid_t pid);

class HangWatch {
  public:
    HangWatch() = default;
    HangWatch(HangTimeouts timeouts, HangClock::time_point job_started)
        : timeouts_(timeouts), job_started_(job_started) {}

    // When `r`'s silence is first looked at: past it a generating rank is a hang, a waiting or
    // loading one when its process is stopped (or, waiting, when every rank waits); nullopt: never
    // (not running, or no timeout).
    std::optional<HangClock::time_point> silence_deadline(const RankLiveness& r) const;

    // The earliest of the job's --timeout and every rank's silence deadline, a deadline already
    // past at `now` counting as now + kRecheckInterval; nullopt: none.
    std::optional<HangClock::time_point> next_deadline(const std::vector<const RankLiveness*>& ranks,
                                                       HangClock::time_point now) const;

    // The job past --timeout, else the rank silent past its deadline that a hang names (with the
    // other silent ranks), at `now`; nullopt: neither. `state` reads a process's state.
    std::optional<HangVerdict> check(const std::vector<const RankLiveness*>& ranks, HangClock::time_point now,
                                     const std::function<std::string(pid_t)>& state = process_state) const;

  private:
    HangTimeouts timeouts_;
    HangClock::time_point job_started_;
};

// `s` seconds as a clock duration.
HangClock::duration from_seconds(double s);
// A duration as "12.34 s".
std::string seconds_text(HangClock::duration d);

}  // namespace dp::launcher
