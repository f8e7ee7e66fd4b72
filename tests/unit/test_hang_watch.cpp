// Hang detection (Note [hang detection], launcher/hang_watch.h) on a clock the test sets: which
// allowance applies in each phase, the next deadline, and which rank a hang names. The ranks'
// process states are given, except in the last case, which stops a real child with SIGSTOP.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "launcher/hang_watch.h"
#include "protocol/status_events.h"

using namespace dp::launcher;
using dp::protocol::HeartbeatEvent;
using dp::protocol::RankPhase;

namespace {

const HangClock::time_point t0{};

HangClock::time_point at(double s) { return t0 + from_seconds(s); }

RankLiveness rank_heard(int rank, double heard_s, std::optional<RankPhase> phase = std::nullopt) {
    RankLiveness r;
    r.rank = rank;
    r.pid = 1000 + rank;
    r.running = true;
    r.heard = at(heard_s);
    if (phase) {
        HeartbeatEvent beat;
        beat.rank = rank;
        beat.phase = *phase;
        if (*phase == RankPhase::kGenerating) {
            beat.index = 4;
            beat.step = 3;
            beat.steps = 28;
        }
        r.beat = beat;
    }
    return r;
}

std::vector<const RankLiveness*> view(const std::vector<RankLiveness>& ranks) {
    std::vector<const RankLiveness*> out;
    for (const RankLiveness& r : ranks) out.push_back(&r);
    return out;
}

// Process states by pid; the rest are "sleeping".
std::function<std::string(pid_t)> states(std::map<pid_t, std::string> by_pid) {
    return [by_pid](pid_t pid) {
        const auto it = by_pid.find(pid);
        return it == by_pid.end() ? std::string("its process is sleeping") : it->second;
    };
}

const std::string kStopped = "its process is stopped (SIGSTOP, or a debugger)";

}  // namespace

TEST_CASE("each phase is looked at after --rank-timeout, a loading one given --load-timeout unless stopped") {
    const HangWatch watch({60, 10, 0, true}, t0);
    // Loading (before the first heartbeat too): looked at after --rank-timeout for a stopped process.
    CHECK(watch.silence_deadline(rank_heard(0, 5)) == at(15));
    CHECK(watch.silence_deadline(rank_heard(0, 5, RankPhase::kLoading)) == at(15));
    CHECK(watch.silence_deadline(rank_heard(0, 5, RankPhase::kGenerating)) == at(15));
    CHECK(watch.silence_deadline(rank_heard(0, 5, RankPhase::kWaiting)) == at(15));
    // Without --rank-timeout: --load-timeout while loading, nothing else.
    CHECK(HangWatch({60, 0, 0, true}, t0).silence_deadline(rank_heard(0, 5)) == at(65));
    CHECK_FALSE(HangWatch({60, 0, 0, true}, t0).silence_deadline(rank_heard(0, 5, RankPhase::kWaiting)));
    // A --load-timeout shorter than --rank-timeout comes first.
    CHECK(HangWatch({3, 10, 0, true}, t0).silence_deadline(rank_heard(0, 5)) == at(8));
    RankLiveness ended = rank_heard(0, 5, RankPhase::kGenerating);
    ended.running = false;
    CHECK_FALSE(watch.silence_deadline(ended));
    // A timeout of 0 is none; without status channels only the job's --timeout applies.
    CHECK_FALSE(HangWatch({60, 0, 0, true}, t0).silence_deadline(rank_heard(0, 5, RankPhase::kGenerating)));
    CHECK_FALSE(HangWatch({0, 0, 0, true}, t0).silence_deadline(rank_heard(0, 5)));
    CHECK_FALSE(HangWatch({60, 10, 0, false}, t0).silence_deadline(rank_heard(0, 5, RankPhase::kGenerating)));
}

