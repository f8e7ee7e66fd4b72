#include "launcher/hang_watch.h"

#include <cstdio>
#include <cstring>

#include "protocol/errors.h"

namespace dp::launcher {

HangClock::duration from_seconds(double s) {
    return std::chrono::duration_cast<HangClock::duration>(std::chrono::duration<double>(s));
}

std::string seconds_text(HangClock::duration d) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.2f s", std::chrono::duration<double>(d).count());
    return buf;
}

std::string process_state(pid_t pid) {
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
    std::FILE* f = std::fopen(path, "re");
    if (!f) return "";
    char buf[512] = {};
    const std::size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    const char* paren = std::strrchr(buf, ')');
    if (n == 0 || !paren || paren[1] == '\0' || paren[2] == '\0') return "";
    switch (paren[2]) {
        case 'T':
        case 't':
            return "its process is stopped (SIGSTOP, or a debugger)";
        case 'D':
            return "its process is in uninterruptible sleep (disk, network file system or driver)";
        case 'R':
            return "its process is running";
        default:
            return "its process is sleeping";
    }
}

void on_status_line(RankLiveness& r, std::string_view line, HangClock::time_point now) {
    r.heard = now;
    if (line.find("\"heartbeat\"") == std::string_view::npos) return;
    try {
        if (auto event = protocol::parse_status_line(line))
            if (auto* beat = std::get_if<protocol::HeartbeatEvent>(&*event)) r.beat = *beat;
    } catch (const protocol::Error&) {
        // The listener reports malformed events.
    }
}

namespace {

bool loading(const RankLiveness& r) { return !r.beat || r.beat->phase == protocol::RankPhase::kLoading; }
bool waiting(const RankLiveness& r) { return r.beat && r.beat->phase == protocol::RankPhase::kWaiting; }

bool stopped(const std::string& state) { return state.find("stopped") != std::string::npos; }

}  // namespace

std::optional<HangClock::time_point> HangWatch::silence_deadline(const RankLiveness& r) const {
    if (!timeouts_.heartbeats || !r.running) return std::nullopt;
    if (waiting(r)) {
        if (timeouts_.rank_s <= 0) return std::nullopt;
        return r.heard + from_seconds(timeouts_.rank_s);
    }
    if (loading(r)) {
        // Looked at after --rank-timeout for a stopped process, a hang after --load-timeout anyway.
        double first = timeouts_.load_s;
        if (timeouts_.rank_s > 0 && (first <= 0 || timeouts_.rank_s < first)) first = timeouts_.rank_s;
        if (first <= 0) return std::nullopt;
        return r.heard + from_seconds(first);
    }
    if (timeouts_.rank_s <= 0) return std::nullopt;
    return r.heard + from_seconds(timeouts_.rank_s);
}

std::optional<HangClock::time_point> HangWatch::next_deadline(const std::vector<const RankLiveness*>& ranks,
                                                              HangClock::time_point now) const {
    std::optional<HangClock::time_point> next;
    if (timeouts_.job_s > 0) next = job_started_ + from_seconds(timeouts_.job_s);
    for (const RankLiveness* r : ranks) {
        auto d = silence_deadline(*r);
        if (d && *d <= now) d = now + kRecheckInterval;  // looked at, not a hang yet
        if (d && (!next || *d < *next)) next = d;
    }
    return next;
}

std::optional<HangVerdict> HangWatch::check(const std::vector<const RankLiveness*>& ranks,
                                            HangClock::time_point now,
                                            const std::function<std::string(pid_t)>& state) const {
    if (timeouts_.job_s > 0 && now >= job_started_ + from_seconds(timeouts_.job_s))
        return HangVerdict{HangKind::kJobTimeout, 0,
                           "the job ran past --timeout " + seconds_text(from_seconds(timeouts_.job_s)) +
                               " (a rank may be hung)"};
    // The rank silent longest is named first; a stopped process is named before all.
    std::optional<std::size_t> silent;
    bool silent_stopped = false;
    std::string others;
    std::size_t running = 0, waited_out = 0;  // running ranks; those waiting past --rank-timeout
    std::optional<std::size_t> longest_waiting;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
        const RankLiveness& r = *ranks[i];
        if (r.running) ++running;
        const auto d = silence_deadline(r);
        if (!d || now < *d) continue;
        const bool is_stopped = stopped(state(r.pid));
        if (waiting(r) && !is_stopped) {
            ++waited_out;
            if (!longest_waiting || r.heard < ranks[*longest_waiting]->heard) longest_waiting = i;
            continue;
        }
        const bool past_load =
            !loading(r) || timeouts_.load_s <= 0 || now >= r.heard + from_seconds(timeouts_.load_s);
        if (loading(r) && !is_stopped && (timeouts_.load_s <= 0 || !past_load)) continue;
        if (!silent || (is_stopped && !silent_stopped) ||
            (is_stopped == silent_stopped && r.heard < ranks[*silent]->heard)) {
            if (silent) others += (others.empty() ? "" : ", ") + std::to_string(ranks[*silent]->rank);
            silent = i;
            silent_stopped = is_stopped;
        } else {
            others += (others.empty() ? "" : ", ") + std::to_string(r.rank);
        }
    }
    if (!silent && timeouts_.whole_job && running > 0 && running == ranks.size() && waited_out == running) {
        // Nobody is working: every running rank has waited past --rank-timeout.
        const RankLiveness& r = *ranks[*longest_waiting];
        const std::string now_state = state(r.pid);
        return HangVerdict{HangKind::kHang, *longest_waiting,
                           "every running rank has waited for the others for more than --rank-timeout " +
                               seconds_text(from_seconds(timeouts_.rank_s)) + ", so none is working: rank " +
                               std::to_string(r.rank) + " has waited longest (" +
                               seconds_text(now - r.heard) + ")" +
                               (now_state.empty() ? "" : "; " + now_state)};
    }
    if (!silent) return std::nullopt;
    const RankLiveness& r = *ranks[*silent];
    const std::string doing = r.beat ? protocol::describe(*r.beat) : "starting (no heartbeat yet)";
    const std::string now_state = state(r.pid);
    const bool by_load =
        loading(r) && timeouts_.load_s > 0 && now >= r.heard + from_seconds(timeouts_.load_s);
    const std::string allowance = by_load ? "--load-timeout " + seconds_text(from_seconds(timeouts_.load_s))
                                          : "--rank-timeout " + seconds_text(from_seconds(timeouts_.rank_s));
    return HangVerdict{HangKind::kHang, *silent,
                       "rank " + std::to_string(r.rank) + " hung while " + doing + ": no heartbeat for " +
                           seconds_text(now - r.heard) + " (" + allowance + ")" +
                           (now_state.empty() ? "" : "; " + now_state) +
                           (others.empty() ? "" : "; also silent: rank(s) " + others)};
}

}  // namespace dp::launcher
