#pragma once
// A rank's stdout and stderr on their way to dp-launch's own: appended to its --log-dir files,
// split into lines, prefixed "[rank N] " and shown unless --local-ranks-filter hides the rank, with
// its last stderr lines kept for a failure report. On a terminal a rank's carriage-return updates
// (a progress bar) and its unfinished line are shown as they come, as the live line
// (launcher/terminal.h); whole lines go above the live line, so no two ranks' partial lines are
// ever mixed. Elsewhere whole lines only.

#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <string_view>

#include "launcher/line_splitter.h"
#include "launcher/unique_fd.h"

namespace dp::launcher {

// One pipe from a rank.
struct RankStream {
    UniqueFd pipe;  // read end; reset at EOF
    LineSplitter lines;
    int terminal_fd = 1;  // where its lines go: 1 or 2
    std::string update;   // on a terminal: the rank's last carriage-return update of this line
    UniqueFd log;         // --log-dir file, appended to
};

// Whether dp-launch's own stdout and stderr still take writes: after EPIPE one is closed for good.
// Shared by every rank's relay.
struct OutputSinks {
    bool stdout_open = true;
    bool stderr_open = true;
    bool& open(int fd) { return fd == 1 ? stdout_open : stderr_open; }
};

class RankOutput {
  public:
    static constexpr std::size_t kTailLines = 10;
    static constexpr std::size_t kTailLineBytes = 512;

    // `prefix`: put before each line shown ("" for none); `shown`: false hides the rank's lines
    // (they are still logged and kept for the failure report); `say` reports a --log-dir write
    // error in dp-launch's own words.
    void setup(std::string prefix, bool shown, OutputSinks* sinks,
               std::function<void(const std::string&)> say);

    RankStream out, err;

    // A new attempt of the rank: its pipes, and no line or update left from the one before.
    void restart(UniqueFd out_pipe, UniqueFd err_pipe);
    // `data` as read from `s` (out or err).
    void feed(RankStream& s, std::string_view data);
    // `s` reached its end: its unfinished line is shown and its pipe closed.
    void finish(RankStream& s);
    // From now on the rank's lines are logged and kept for the failure report, not shown (a live
    // carriage-return update of its own is erased).
    void hide();
    // Appends `data` to `s`'s log, if it has one; a failed write ends that log.
    void write_log(RankStream& s, std::string_view data);

    // The rank's last stderr lines (at most kTailLines, each cut at kTailLineBytes).
    const std::deque<std::string>& stderr_tail() const { return stderr_tail_; }

  private:
    void relay_pieces(RankStream& s, std::string_view data);
    void relay_line(RankStream& s, std::string_view piece);
    void add_line(RankStream& s, std::string_view line);
    void keep_tail(RankStream& s, std::string_view line);
    void flush(RankStream& s);

    std::string prefix_;
    bool shown_ = true;
    OutputSinks* sinks_ = nullptr;
    std::function<void(const std::string&)> say_;
    std::deque<std::string> stderr_tail_;
    std::string buffer_;  // whole lines of one read, written at once
};

}  // namespace dp::launcher
