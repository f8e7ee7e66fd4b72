#include "launcher/progress.h"

#include <unistd.h>

#include <cstdio>

#include "launcher/terminal.h"

namespace dp::launcher {

ProgressMode progress_mode(const std::string& setting, bool quiet, bool stderr_is_tty) {
    if (setting == "json") return ProgressMode::kJson;  // machine output: even under -q
    if (quiet || setting == "none") return ProgressMode::kNone;
    if (setting == "bar") return ProgressMode::kBar;
    if (setting == "lines") return ProgressMode::kLines;
    return stderr_is_tty ? ProgressMode::kBar : ProgressMode::kLines;
}

JobProgress::JobProgress(ProgressMode mode, int64_t to_run, int world_size)
    : mode_(mode), to_run_(to_run), world_size_(world_size), start_(std::chrono::steady_clock::now()) {}

double JobProgress::seconds_since(std::chrono::steady_clock::time_point t) const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

bool JobProgress::wants_heartbeat() {
    if (mode_ == ProgressMode::kJson) return true;
    if (mode_ == ProgressMode::kNone || seconds_since(last_parse_) < 0.25) return false;
    last_parse_ = std::chrono::steady_clock::now();
    return true;
}

void JobProgress::generating() {
    if (!generating_since_) generating_since_ = std::chrono::steady_clock::now();
}

void JobProgress::event(const char* name, nlohmann::json fields) {
    if (mode_ != ProgressMode::kJson) return;
    nlohmann::json e = {{"event", name}, {"t", seconds_since(start_)}};
    e.update(fields);
    Terminal::instance().write_own(STDOUT_FILENO,
                                   e.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

void JobProgress::heartbeat(const protocol::HeartbeatEvent& beat) {
    using protocol::RankPhase;
    if (beat.phase == RankPhase::kLoading) {
        if (loading_.insert(beat.rank).second) event("rank_loading", {{"rank", beat.rank}});
        return;
    }
    if (ready_.insert(beat.rank).second) {
        loading_.erase(beat.rank);
        event("rank_ready", {{"rank", beat.rank}, {"load_s", seconds_since(start_)}});
    }
    if (beat.phase != RankPhase::kGenerating || beat.index < 0) return;
    generating();
    if (beat.steps > 0) in_flight_[beat.index] = static_cast<double>(beat.step) / beat.steps;
    // One event per step of an image, whichever ranks of its replica report it.
    auto [last, fresh] = last_step_.emplace(beat.index, -1);
    if (beat.step <= last->second && !fresh) return;
    last->second = beat.step;
    if (beat.step > 0)
        event("step",
              {{"index", beat.index}, {"step", beat.step}, {"steps", beat.steps}, {"rank", beat.rank}});
}

void JobProgress::finished(int64_t index, int64_t finished) {
    if (!generating_since_) generating_since_ = start_;  // a worker that sends no step heartbeats
    in_flight_.erase(index);
    last_step_.erase(index);
    if (mode_ != ProgressMode::kJson) return;
    const double u = units(finished);
    const double since = generating_since_ ? seconds_since(*generating_since_) : 0;
    nlohmann::json eta = nullptr;
    if (u > 0 && since > 0) eta = (static_cast<double>(to_run_) - u) / (u / since);
    event("progress", {{"finished", finished}, {"images", to_run_}, {"eta_s", eta}});
}

double JobProgress::units(int64_t finished) const {
    double u = static_cast<double>(finished);
    for (const auto& [index, fraction] : in_flight_) u += fraction;
    return u;
}

std::string JobProgress::status_text(int64_t finished, bool bar) const {
    char text[200];
    if (!generating_since_) {
        // Loading: no rate, no ETA (a load is not a step).
        // Before a rank says it loads, the ranks start and agree on the job.
        std::snprintf(text, sizeof(text), "%s: %zu of %d rank(s) ready, %.0f s",
                      loading_.empty() && ready_.empty() ? "starting the ranks" : "loading the model",
                      ready_.size(), world_size_, seconds_since(start_));
        return text;
    }
    const double since = seconds_since(*generating_since_);
    const double u = units(finished);
    const double rate = since > 0 ? static_cast<double>(finished) / since : 0;
    char eta[48] = "-";
    if (u > 0 && since > 0)
        std::snprintf(eta, sizeof(eta), "%.0f s", (static_cast<double>(to_run_) - u) / (u / since));
    // The step of the one image in flight (one replica), when a heartbeat said it.
    std::string step;
    if (in_flight_.size() == 1)
        if (const auto it = last_step_.find(in_flight_.begin()->first);
            it != last_step_.end() && it->second > 0)
            step = " (step " + std::to_string(it->second) + ")";
    std::snprintf(text, sizeof(text),
                  bar ? "%lld/%lld%s  %.2f images/s  ETA %s" : "%lld/%lld images%s, %.2f images/s, ETA %s",
                  static_cast<long long>(finished), static_cast<long long>(to_run_), step.c_str(), rate, eta);
    return text;
}

void JobProgress::show(int64_t finished, bool last) {
    if (mode_ == ProgressMode::kNone || mode_ == ProgressMode::kJson) return;
    Terminal& terminal = Terminal::instance();
    if (mode_ == ProgressMode::kBar && terminal.is_tty(STDERR_FILENO)) {
        const int width = 30;
        const int filled = to_run_ > 0 ? static_cast<int>(width * finished / to_run_) : width;
        terminal.show(STDERR_FILENO, this,
                      "[" + std::string(static_cast<std::size_t>(filled), '#') +
                          std::string(static_cast<std::size_t>(width - filled), ' ') + "] " +
                          status_text(finished, true));
        if (last) terminal.end(this, /*keep=*/true);
        return;
    }
    if (!last && seconds_since(last_line_) < 5.0) return;
    if (last && !generating_since_) return;  // a job that ended while it loaded: its own lines say why
    // A line when something changed: an image, or the load's state.
    const int64_t state = generating_since_ ? finished : -2 - static_cast<int64_t>(ready_.size());
    if (state == printed_) return;
    printed_ = state;
    terminal.write_own(STDERR_FILENO, (generating_since_ ? "dp-launch: progress " : "dp-launch: ") +
                                          status_text(finished, false) + "\n");
    last_line_ = std::chrono::steady_clock::now();
}

}  // namespace dp::launcher