TEST_CASE(
    "the next deadline is the earliest of the job's --timeout and every rank's silence, a passed one looked "
    "at again") {
    std::vector<RankLiveness> ranks = {rank_heard(0, 8, RankPhase::kGenerating),
                                       rank_heard(1, 2, RankPhase::kGenerating),
                                       rank_heard(2, 3, RankPhase::kWaiting)};
    CHECK(HangWatch({60, 10, 0, true}, t0).next_deadline(view(ranks), at(1)) == at(12));
    CHECK(HangWatch({60, 10, 7, true}, t0).next_deadline(view(ranks), at(1)) == at(7));
    CHECK(HangWatch({60, 10, 7, false}, t0).next_deadline(view(ranks), at(1)) == at(7));
    CHECK_FALSE(HangWatch({60, 10, 0, false}, t0).next_deadline(view(ranks), at(1)));
    ranks[1].heard = at(9);  // a line arrived
    CHECK(HangWatch({60, 10, 0, true}, t0).next_deadline(view(ranks), at(9)) == at(13));
    // Rank 2 waits past its deadline without being a hang: looked at again shortly, not at once.
    CHECK(HangWatch({60, 10, 0, true}, t0).next_deadline(view(ranks), at(14)) == at(14) + kRecheckInterval);
}

TEST_CASE(
    "a stopped rank is a hang in every phase, a waiting one only when stopped or when every rank waits") {
    const HangWatch watch({60, 10, 0, true}, t0);
    // Rank 1 waits past --rank-timeout while rank 0 works: not a hang, unless rank 1 is stopped.
    std::vector<RankLiveness> ranks = {rank_heard(0, 19, RankPhase::kGenerating),
                                       rank_heard(1, 2, RankPhase::kWaiting)};
    CHECK_FALSE(watch.check(view(ranks), at(20), states({})));
    auto v = watch.check(view(ranks), at(20), states({{1001, kStopped}}));
    REQUIRE(v);
    CHECK(v->index == 1);
    CHECK(v->message ==
          "rank 1 hung while waiting for the other ranks: no heartbeat for 18.00 s (--rank-timeout "
          "10.00 s); " +
              kStopped);
    // Every rank waiting past --rank-timeout: nobody works; the one waiting longest is named.
    ranks[0] = rank_heard(0, 1, RankPhase::kWaiting);
    v = watch.check(view(ranks), at(20), states({}));
    REQUIRE(v);
    CHECK(v->index == 0);
    CHECK(v->message ==
          "every running rank has waited for the others for more than --rank-timeout 10.00 s, so none "
          "is working: rank 0 has waited longest (19.00 s); its process is sleeping");
    CHECK_FALSE(watch.check(view(ranks), at(11.5), states({})));  // rank 1 within its allowance
    // Not when other nodes' ranks may still work, nor when one of them has left.
    CHECK_FALSE(HangWatch({60, 10, 0, true, false}, t0).check(view(ranks), at(20), states({})));
    ranks[1].running = false;
    CHECK_FALSE(watch.check(view(ranks), at(20), states({})));
    // Loading: a stopped process after --rank-timeout, any after --load-timeout.
    const std::vector<RankLiveness> loading = {rank_heard(0, 0, RankPhase::kLoading)};
    CHECK_FALSE(watch.check(view(loading), at(30), states({})));
    v = watch.check(view(loading), at(30), states({{1000, kStopped}}));
    REQUIRE(v);
    CHECK(v->message ==
          "rank 0 hung while loading the model: no heartbeat for 30.00 s (--rank-timeout 10.00 s); " +
              kStopped);
    v = watch.check(view(loading), at(61), states({}));
    REQUIRE(v);
    CHECK(v->message.find("(--load-timeout 60.00 s)") != std::string::npos);
}

