#pragma once
// The main job's progress as a user or a CI script follows it (--progress): a bar redrawn in place
// on a terminal, a line every few seconds in a log, or one JSON object per event on stdout.
// The job first loads (the bar says how many ranks are ready), then generates: the rate and the
// ETA count from the first denoising step on, with the steps of the images in flight, so that the
// load time never inflates the estimate. No LibTorch.

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "protocol/status_events.h"

namespace dp::launcher {

enum class ProgressMode {
    kBar,    // redrawn in place on stderr (auto on a terminal)
    kLines,  // a line on stderr every 5 s (auto elsewhere)
    kJson,   // one JSON object per event on stdout (docs/launcher.md, "Progress")
    kNone,   // --quiet, or --progress none
};

// --progress's value (auto, bar, lines, json, none) with -q, for stderr being a terminal or not.
ProgressMode progress_mode(const std::string& setting, bool quiet, bool stderr_is_tty);

class JobProgress {
  public:
    JobProgress(ProgressMode mode, int64_t to_run, int world_size);

    ProgressMode mode() const { return mode_; }
    bool json() const { return mode_ == ProgressMode::kJson; }
    // Whether a heartbeat should be parsed and given to heartbeat() now: every one for JSON (each
    // step is an event), else at most a few a second, for the steps in flight.
    bool wants_heartbeat();
    // A rank's generating heartbeat was seen (without parsing it): generation has begun.
    void generating();

    // Events. `fields` are the event's own ("images", "index", "error", ...).
    void event(const char* name, nlohmann::json fields);
    void heartbeat(const protocol::HeartbeatEvent& beat);
    // Image `index` is finished (made or failed): `finished` of them so far.
    void finished(int64_t index, int64_t finished);
    void set_to_run(int64_t to_run) { to_run_ = to_run; }
    // Redraws the bar or prints a line when due; `last`: the final state.
    void show(int64_t finished, bool last);

  private:
    double seconds_since(std::chrono::steady_clock::time_point t) const;
    // The images done, with the fractions of those in flight.
    double units(int64_t finished) const;
    // "3/10 (step 5)  0.52 images/s  ETA 12 s" for the bar (`bar`), else with words for a log line.
    std::string status_text(int64_t finished, bool bar) const;

    ProgressMode mode_;
    int64_t to_run_;
    int world_size_;
    std::chrono::steady_clock::time_point start_, last_line_{}, last_parse_{};
    std::optional<std::chrono::steady_clock::time_point> generating_since_;
    std::set<int> ready_, loading_;        // ranks past loading; ranks loading
    std::map<int64_t, double> in_flight_;  // image -> fraction of its steps done
    std::map<int64_t, int> last_step_;     // image -> the last step an event said
    int64_t printed_ = -1;
};

}  // namespace dp::launcher