TEST_CASE("a hang names the rank silent longest, its phase, its allowance and state, and the others silent") {
    const HangWatch watch({60, 10, 0, true}, t0);
    const std::vector<RankLiveness> ranks = {
        rank_heard(0, 8, RankPhase::kGenerating), rank_heard(1, 2, RankPhase::kGenerating),
        rank_heard(2, 4, RankPhase::kGenerating), rank_heard(3, 0, RankPhase::kWaiting)};
    CHECK_FALSE(watch.check(view(ranks), at(11.9), states({})));  // rank 1's deadline is 12
    const auto v = watch.check(view(ranks), at(15), states({}));
    REQUIRE(v);
    CHECK(v->kind == HangKind::kHang);
    CHECK(v->index == 1);
    CHECK(v->message ==
          "rank 1 hung while " + dp::protocol::describe(*ranks[1].beat) +
              ": no heartbeat for 13.00 s (--rank-timeout 10.00 s); its process is sleeping; also "
              "silent: rank(s) 2");
    // Before its first heartbeat it is --load-timeout's.
    const std::vector<RankLiveness> starting = {rank_heard(5, 0)};
    const auto s = watch.check(view(starting), at(61), [](pid_t) { return std::string(); });
    REQUIRE(s);
    CHECK(s->message ==
          "rank 5 hung while starting (no heartbeat yet): no heartbeat for 61.00 s (--load-timeout "
          "60.00 s)");
}

TEST_CASE("a stopped process is named before a rank silent longer, whatever their order") {
    const HangWatch watch({60, 10, 0, true}, t0);
    for (const bool stopped_first : {true, false}) {
        CAPTURE(stopped_first);
        std::vector<RankLiveness> ranks = {rank_heard(0, 1, RankPhase::kGenerating),
                                           rank_heard(1, 3, RankPhase::kGenerating),
                                           rank_heard(2, 0, RankPhase::kGenerating)};
        // Rank 1 is stopped; ranks 0 and 2 were silent longer and wait on it.
        if (stopped_first) std::swap(ranks[0], ranks[1]);
        const auto v = watch.check(view(ranks), at(20), states({{1001, kStopped}}));
        REQUIRE(v);
        CHECK(ranks[v->index].rank == 1);
        const std::string tail = "; " + kStopped + "; also silent: rank(s) 0, 2";
        CHECK(v->message.rfind("rank 1 hung while ", 0) == 0);
        CHECK(v->message.substr(v->message.size() - std::min(v->message.size(), tail.size())) == tail);
    }
}

TEST_CASE("the job's --timeout comes before any rank's silence, and every line is a sign of life") {
    const HangWatch watch({60, 10, 30, true}, t0);
    const std::vector<RankLiveness> ranks = {rank_heard(0, 0, RankPhase::kGenerating)};
    const auto v = watch.check(view(ranks), at(30), states({}));
    REQUIRE(v);
    CHECK(v->kind == HangKind::kJobTimeout);
    CHECK(v->message == "the job ran past --timeout 30.00 s (a rank may be hung)");

    RankLiveness r = rank_heard(0, 0);
    HeartbeatEvent beat;
    beat.rank = 0;
    beat.phase = RankPhase::kGenerating;
    beat.index = 2;
    beat.step = 1;
    beat.steps = 28;
    on_status_line(r, dp::protocol::status_line(beat), at(5));
    CHECK(r.heard == at(5));
    REQUIRE(r.beat);
    CHECK(r.beat->phase == RankPhase::kGenerating);
    CHECK(r.beat->step == 1);
    // A malformed heartbeat and any other line count as life, and keep the last heartbeat.
    on_status_line(r, "{\"event\": \"heartbeat\", \"rank\": ", at(6));
    CHECK(r.heard == at(6));
    CHECK(r.beat->step == 1);
    on_status_line(r, "not an event", at(7));
    CHECK(r.heard == at(7));
    CHECK(watch.silence_deadline(r) == at(17));
}

TEST_CASE("process_state reads /proc: a child stopped with SIGSTOP is stopped, a gone one is unreadable") {
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        pause();
        _exit(0);
    }
    REQUIRE(kill(child, SIGSTOP) == 0);
    int status = 0;
    REQUIRE(waitpid(child, &status, WUNTRACED) == child);
    CHECK(process_state(child) == kStopped);
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    CHECK(process_state(child).empty());
}
